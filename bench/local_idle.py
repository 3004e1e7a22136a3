"""Local observer idle CPU (issue 11, "Performance": <= 3 CPU-s per idle minute at 3,000 jobs).

What it measures: the CPU the local backend's ``discover`` costs the observer while nothing
happens. N jobs each have one ended object (``exit code 0``, as ``/bin/true`` leaves it);
then ``discover(expected=...)`` is called at the observer's poll interval for local clusters
(``poll_interval_s`` of a ``LocalCluster``, 1 s), with ``expected`` built as the observer
builds it (the objects it last saw alive: none, once the first poll showed every end), for
a window of ``--window`` seconds (default 60; a shorter window is scaled to a minute, and
the output says which window ran). CPU is this process's (``time.process_time``: every
thread, so the worker threads ``discover`` runs in are counted). The observer's NATS side
(comparing and publishing Discoveries) is not included.

The objects are written straight into the data directory with the backend's own file
formats (meta, runner, job, status and ceased files, as a runner that ran ``/bin/true``
leaves them): starting 3,000 real runners would measure launches, not idle polls. The first
``discover`` must show all N ended with cause ``none``, or the bench fails.

    python bench/local_idle.py [--jobs 3000] [--window 60] [--baseline-libs /work/main/libs]

``--baseline-libs`` also runs the same measure with another checkout's ``libs`` first on
``sys.path`` (e.g. the code before a change), and prints both side by side.

The last line is one JSON object: {"jobs", "window_s", "polls", "poll_interval_s",
"cpu_s_per_min", "first_poll_s", "target_cpu_s_per_min", "within_target"} (and
"baseline_cpu_s_per_min", "ratio" with ``--baseline-libs``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*

from bench.baseline import add_baseline_options, run_baseline

TARGET_CPU_S_PER_MIN = 3.0


def _local_internals() -> ModuleType:
    """The module holding the local backend's file formats and store: one namespace of
    ``dispatch_backends.local.files`` and ``.store``, or the flat ``dispatch_backends.local``
    of a checkout from before the package split (for ``--baseline-libs``)."""
    try:
        files = importlib.import_module("dispatch_backends.local.files")
        store = importlib.import_module("dispatch_backends.local.store")
    except ModuleNotFoundError:
        return importlib.import_module("dispatch_backends.local")
    merged = ModuleType("local_internals")
    merged.__dict__.update(vars(files))
    merged.__dict__["_Store"] = store._Store
    return merged


def make_ended_objects(data_dir: Path, jobs: int) -> None:
    """Write ``jobs`` ended objects (one per job) in the backend's own formats."""
    from dispatch_backends import local_runner as r

    loc = _local_internals()
    store = loc._Store(data_dir)
    store.ensure()
    now = datetime.now(UTC)
    dead = loc._Pid(pid=1 << 22, starttime=1, started_at=now)  # above pid_max: never alive
    for i in range(jobs):
        object_id, path = store.allocate()
        meta = loc._Meta(
            id=object_id,
            name=f"dj-bench-{i}",
            submission=1,
            attempt=1,
            command=("/bin/true",),
            env={},
            cwd=str(path),
            time_limit_s=None,
            kill_wait_s=10.0,
            node="local",
            created_at=now,
        )
        status = loc._Status(ended_at=now, started=True, reason=r.REASON_EXITED, exit_code=0)
        (path / r.META_FILE).write_bytes(loc._ENC.encode(meta))
        (path / r.RUNNER_FILE).write_bytes(loc._ENC.encode(dead))
        (path / r.JOB_FILE).write_bytes(loc._ENC.encode(dead))
        (path / r.STATUS_FILE).write_bytes(loc._ENC.encode(status))
        (path / r.CEASED_FILE).write_bytes(b"{}")
        store.mark(path, r.GATE_OPEN)


async def measure(data_dir: Path, jobs: int, window_s: float) -> dict[str, float | int]:
    """Poll ``discover`` at the observer's interval for ``window_s`` seconds."""
    from dispatch_backends.config import LocalCluster, poll_interval_s
    from dispatch_backends.local import LocalBackend
    from dispatch_core.state import ObjectPhase, ObjectRef

    interval = poll_interval_s(LocalCluster(name="bench", data_dir=str(data_dir)))
    backend = LocalBackend("bench", data_dir, zygote_idle_s=0.0)
    started = time.perf_counter()
    first = await backend.discover()
    first_poll_s = time.perf_counter() - started
    ended = [
        o
        for objs in first.objects.values()
        for o in objs
        if o.phase is ObjectPhase.ENDED and o.cause is not None and o.cause.exit_code == 0
    ]
    if len(ended) != jobs:
        raise SystemExit(f"first poll showed {len(ended)} ended objects, expected {jobs}")
    # The observer expects what it last saw alive: after the first poll, nothing.
    expected: tuple[ObjectRef, ...] = tuple(o.ref for o in ended if o.alive)
    polls = 0
    cpu0, wall0 = time.process_time(), time.monotonic()
    next_poll = wall0
    while True:
        await backend.discover(expected=expected)
        polls += 1
        next_poll += interval
        if next_poll - wall0 >= window_s:
            break
        await asyncio.sleep(max(0.0, next_poll - time.monotonic()))
    cpu = time.process_time() - cpu0
    elapsed = time.monotonic() - wall0
    return {
        "jobs": jobs,
        "window_s": round(window_s, 1),
        "polls": polls,
        "poll_interval_s": interval,
        "cpu_s_per_min": round(cpu * 60.0 / max(elapsed, interval), 3),
        "first_poll_s": round(first_poll_s, 3),
    }


def run(jobs: int, window_s: float) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory(prefix="bench-local-idle-") as tmp:
        data_dir = Path(tmp) / "data"
        make_ended_objects(data_dir, jobs)
        return asyncio.run(measure(data_dir, jobs, window_s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of idle polls")
    add_baseline_options(parser)
    args = parser.parse_args()
    if args.raw:  # one measure, for a --baseline-libs run
        print(json.dumps(run(args.jobs, args.window)))
        return
    baseline: dict[str, float | int] | None = None
    if args.baseline_libs is not None:
        window = ("--window", str(args.window))
        baseline = run_baseline(__file__, args.baseline_libs, ("--jobs", str(args.jobs), *window))
        print(
            f"baseline ({args.baseline_libs}): {baseline['cpu_s_per_min']} CPU-s per idle "
            f"minute, first poll {baseline['first_poll_s']} s"
        )
    result: dict[str, float | int | bool] = dict(run(args.jobs, args.window))
    cpu = float(result["cpu_s_per_min"])
    print(
        f"{args.jobs} ended jobs, {result['polls']} polls every {result['poll_interval_s']} s "
        f"over {result['window_s']} s (scaled to a minute): {cpu} CPU-s per idle minute "
        f"(target <= {TARGET_CPU_S_PER_MIN}), first poll {result['first_poll_s']} s"
    )
    result["target_cpu_s_per_min"] = TARGET_CPU_S_PER_MIN
    result["within_target"] = cpu <= TARGET_CPU_S_PER_MIN
    if baseline is not None:
        result["baseline_cpu_s_per_min"] = baseline["cpu_s_per_min"]
        result["ratio"] = round(float(baseline["cpu_s_per_min"]) / max(cpu, 1e-9), 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Local backend launch throughput (issue 11 item 6: "launches don't serialise on one
data-directory lock and one zygote socket").

``--launches`` (default 200) distinct launches are started at once on one
:class:`~dispatch_backends.local.LocalBackend` (as the supervisor starts a mass preemption's
replacements: concurrently, each ``start`` in a worker thread), gates closed, runners forked
by the data directory's zygote (warmed first by one launch, not counted). Printed: starts per
second (wall) and this process's CPU per start. Every object is then SIGKILLed.

    python bench/local_starts.py [--launches 200] [--repeats 3] [--baseline-libs DIR]

``--baseline-libs`` also runs the same measure with another checkout's ``libs`` first on
``sys.path`` (e.g. the code before a change), and prints both side by side.

The last line is one JSON object: {"launches", "starts_per_s", "cpu_ms_per_start"} (and
"baseline_starts_per_s", "ratio" with ``--baseline-libs``); the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*, tests.contract

from bench.baseline import add_baseline_options, run_baseline


async def measure(data_dir: Path, launches: int) -> tuple[float, float]:
    """Return (starts per second, CPU ms per start) of ``launches`` concurrent starts."""
    from dispatch_backends.local import LocalBackend, kill_all
    from dispatch_core.state import JobSpec
    from tests.contract.backend_contract import make_launch

    backend = LocalBackend("bench", data_dir, zygote_idle_s=60.0)
    spec = JobSpec(cluster="bench", command=("/bin/true",))
    try:
        await backend.start(make_launch("bench-warm", spec))  # starts the zygote
        await asyncio.sleep(1.0)  # the zygote is up (a direct start started it)
        await backend.start(make_launch("bench-warm2", spec))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        refs = await asyncio.gather(
            *(backend.start(make_launch(f"bench-{i}", spec)) for i in range(launches))
        )
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        assert len(set(refs)) == launches, "two launches got one object"
    finally:
        await asyncio.to_thread(kill_all, data_dir)
    return launches / wall, cpu * 1000.0 / launches


def run(launches: int, repeats: int) -> dict[str, float | int]:
    best = (0.0, 0.0)
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-local-starts-") as tmp:
            rate, cpu = asyncio.run(measure(Path(tmp) / "data", launches))
        best = max(best, (rate, cpu))
    return {
        "launches": launches,
        "starts_per_s": round(best[0], 1),
        "cpu_ms_per_start": round(best[1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    add_baseline_options(parser)
    args = parser.parse_args()
    if args.raw:
        print(json.dumps(run(args.launches, args.repeats)))
        return
    baseline: dict[str, float | int] | None = None
    if args.baseline_libs is not None:
        sizes = ("--launches", str(args.launches), "--repeats", str(args.repeats))
        baseline = run_baseline(__file__, args.baseline_libs, sizes)
        print(
            f"baseline ({args.baseline_libs}): {baseline['starts_per_s']} starts/s, "
            f"{baseline['cpu_ms_per_start']} ms CPU per start"
        )
    result: dict[str, float | int] = dict(run(args.launches, args.repeats))
    print(
        f"{args.launches} concurrent launches: {result['starts_per_s']} starts/s, "
        f"{result['cpu_ms_per_start']} ms CPU per start (this process)"
    )
    if baseline is not None:
        result["baseline_starts_per_s"] = baseline["starts_per_s"]
        result["ratio"] = round(float(result["starts_per_s"]) / float(baseline["starts_per_s"]), 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Recovery on the Slurm test cluster: dispatch's resubmission beside Slurm's own requeue.

Two identical jobs (``sleep 600``, one whole node: ``--exclusive``), each preempted by a
``high`` job that needs its node, one at a time on an otherwise idle cluster:

* **dispatch**: submitted through dispatch (observer and supervisor in-process on a private
  nats-server, the Slurm backend, a ``resubmit`` rule on ``preempted``) in partition
  ``lowcancel`` (PreemptMode=CANCEL): Slurm ends it ``PREEMPTED``, dispatch sees the end at
  its next poll, submits the replacement (``sbatch --hold``), sees it at the next poll and
  releases it.
* **Slurm's requeue**: the same job submitted ``--requeue`` in partition ``low``
  (PreemptMode=REQUEUE): Slurm requeues it itself; the rerun is eligible
  ``cred_expire + 1`` s later (11 s on the test cluster, 121 s with Slurm's default).

The recovery time of each is from the preempted run's end to the next run's start, both as
slurmctld records them (sacct's ``End`` of the preempted run, ``Start`` of the next one: 1 s
resolution, one clock). The ratio is dispatch/Slurm (target <= 1.0).

The number of scheduler commands per poll (``Snapshot.calls``) is measured with 10 and with
500 of dispatch's jobs on the cluster (held jobs submitted through the backend, cancelled
afterwards; target: equal).

    python bench/slurm_recovery.py [--rounds 3] [--poll-interval 1.0] [--jobs 500]

Needs the Slurm test cluster (``scripts/slurm-cluster.sh start``, as root). The last line is
one JSON object: ``{"dispatch_s", "slurm_requeue_s", "ratio", "calls_per_poll_10",
"calls_per_poll_500"}`` (medians over the rounds), plus ``poll_interval_s`` and ``rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*

from dispatch_backends.config import DEFAULT_POLL_INTERVAL_S
from dispatch_backends.slurm import SlurmBackend, SlurmSettings
from dispatch_backends.slurm.parse import parse_slurm_time
from dispatch_core import (
    Action,
    Actor,
    ActorKind,
    Cancel,
    CauseKind,
    JobSpec,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
)
from tests.contract.backend_contract import make_launch
from tests.e2e.slurm.harness import CLUSTER, SlurmRuntime
from tests.servers.nats import NatsServer

POLICY = RecoveryPolicy(
    rules=(RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=100),)
)


def _slurm(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


def _sbatch(*args: str) -> str:
    return _slurm("sbatch", "--parsable", "--output=/dev/null", *args).strip().split(";")[0]


def _node_of(job: str) -> str:
    def running() -> str:
        out = _slurm("squeue", "-h", "-j", job, "-o", "%T|%N").strip()
        state, _, node = out.partition("|")
        assert state == "RUNNING", out
        assert node, out
        return node

    node: str = _eventually(running, 120)
    return node


def _eventually(check, timeout_s: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _runs(job: str) -> list[tuple[str, datetime | None, datetime | None]]:
    """(State, Start, End) of each run of ``job``, from sacct --duplicates."""
    out = _slurm("sacct", "-n", "-P", "-X", "--duplicates", "-j", job, "-o", "State,Start,End")
    rows = []
    for line in out.splitlines():
        state, start, end = line.split("|")
        rows.append((state, parse_slurm_time(start), parse_slurm_time(end)))
    return rows


def _ended_then_started(
    ended_job: str, ended_run: int, started_job: str, started_run: int
) -> float:
    """Seconds from a run's End to another run's Start, as slurmctld recorded them."""

    def recorded() -> float:
        ended = _runs(ended_job)
        started = _runs(started_job)
        assert len(ended) > ended_run, ended
        assert len(started) > started_run, started
        end, start = ended[ended_run][2], started[started_run][1]
        assert ended[ended_run][0] not in ("RUNNING", "PENDING"), ended
        assert end is not None, ended
        assert start is not None, started
        assert started[started_run][0] != "PENDING", started
        return (start - end).total_seconds()

    return float(_eventually(recorded, 120))


async def _dispatch_round(rt: SlurmRuntime, tag: str) -> float:
    job_id = f"bench-{tag}"
    spec = JobSpec(
        cluster=CLUSTER,
        command=("/bin/sh", "-c", "exec sleep 600"),
        options={"partition": "lowcancel", "exclusive": ""},
    )
    await rt.submit(job_id, spec, POLICY)

    def running(submission: int):  # type: ignore[no-untyped-def]
        def check(status: Status) -> None:
            assert status.state is State.RUNNING, status
            assert status.submission == submission, status

        return check

    await rt.wait_status(job_id, running(1), timeout_s=120)
    first = (await rt.job(job_id)).objects[0].ref.id
    node = await asyncio.to_thread(_node_of, first)
    preemptor = await asyncio.to_thread(
        _sbatch, "-p", "high", "-w", node, "--exclusive", "--wrap", "sleep 30"
    )
    try:
        await rt.wait_status(job_id, running(2), timeout_s=120)
        second = next(o.ref.id for o in (await rt.job(job_id)).objects if o.submission == 2)
        seconds = await asyncio.to_thread(_ended_then_started, first, 0, second, 0)
    finally:
        await asyncio.to_thread(subprocess.run, ["scancel", preemptor], check=False)
        await rt.command(job_id, _cancel(job_id))
    return seconds


def _cancel(job_id: str) -> Cancel:
    del job_id
    return Cancel(by=Actor(name="bench", kind=ActorKind.HUMAN), reason="bench done")


def _slurm_round() -> float:
    job = _sbatch("-p", "low", "--requeue", "--exclusive", "--wrap", "exec sleep 600")
    node = _node_of(job)
    preemptor = _sbatch("-p", "high", "-w", node, "--exclusive", "--wrap", "sleep 30")
    try:

        def rerun() -> None:
            runs = _runs(job)
            assert len(runs) >= 2, runs
            assert runs[1][0] == "RUNNING", runs

        _eventually(rerun, 120)
        return _ended_then_started(job, 0, job, 1)
    finally:
        subprocess.run(["scancel", job, preemptor], check=False)


async def _calls_per_poll(backend: SlurmBackend, count: int, made: list[str]) -> tuple[int, float]:
    """Hold ``count`` of dispatch's jobs on the cluster; one discover's calls and seconds."""
    spec = JobSpec(cluster=CLUSTER, command=("true",))
    tag = secrets.token_hex(3)
    while len(made) < count:
        batch = [
            make_launch(f"bench-calls-{tag}-{i}", spec)
            for i in range(len(made), min(count, len(made) + 16))
        ]
        refs = await asyncio.gather(*(backend.start(launch) for launch in batch))
        made.extend(ref.id for ref in refs)

    began = time.monotonic()
    snapshot = await backend.discover()
    took = time.monotonic() - began
    shown = sum(1 for job in snapshot.objects if job.startswith("bench-calls-"))
    assert shown >= count, f"{shown} of {count} jobs shown"
    return snapshot.calls, took


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL_S["slurm"],
        help="the observer's poll interval, seconds (default: the Slurm default)",
    )
    parser.add_argument("--jobs", type=int, default=500)
    args = parser.parse_args(argv)

    dispatch_s: list[float] = []
    slurm_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        rt = SlurmRuntime(server.url, Path(tmp) / "rt", poll_interval_s=args.poll_interval)
        await rt.open()
        try:
            await rt.observer()
            await rt.supervisor()
            for i in range(args.rounds):
                tag = f"{secrets.token_hex(3)}-{i}"
                dispatch_s.append(await _dispatch_round(rt, tag))
                slurm_s.append(await asyncio.to_thread(_slurm_round))
                print(
                    f"round {i + 1}: dispatch {dispatch_s[-1]:.0f} s, "
                    f"Slurm's requeue {slurm_s[-1]:.0f} s",
                    flush=True,
                )
        finally:
            await rt.close()
            server.stop()

    backend = SlurmBackend(CLUSTER, SlurmSettings())
    made: list[str] = []
    try:
        calls_10, took_10 = await _calls_per_poll(backend, 10, made)
        calls_n, took_n = await _calls_per_poll(backend, args.jobs, made)
    finally:
        for start in range(0, len(made), 200):
            await asyncio.to_thread(
                subprocess.run, ["scancel", *made[start : start + 200]], check=False
            )

    d, s = statistics.median(dispatch_s), statistics.median(slurm_s)
    print(
        f"recovery (preempted run's end -> next run's start, slurmctld's times, median of "
        f"{args.rounds}): dispatch {d:.1f} s (poll interval {args.poll_interval:g} s), "
        f"Slurm's own requeue {s:.1f} s, ratio {d / s:.2f}"
    )
    print(
        f"scheduler commands per poll: {calls_10} with 10 jobs ({took_10:.2f} s), "
        f"{calls_n} with {args.jobs} jobs ({took_n:.2f} s)"
    )
    print(
        json.dumps(
            {
                "dispatch_s": d,
                "slurm_requeue_s": s,
                "ratio": round(d / s, 3),
                "calls_per_poll_10": calls_10,
                f"calls_per_poll_{args.jobs}": calls_n,
                "poll_interval_s": args.poll_interval,
                "rounds": args.rounds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

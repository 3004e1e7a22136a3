"""Recovery latency on the local backend: from an object ending to its replacement started.

One job (resubmit on preempted, a budget for every run) is preempted once each of its
executions has started, at a random phase of the observer's polls. The latency of a run is
from the old object's end (its runner's ``status.json``) to the replacement's process start
(its runner's ``job.json``), both written by the local backend on this machine's clock. In
between: the observer's next poll sees the end, a supervisor pass records it, commits the
recovery and the launch intent and starts the replacement with its gate closed; the
observer's next poll shows it pending; a pass opens its gate. So a recovery takes between
one and two poll intervals (1.5 on average), plus the passes' own time.

The observer and the supervisor run as processes (``python -m services.*``) against a
private nats-server, as deployed.

    python bench/recovery.py [--runs 20] [--poll-interval 1.0] [--seed 1]

The last line is one JSON object: {"p50_s", "p99_s", "poll_interval_s", "runs"} plus
"p50_over_poll" (the median in poll intervals, measured in the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*

from dispatch_core import Action, CauseKind, ObjectRef, RecoveryPolicy, RecoveryRule
from tests.e2e.runtime.harness import Runtime, shell
from tests.servers.nats import NatsServer
from tests.util import assert_eventually

JOB = "bench-recovery"


async def _object(rt: Runtime, submission: int) -> ObjectRef:
    """Wait until the record holds the object of ``submission``."""

    async def probe() -> ObjectRef:
        job = await rt.job(JOB)
        for obj in job.objects:
            if obj.submission == submission and not obj.duplicate:
                return obj.ref
        raise AssertionError(f"no object of submission {submission} yet")

    return await assert_eventually(probe, timeout_s=120, interval_s=0.02)


async def _runner_time(rt: Runtime, ref: ObjectRef, name: str, key: str) -> datetime:
    """Wait for the runner's ``name`` file of ``ref``; return its time field ``key``."""
    path = rt.backend.object_dir(ref) / name

    async def probe() -> datetime:
        try:
            raw = msgspec.json.decode(await asyncio.to_thread(path.read_bytes))
        except (FileNotFoundError, msgspec.DecodeError):
            raise AssertionError(f"{path} not written yet") from None
        return datetime.fromisoformat(raw[key])

    return await assert_eventually(probe, timeout_s=120, interval_s=0.02)


async def run(args: argparse.Namespace) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        server = NatsServer(Path(tmp) / "store")
        server.start()
        rt = Runtime(server.url, Path(tmp) / "rt", poll_interval_s=args.poll_interval)
        try:
            await rt.open()
            await rt.observer_process(log_level="warning")
            await rt.supervisor_process(log_level="warning")
            policy = RecoveryPolicy(
                rules=(
                    RecoveryRule(
                        on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=args.runs
                    ),
                )
            )
            await rt.submit(JOB, rt.spec(shell("exec sleep 3600")), policy)
            latencies: list[float] = []
            ref = await _object(rt, 1)
            rng = random.Random(args.seed)
            for n in range(1, args.runs + 1):
                await _runner_time(rt, ref, "job.json", "started_at")
                # At a random phase of the observer's polls, as a real preemption comes.
                await asyncio.sleep(rng.uniform(0, args.poll_interval))
                await rt.preempt(ref)
                ended = await _runner_time(rt, ref, "status.json", "ended_at")
                ref = await _object(rt, n + 1)
                started = await _runner_time(rt, ref, "job.json", "started_at")
                latencies.append((started - ended).total_seconds())
                print(f"run {n}: {latencies[-1]:.3f} s", file=sys.stderr)
        finally:
            await rt.close()
            server.stop()
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    p50 = statistics.median(latencies)
    return {
        "p50_s": round(p50, 3),
        "p99_s": round(cuts[98], 3),
        "poll_interval_s": args.poll_interval,
        "runs": len(latencies),
        "p50_over_poll": round(p50 / args.poll_interval, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()

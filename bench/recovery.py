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
private nats-server, as deployed: locked, each service connecting as its own NATS identity
(``--no-auth``: anonymous).

With ``--cluster`` the same runs are measured again on a 3-server JetStream cluster it
starts (streams at replicas 3, every service given the three URLs), in the same run, and
both engines' figures are printed side by side.

    python bench/recovery.py [--runs 20] [--poll-interval 1.0] [--seed 1] [--cluster] [--no-auth]

The last line is one JSON object: {"p50_s", "p99_s", "poll_interval_s", "runs"} plus
"p50_over_poll" (the median in poll intervals, measured in the same run), for one server;
with ``--cluster`` also "cluster" (the same figures on the cluster) and
"cluster_over_server" (the cluster's p50 over the one server's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*

from bench.engines import EngineKind, nats_engine, on_engines
from dispatch_core import Action, CauseKind, ObjectRef, RecoveryPolicy, RecoveryRule
from dispatch_nats import Layout
from tests.e2e.cluster.harness import ClusterRuntime
from tests.e2e.runtime.harness import Runtime, shell
from tests.servers.locked_nats import LockedNats
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


async def run(args: argparse.Namespace) -> dict[str, object]:
    shown = ("p50_s", "p99_s", "p50_over_poll")
    return await on_engines(args, run_on, shown=shown, spec=".3f", ratio_of="p50_s", out=sys.stderr)


@contextlib.contextmanager
def _engine(
    kind: EngineKind, tmp: Path, auth: bool
) -> Iterator[tuple[str, int, LockedNats | None]]:
    """Start the engine: (its URLs as a comma list, the streams' replicas, the locked site).

    With ``auth`` the servers' configs are rendered by ``dispatch_nats.permissions`` (as
    ``dispatch up`` and ``deploy/nats`` write them; a cluster block on the cluster): the
    observer and the supervisor connect as their own identities, the bench's submission goes
    out as the ``api`` identity, its reads as an all-permissions harness user.
    """
    if not auth:
        with nats_engine(kind, tmp) as engine:
            yield engine.url, engine.replicas, None
        return
    size = 3 if kind == "cluster" else 1
    site = LockedNats(tmp / "site", layout=Layout(namespace="bench"), size=size, harness=True)
    site.start()
    try:
        yield site.url, size, site
    finally:
        site.stop()


async def run_on(kind: EngineKind, args: argparse.Namespace) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp,
        _engine(kind, Path(tmp), args.auth) as (url, replicas_n, site),
    ):
        servers = len(url.split(","))
        auth = "on (each service its own identity)" if site is not None else "off"
        print(
            f"-- {kind} ({servers} server(s), replicas {replicas_n}, authorization {auth})",
            file=sys.stderr,
        )
        rt = ClusterRuntime(
            url,
            Path(tmp) / "rt",
            replicas=replicas_n,
            site=site,
            poll_interval_s=args.poll_interval,
        )
        try:
            await rt.open()
            replicas = str(replicas_n)
            await rt.observer_process(log_level="warning", stream_replicas=replicas)
            await rt.supervisor_process(log_level="warning", stream_replicas=replicas)
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
    parser.add_argument(
        "--no-auth",
        dest="auth",
        action="store_false",
        help="anonymous servers (default: locked, each service its own identity)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also measure on a 3-server JetStream cluster (R3 streams) and compare",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()

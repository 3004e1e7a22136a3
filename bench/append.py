"""Record appends (expected seq + msg id, many in flight) vs pipelined raw JetStream publishes.

A busy supervisor appends to many jobs at once, each job's appends one after another (the
next expected seq is the previous append's). This runs that shape through
`RecordStore.append` on `--jobs` job records, and the same number of messages with the same
bytes to the same subjects as raw `js.publish_async` (no headers, pipelined), in interleaved
rounds against one private nats-server it starts, and prints both rates and their ratio.
With ``--cluster`` it measures the same again on a 3-server JetStream cluster it starts
(streams at replicas 3), in the same run, and prints both engines' figures side by side.

    python bench/append.py [--jobs 1000] [--events-per-job 10] [--rounds 3] [--in-flight 1000]
                           [--cluster] [--no-auth]

The servers are locked as `dispatch up` locks them (issue 10): both modes publish as the
`supervisor` identity (an nkey user with its generated permissions, for both namespaces), so
the figures include authorization, on one server and on the cluster (whose servers' configs
come from the same renderer, with a cluster block); `--no-auth` measures anonymous servers.

The last line is one JSON object: {"append_per_s", "raw_per_s", "ratio"} (one server; target
ratio >= 0.5), and with ``--cluster`` also "cluster" (the same three figures on the cluster)
and "cluster_over_server" (the cluster's append rate over the one server's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.servers

from bench.engines import Engine, EngineKind, nats_engine, on_engines
from dispatch_core import WriterKind
from dispatch_nats import Layout, RecordStore
from dispatch_nats.identities import make_identities, seed_path
from dispatch_nats.permissions import (
    Identity,
    Permissions,
    Role,
    User,
    inbox_prefix,
    permissions,
)
from services.common.lifecycle import ensure_streams_until

LAYOUTS = (Layout(namespace="bench-a"), Layout(namespace="bench-r"))
"""The appends' and the raw publishes' namespaces."""


async def append_round(
    store: RecordStore,
    jobs: list[str],
    last: dict[str, int],
    events: int,
    in_flight: int,
    payload: bytes,
    round_no: int,
) -> float:
    """Append `events` events to each job, at most `in_flight` appends waiting; seconds taken."""
    slots = asyncio.Semaphore(in_flight)

    async def job_events(job: str) -> None:
        for k in range(events):
            async with slots:
                last[job] = await store.append(
                    job,
                    payload,
                    expected_last_seq=last[job],
                    msg_id=f"{job}:{round_no}:{k}",
                )

    t0 = time.perf_counter()
    await asyncio.gather(*(job_events(j) for j in jobs))
    return time.perf_counter() - t0


async def raw_round(nc: NATS, subjects: list[str], events: int, payload: bytes) -> float:
    """Publish `events` messages to each subject with `publish_async`; seconds until all acked."""
    js = nc.jetstream()
    t0 = time.perf_counter()
    futures = []
    for _ in range(events):
        for subject in subjects:
            futures.append(await js.publish_async(subject, payload))
    # Bounded: publish_async's future never resolves on a server error (nats.py#985).
    await asyncio.wait_for(asyncio.gather(*futures), 120)
    return time.perf_counter() - t0


def _locked_users(tmp: Path, layouts: list[Layout]) -> tuple[list[User], Path]:
    """The one user a locked engine admits: the supervisor identity, with its permissions
    under each of ``layouts``; return it and the identity's seed file."""
    ident = Identity(Role.SUPERVISOR)
    keys = make_identities(tmp / "identities", [ident])
    perms = [permissions(layout, ident) for layout in layouts]
    union = Permissions(
        publish=tuple(dict.fromkeys(s for p in perms for s in p.publish)),
        subscribe=tuple(dict.fromkeys(s for p in perms for s in p.subscribe)),
        deny_publish=tuple(dict.fromkeys(s for p in perms for s in p.deny_publish)),
    )
    return [User(identity=ident, nkey=keys[ident], permissions=union)], seed_path(
        tmp / "identities", ident
    )


async def run(args: argparse.Namespace) -> dict[str, object]:
    shown = ("append_per_s", "raw_per_s", "ratio")
    return await on_engines(
        args, run_on, shown=shown, spec=",.2f", ratio_of="append_per_s", out=sys.stdout
    )


async def run_on(kind: EngineKind, args: argparse.Namespace) -> dict[str, float]:
    payload = b"x" * args.payload
    with tempfile.TemporaryDirectory(prefix="bench-append-") as tmp:
        options: dict[str, Any] = {}
        users = None
        if args.auth:
            users, seed = _locked_users(Path(tmp), list(LAYOUTS))
            ident = Identity(Role.SUPERVISOR)
            options = {"nkeys_seed": str(seed), "inbox_prefix": inbox_prefix(ident, LAYOUTS[0])}
        with nats_engine(kind, Path(tmp), users=users) as engine:
            auth = "on (supervisor identity)" if args.auth else "off (anonymous)"
            print(
                f"-- {kind} ({len(engine.urls)} server(s), replicas {engine.replicas}, "
                f"authorization {auth})"
            )
            nc = await nats.connect(engine.urls, **options)
            try:
                return await measure(nc, engine, args, payload)
            finally:
                await nc.close()


async def measure(
    nc: NATS, engine: Engine, args: argparse.Namespace, payload: bytes
) -> dict[str, float]:
    # Two identical record streams (the contract's config) so both modes write into a
    # stream of the same size; the subjects differ only by the namespace prefix.
    append_layout, raw_layout = LAYOUTS
    for layout in (append_layout, raw_layout):
        # As the services do: a cluster just started may still be settling its leaders.
        await ensure_streams_until(nc, asyncio.Event(), engine.replicas, layout=layout)
    store = RecordStore(
        nc,
        writer=WriterKind.SUPERVISOR,
        layout=append_layout,
        max_in_flight=max(args.in_flight, 1),
    )
    jobs = [f"job-{i}" for i in range(args.jobs)]
    raw_subjects = [raw_layout.record_subject(j, WriterKind.SUPERVISOR) for j in jobs]
    last = dict.fromkeys(jobs, 0)
    n = args.jobs * args.events_per_job

    # Warm-up (connections, subscriptions, stream files), not counted.
    await raw_round(nc, raw_subjects[:100], 1, payload)
    await append_round(store, jobs[:100], last, 1, args.in_flight, payload, -1)

    append_s = raw_s = 0.0
    for r in range(args.rounds):
        raw_t = await raw_round(nc, raw_subjects, args.events_per_job, payload)
        append_t = await append_round(
            store, jobs, last, args.events_per_job, args.in_flight, payload, r
        )
        raw_s += raw_t
        append_s += append_t
        print(
            f"round {r + 1}: append {n / append_t:,.0f}/s, raw {n / raw_t:,.0f}/s, "
            f"ratio {raw_t / append_t:.2f}",
            flush=True,
        )

    counts = await store.job_event_counts()
    warm = set(jobs[:100])
    wrong = [j for j in jobs if counts.get(j) != args.rounds * args.events_per_job + (j in warm)]
    if wrong:
        raise RuntimeError(f"records with a wrong number of events: {wrong[:10]}")
    await store.aclose()

    append_per_s = n * args.rounds / append_s
    raw_per_s = n * args.rounds / raw_s
    print(
        f"append (expected seq + msg id, {args.in_flight} in flight, {args.jobs} jobs): "
        f"{append_per_s:,.0f}/s"
    )
    print(f"raw js.publish_async (no headers, pipelined): {raw_per_s:,.0f}/s")
    print(f"ratio append/raw: {append_per_s / raw_per_s:.2f} (target >= 0.5)")
    print(f"authorization: {'on (supervisor identity)' if args.auth else 'off (anonymous)'}")
    return {
        "append_per_s": round(append_per_s, 1),
        "raw_per_s": round(raw_per_s, 1),
        "ratio": round(append_per_s / raw_per_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=1000, help="job records (default 1000)")
    parser.add_argument("--events-per-job", type=int, default=10, help="per job and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per mode")
    parser.add_argument("--in-flight", type=int, default=1000, help="appends waiting at once")
    parser.add_argument("--payload", type=int, default=200, help="bytes per message")
    parser.add_argument(
        "--no-auth",
        dest="auth",
        action="store_false",
        help="an anonymous server (default: locked, publishing as the supervisor identity)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also measure on a 3-server JetStream cluster (R3 streams) and compare",
    )
    result = asyncio.run(run(parser.parse_args()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

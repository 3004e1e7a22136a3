"""A supervisor pass's Status published without an ack and confirmed by its echo on the
status watch (``PassExecutor(status_echo_s=...)``, issue 11), on a real nats-server, across
a server restart (the watch re-created by the client, a publish sent while the server is
down)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from dispatch_core import (
    Actor,
    ActorKind,
    Discovery,
    GateState,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    RecoveryPolicy,
    Status,
    Submit,
    WriterKind,
    decide,
    decode,
    encode,
)
from dispatch_nats import LatestStore, RecordStore, StreamKind, ensure_streams
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassExecutor
from tests.integration.nats.support import Eventually, connect
from tests.servers.nats import NatsServer
from tests.unit.supervisor.fakes import FakeBackend

pytestmark = pytest.mark.integration

JOB = "echo-1"
CLUSTER = "fake"
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)


async def test_a_pass_status_confirmed_by_its_echo_across_a_server_restart(
    private_nats_server: NatsServer, eventually: Eventually
) -> None:
    server = private_nats_server
    nc = await connect(server.url)
    await ensure_streams(nc)
    records = RecordStore(nc, writer=WriterKind.SUPERVISOR, check_reads=True, ack_timeout_s=1.0)
    api = RecordStore(nc, writer=WriterKind.API)
    discoveries = LatestStore(nc, StreamKind.DISCOVERY, ack_timeout_s=1.0, read_timeout_s=1.0)
    statuses = LatestStore(nc, StreamKind.STATUS, ack_timeout_s=1.0, read_timeout_s=1.0)
    backend = FakeBackend(CLUSTER)
    ex = PassExecutor(
        records=records,
        discoveries=discoveries,
        statuses=statuses,
        backends={CLUSTER: backend},
        metrics=SupervisorMetrics(CollectorRegistry()),
        status_echo_s=2.0,
        store_retry_s=10.0,
    )
    acked_puts = 0
    put = statuses.put

    async def counted_put(*args: object, **kw: object) -> int:
        nonlocal acked_puts
        acked_puts += 1
        return await put(*args, **kw)  # type: ignore[arg-type]

    statuses.put = counted_put  # type: ignore[method-assign]

    async def watch() -> None:
        async with statuses.watch(()) as feed:
            async for entry in feed:
                ex.note_status(entry.key[-1], entry)

    watcher = asyncio.create_task(watch())
    try:
        seq = 0
        for event in decide(
            None,
            Submit(
                by=ALICE,
                job_id=JOB,
                spec=JobSpec(cluster=CLUSTER, command=("train",)),
                policy=RecoveryPolicy(),
                declarations=backend.declarations(),
            ),
            datetime.now(UTC),
        ):
            seq = await api.append(JOB, encode(event), expected_last_seq=seq, msg_id=f"c{seq}")

        async def first() -> None:
            # Until the watch follows, the echo is missed and the put sent acked.
            acked = acked_puts
            outcome = await ex.run_pass(JOB)
            assert outcome.status is not None
            assert acked_puts == acked
            await _current(statuses, records)

        # The first pass launches; a Status of the same record later (the watch following
        # by then) is the echo's.
        await ex.run_pass(JOB)
        await _current(statuses, records)
        assert len(backend.started) == 1
        ref = ObjectRef(cluster=CLUSTER, id="1")
        await discoveries.put((CLUSTER, JOB), encode(_seen(ref, ObjectPhase.PENDING)))
        await eventually(first, timeout_s=30)
        assert backend.opened == [ref]

        await asyncio.to_thread(server.restart)
        # Published while the client reconnects and the watch is re-created: confirmed by
        # the echo, or by the acked put after ``status_echo_s``; never left stale.

        async def seen_running() -> None:
            await discoveries.put((CLUSTER, JOB), encode(_seen(ref, ObjectPhase.RUNNING)))

        await eventually(seen_running, timeout_s=30)

        async def running() -> None:
            outcome = await ex.run_pass(JOB)
            assert outcome.status is not None
            assert outcome.status.state.value == "running"
            await _current(statuses, records)

        await eventually(running, timeout_s=60)
    finally:
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await watcher
        for store in (records, api, discoveries, statuses):
            await store.aclose()
        await nc.close()


def _seen(ref: ObjectRef, phase: ObjectPhase) -> Discovery:
    return Discovery(
        cluster=CLUSTER,
        job_id=JOB,
        seen_at=datetime.now(UTC),
        objects=(
            ObservedObject(
                ref=ref,
                name=f"dj-{JOB}",
                submission=1,
                attempt=1,
                phase=phase,
                gate=GateState.CLOSED if phase is ObjectPhase.PENDING else GateState.OPEN,
            ),
        ),
    )


async def _current(statuses: LatestStore, records: RecordStore) -> None:
    """The job's Status on the stream is of its record's last seq."""
    entry = await statuses.get((JOB,))
    assert entry is not None
    assert decode(entry.payload, Status).seq == await records.leader_last_seq(JOB)

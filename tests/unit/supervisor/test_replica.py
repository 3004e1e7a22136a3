"""The replica loop with FAKE deliveries and feeds (no NATS: the client is never
connected): what each consumer hands the scheduler, Discovery values kept for the pass, and
a settled Status emptying the per-job caches."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_core import Cancel, decide
from dispatch_nats import DEFAULT_LAYOUT, StoreUnavailable
from services.supervisor.config import SupervisorConfig
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassExecutor, PassOutcome
from services.supervisor.replica import Replica
from tests.unit.supervisor.deliveries import FakeDelivery, FakeFeed, RecordingScheduler
from tests.unit.supervisor.test_passes import ALICE, CLUSTER, Installation
from tests.unit.supervisor.test_scheduling import until

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _replica() -> tuple[Replica, RecordingScheduler]:
    replica = Replica(
        NATS(),  # never connected: these tests use no store
        layout=DEFAULT_LAYOUT,
        backends={},
        metrics=SupervisorMetrics(CollectorRegistry()),
        cfg=SupervisorConfig(),
        deliver=None,
    )
    scheduler = RecordingScheduler()
    replica.scheduler = scheduler
    return replica, scheduler


def _discovery(job: str, seq: int) -> FakeDelivery:
    d = FakeDelivery(job, seq, subject=f"dispatch.discovery.{CLUSTER}.{job}", payload=b"d")
    d.time = T0
    return d


async def test_each_delivery_wakes_its_job_and_discoveries_are_kept_for_the_pass() -> None:
    replica, scheduler = _replica()
    feed = FakeFeed([_discovery("a", 3), _discovery("b", 4)])
    stop = asyncio.Event()
    task = asyncio.create_task(replica.consume("discovery", feed, stop))
    try:
        await until(lambda: len(scheduler.woken) == 2)
    finally:
        stop.set()
        await task
    assert scheduler.woken == [("a", 3, "discovery"), ("b", 4, "discovery")]
    assert replica.discoveries.kept_jobs() == {"a", "b"}
    entry = await replica.discoveries.get((CLUSTER, "a"))
    assert entry is not None
    assert (entry.seq, entry.payload) == (3, b"d")
    assert feed.fake_closed


async def test_a_settled_status_empties_the_per_job_caches() -> None:
    inst = Installation()
    inst.submit("j")
    inst.write("j", *decide(inst.job("j"), Cancel(by=ALICE, reason="x"), T0))
    executor = PassExecutor(
        records=inst.records,
        discoveries=inst.discoveries,
        statuses=inst.statuses,
        backends={CLUSTER: inst.backend},
        metrics=SupervisorMetrics(CollectorRegistry()),
    )
    assert (await executor.run_pass("j")).settled
    settled_status = inst.statuses.values[("j",)]

    replica, _ = _replica()
    replica.discoveries.keep(_discovery("j", 5))
    replica.deadlines.set_wake("j", T0)
    assert replica.cached_jobs() == {"j"}
    replica.note_status(settled_status)
    assert replica.cached_jobs() == frozenset()


async def test_a_failed_pass_leaves_no_discovery_kept_for_a_later_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass that fails before it reads the Discovery (the store down for a moment) naks
    its delivery, which may go to the other replica, as may every newer value: the value
    kept here is dropped, or this replica's next pass of the job would plan from a
    Discovery older than the record it reads."""
    replica = Replica(
        NATS(),  # never connected: the pass is a FAKE that fails on the store
        layout=DEFAULT_LAYOUT,
        backends={},
        metrics=SupervisorMetrics(CollectorRegistry()),
        cfg=SupervisorConfig(),
        deliver=None,
    )

    async def store_down(job_id: str) -> PassOutcome:
        raise StoreUnavailable(f"job {job_id!r}: read record", "no reply from JetStream")

    monkeypatch.setattr(replica.executor, "run_pass", store_down)
    delivery = _discovery("j", 5)
    stop = asyncio.Event()
    scheduler = asyncio.create_task(replica.scheduler.run(stop))
    consumer = asyncio.create_task(replica.consume("discovery", FakeFeed([delivery]), stop))
    try:
        await until(lambda: delivery.settled == ["nak"])
    finally:
        stop.set()
        await asyncio.gather(scheduler, consumer)
    assert replica.discoveries.kept_jobs() == frozenset()

"""The supervisor's per-job scheduling with FAKE deliveries and a FAKE pass (no NATS): the
echo rule (a record append a pass here planned from wakes nothing), one worker per job, and
what is acked, naked or woken when."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from dispatch_nats import StoreUnavailable
from services.supervisor.deadlines import Deadlines
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassOutcome
from services.supervisor.scheduling import Scheduler
from tests.unit.supervisor.deliveries import FakeDelivery, FakePasses
from tests.util import assert_eventually


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (assert_eventually needs an assertion)."""

    def check() -> None:
        assert condition()

    await assert_eventually(check, timeout_s=30.0)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _no_publish(job_id: str, msg_id: str) -> bool:
    return True


@asynccontextmanager
async def running(passes: FakePasses) -> AsyncIterator[Scheduler]:
    scheduler = Scheduler(
        passes.run_pass,
        deadlines=Deadlines(_no_publish, clock=lambda: T0),
        metrics=SupervisorMetrics(CollectorRegistry()),
        max_concurrent=8,
        retry_s=1.0,
        clock=lambda: T0,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    await until(lambda: scheduler._tg is not None)
    try:
        yield scheduler
    finally:
        stop.set()
        await task


async def test_an_append_the_pass_planned_from_is_acked_without_a_pass() -> None:
    passes = FakePasses(lambda job, n: PassOutcome(job_id=job, planned_seq=10, seq=10))
    async with running(passes) as scheduler:
        first = FakeDelivery("j", 4, subject="dispatch.record.j.api")
        await scheduler.wake("j", first, "record")
        await until(lambda: first.settled == ["ack"] and scheduler.busy == 0)
        # The pass appended seqs 5..10 itself: their deliveries are its echo.
        echoes = [FakeDelivery("j", seq) for seq in range(5, 11)]
        for echo in echoes:
            await scheduler.wake("j", echo, "record")
        assert [e.settled for e in echoes] == [["ack"]] * 6
        assert passes.runs == {"j": 1}


async def test_appends_that_come_while_the_pass_runs_wait_for_it_then_wake_only_if_new() -> None:
    passes = FakePasses(lambda job, n: PassOutcome(job_id=job, planned_seq=7 if n == 1 else 9))
    passes.gate = asyncio.Event()
    async with running(passes) as scheduler:
        await scheduler.wake("j", FakeDelivery("j", 3, subject="dispatch.record.j.api"), "record")
        await passes.started.wait()
        own = FakeDelivery("j", 7)  # its own decision, delivered before its append returned
        later = FakeDelivery("j", 9, subject="dispatch.record.j.api")  # an operator's, later
        await scheduler.wake("j", own, "record")
        await scheduler.wake("j", later, "record")
        assert own.settled == []
        assert later.settled == []
        passes.gate.set()
        await until(lambda: own.settled == ["ack"] and later.settled == ["ack"])
        assert passes.runs == {"j": 2}  # one more pass, for seq 9 only


async def test_an_operators_append_the_pass_never_read_wakes_the_job() -> None:
    passes = FakePasses(lambda job, n: PassOutcome(job_id=job, planned_seq=5 * n))
    async with running(passes) as scheduler:
        await scheduler.wake("j", FakeDelivery("j", 5, subject="dispatch.record.j.api"), "record")
        await until(lambda: passes.runs == {"j": 1} and scheduler.busy == 0)
        other = FakeDelivery("j", 6, subject="dispatch.record.j.api")
        await scheduler.wake("j", other, "record")
        await until(lambda: other.settled == ["ack"])
        assert passes.runs == {"j": 2}


async def test_what_woke_a_worker_is_acked_only_after_its_follow_ups() -> None:
    passes = FakePasses(lambda job, n: PassOutcome(job_id=job, planned_seq=3, follow_up=n < 3))
    passes.gate = asyncio.Event()
    async with running(passes) as scheduler:
        woke = FakeDelivery("j", 1, subject="dispatch.discovery.c.j")
        await scheduler.wake("j", woke, "discovery")
        passes.gate.set()
        await until(lambda: scheduler.busy == 0 and passes.runs == {"j": 3})
        assert woke.settled == ["ack"]


async def test_a_follow_up_that_fails_naks_what_woke_the_worker_so_another_replica_runs_it() -> (
    None
):
    def outcome(job: str, n: int) -> PassOutcome:
        if n == 2:
            raise StoreUnavailable("append", "down")
        return PassOutcome(job_id=job, planned_seq=3, follow_up=True)

    passes = FakePasses(outcome)
    async with running(passes) as scheduler:
        woke = FakeDelivery("j", 1, subject="dispatch.discovery.c.j")
        await scheduler.wake("j", woke, "discovery")
        await until(lambda: woke.settled == ["nak"])
        assert passes.runs == {"j": 2}


async def test_a_pass_that_fails_on_the_store_naks_what_woke_it() -> None:
    def outcome(job: str, n: int) -> PassOutcome:
        raise StoreUnavailable("read", "down")

    passes = FakePasses(outcome)
    async with running(passes) as scheduler:
        woke = FakeDelivery("j", 2, subject="dispatch.record.j.api")
        await scheduler.wake("j", woke, "record")
        await until(lambda: woke.settled == ["nak"])


async def test_a_follow_up_runs_in_the_same_worker_and_a_discovery_marks_it_dirty() -> None:
    passes = FakePasses(lambda job, n: PassOutcome(job_id=job, planned_seq=1, follow_up=n == 1))
    async with running(passes) as scheduler:
        d = FakeDelivery("j", 1, subject="dispatch.discovery.c.j")
        await scheduler.wake("j", d, "discovery")
        await until(lambda: d.settled == ["ack"] and passes.runs == {"j": 2})
        await until(lambda: scheduler.busy == 0)
        assert passes.runs == {"j": 2}

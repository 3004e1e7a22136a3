"""Settled jobs leave the supervisor's per-job caches (bounded memory): the pass executor's
folded jobs and published Statuses, the scheduler's slots. The pass is the real one, on the
in-memory ports of ``fakes.py``; the deliveries that wake it are FAKE (no NATS)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from dispatch_core import Cancel, decide
from services.supervisor.deadlines import Deadlines
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassExecutor
from services.supervisor.scheduling import Scheduler
from tests.unit.supervisor.deliveries import FakeDelivery
from tests.unit.supervisor.test_passes import ALICE, CLUSTER, Installation
from tests.unit.supervisor.test_scheduling import until

N = 40


async def _no_publish(job_id: str, msg_id: str) -> bool:
    return True


async def test_after_n_jobs_settle_the_caches_hold_none_of_them() -> None:
    inst = Installation()
    executor = PassExecutor(
        records=inst.records,
        discoveries=inst.discoveries,
        statuses=inst.statuses,
        backends={CLUSTER: inst.backend},
        metrics=SupervisorMetrics(CollectorRegistry()),
    )
    scheduler = Scheduler(
        executor.run_pass,
        deadlines=Deadlines(_no_publish),
        metrics=SupervisorMetrics(CollectorRegistry()),
        max_concurrent=8,
        retry_s=1.0,
        on_settled=executor.forget,
    )
    jobs = [f"job-{i}" for i in range(N)]
    for job_id in jobs:
        inst.submit(job_id)
        # Cancelled before any pass: the first pass settles it.
        cancel = decide(inst.job(job_id), Cancel(by=ALICE, reason="done"), datetime.now(UTC))
        inst.write(job_id, *cancel)
    live = "job-live"
    inst.submit(live)  # never settles here: it stays cached
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    try:
        await until(lambda: scheduler.stopping is False and scheduler._tg is not None)
        deliveries = [FakeDelivery(j, 1, subject=f"dispatch.record.{j}.api") for j in jobs]
        deliveries.append(FakeDelivery(live, 1, subject=f"dispatch.record.{live}.api"))
        for d in deliveries:
            await scheduler.wake(d.job_id, d, "record")
        await until(lambda: all(d.settled == ["ack"] for d in deliveries))
        await until(lambda: scheduler.busy == 0)
        assert len(inst.statuses.values) == N + 1  # every job was passed and published
        assert executor.cached_jobs() == {live}
        assert scheduler.jobs() == {live}
    finally:
        stop.set()
        await task

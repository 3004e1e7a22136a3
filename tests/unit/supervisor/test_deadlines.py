"""Deadline and retry wakes (no NATS: the pass-request publish is a FAKE that records)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from services.supervisor.deadlines import Deadlines
from tests.unit.supervisor.test_scheduling import until

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def test_due_deadlines_are_published_once_with_msg_ids_every_replica_derives() -> None:
    published: list[tuple[str, str]] = []

    async def publish(job_id: str, msg_id: str) -> bool:
        published.append((job_id, msg_id))
        return True

    deadlines = Deadlines(publish, clock=lambda: NOW)
    past = NOW - timedelta(seconds=1)
    deadlines.set_wake("a", NOW + timedelta(hours=1))
    deadlines.set_wake("a", past)  # a newer Status: the older deadline is superseded
    deadlines.set_wake("b", past)
    deadlines.set_wake("b", None)  # b settled
    deadlines.retry("c", past)
    stop = asyncio.Event()
    task = asyncio.create_task(deadlines.run(stop))
    try:
        await until(lambda: len(published) == 2)
    finally:
        stop.set()
        await task
    assert sorted(published) == [
        ("a", f"wake:a:{past.isoformat()}"),
        ("c", f"retry:c:{past.isoformat()}"),
    ]
    assert deadlines.jobs() == {"a"}


async def test_a_publish_that_failed_is_tried_again() -> None:
    tries: list[str] = []

    async def publish(job_id: str, msg_id: str) -> bool:
        tries.append(msg_id)
        return len(tries) > 1

    clock = [NOW]
    deadlines = Deadlines(publish, clock=lambda: clock[0])
    deadlines.retry("a", NOW)
    stop = asyncio.Event()
    task = asyncio.create_task(deadlines.run(stop))
    try:
        await until(lambda: len(tries) == 1)
        clock[0] = NOW + timedelta(seconds=2)  # past the 1 s pause before trying again
        deadlines.retry("other", NOW + timedelta(hours=1))  # wakes the loop
        await until(lambda: len(tries) == 2)
    finally:
        stop.set()
        await task
    assert tries == [f"retry:a:{NOW.isoformat()}"] * 2

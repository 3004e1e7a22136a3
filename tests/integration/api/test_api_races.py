"""A command that loses the race for a record to another writer is decided again against the
new record, never reported as an error; only when it loses every time is it a 503."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_core import (
    EmergencyStopRequested,
    EscalationCommitted,
    HoldPlaced,
    OutcomeCommitted,
    WriterKind,
    encode,
)
from dispatch_nats import LatestStore, Layout, RecordStore
from services.api.errors import Busy
from services.api.metrics import ApiMetrics
from services.api.operations import Operations
from tests.integration.api.support import ALICE, CLUSTERS, Api, now

pytestmark = pytest.mark.integration


class RacingRecords(RecordStore):
    """A real record store in which another writer (as the supervisor would) appends to the
    job just before each of the next ``races`` appends of the API."""

    def __init__(self, nc: NATS, layout: Layout, races: int) -> None:
        super().__init__(nc, writer=WriterKind.API, layout=layout)
        self.supervisor = RecordStore(nc, writer=WriterKind.SUPERVISOR, layout=layout)
        self.races = races
        self.raced = 0

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        if self.races > 0:
            self.races -= 1
            self.raced += 1
            other = EscalationCommitted(
                job_id=job_id, at=now(), id=f"overdue:{self.raced}", detail="racing writer"
            )
            await self.supervisor.append(
                job_id,
                encode(other),
                expected_last_seq=await self.last_seq(job_id),
                msg_id=f"racer-{job_id}-{self.raced}",
            )
        return await super().append_many(
            job_id, payloads, expected_last_seq=expected_last_seq, msg_ids=msg_ids
        )


def _ops(
    nc: NATS, layout: Layout, records: RecordStore, registry: CollectorRegistry, attempts: int = 16
) -> Operations:
    return Operations(
        records=records,
        statuses=LatestStore.status(nc, layout=layout),
        discoveries=LatestStore.discovery(nc, layout=layout),
        declarations=CLUSTERS,
        metrics=ApiMetrics(registry),
        attempts=attempts,
    )


async def test_a_lost_race_is_decided_again(api: Api, nc: NATS) -> None:
    job_id = (await api.submit())["job_id"]
    records = RacingRecords(nc, api.layout, races=3)
    registry = CollectorRegistry()
    ops = _ops(nc, api.layout, records, registry)
    answer = await ops.command(ALICE, job_id, "hold", b'{"reason": "racing"}', None)
    assert records.raced == 3
    assert [type(e.event) for e in answer.events] == [HoldPlaced]
    events = await api.events(job_id)
    assert [type(e).__name__ for e in events[1:]] == [
        "EscalationCommitted",
        "EscalationCommitted",
        "EscalationCommitted",
        "HoldPlaced",
    ]
    assert isinstance(events[-1], HoldPlaced)
    assert answer.seq == await api.records.last_seq(job_id)
    conflicts = registry.get_sample_value(
        "dispatch_api_command_conflicts_total", {"command": "hold"}
    )
    assert conflicts == 3
    committed = {"command": "hold", "outcome": "committed"}
    assert registry.get_sample_value("dispatch_api_commands_total", committed) == 1
    await records.aclose()


async def test_losing_every_race_is_busy_and_records_nothing_of_its_own(api: Api, nc: NATS) -> None:
    job_id = (await api.submit())["job_id"]
    records = RacingRecords(nc, api.layout, races=100)
    ops = _ops(nc, api.layout, records, CollectorRegistry(), attempts=3)
    with pytest.raises(Busy, match="lost the race"):
        await ops.command(ALICE, job_id, "hold", b'{"reason": "racing"}', None)
    assert not any(isinstance(e, HoldPlaced) for e in await api.events(job_id))
    await records.aclose()


async def test_concurrent_commands_over_http_never_fail_for_a_lost_race(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    replies = await asyncio.gather(
        *(api.command(job_id, "emergency-stop", reason=f"stop {i}") for i in range(12)),
        *(api.command(job_id, "cancel", reason=f"cancel {i}") for i in range(6)),
    )
    stops, cancels = replies[:12], replies[12:]
    assert all(r.status == 200 for r in stops), [r.text for r in stops]
    assert all(r.status in (200, 409) for r in cancels), [r.text for r in cancels]
    for r in cancels:
        if r.status == 409:
            assert "committed and final" in r.error["message"]
    events = await api.events(job_id)
    assert sum(isinstance(e, EmergencyStopRequested) for e in events) == 12
    assert sum(isinstance(e, OutcomeCommitted) for e in events) == 1
    assert api.metric("dispatch_api_command_conflicts_total", {"command": "emergency-stop"}) > 0

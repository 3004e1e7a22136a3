"""FAKE deliveries and a FAKE pass for the supervisor's scheduling and replica-loop unit
tests: no NATS. A :class:`FakeDelivery` records how it was settled; :class:`FakePasses`
runs "passes" the test scripts (their outcome, and a gate to hold one mid-run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispatch_nats import Delivery, SharedFeed
from services.supervisor.passes import PassOutcome
from services.supervisor.scheduling import Scheduler, Source

__all__ = ["FakeDelivery", "FakeFeed", "FakePasses", "RecordingScheduler"]


class FakeDelivery(Delivery):
    """A FAKE ``Delivery`` (no message behind it): remembers ack / nak / term."""

    def __init__(
        self,
        job_id: str,
        seq: int,
        *,
        subject: str = "",
        payload: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        # Deliberately not calling Delivery.__init__: there is no NATS message.
        self.subject = subject or f"dispatch.record.{job_id}.supervisor"
        self.job_id = job_id
        self.seq = seq
        self.num_delivered = 1
        self.payload = payload
        self.headers = dict(headers or {})
        self.settled: list[str] = []

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay_s: float | None = None) -> None:
        self.settled.append("nak")

    async def in_progress(self) -> None:
        self.settled.append("in_progress")

    async def term(self) -> None:
        self.settled.append("term")


class FakePasses:
    """A FAKE pass runner: each pass of a job returns ``outcome(job_id, n)`` (n counts that
    job's passes from 1) after waiting for ``gate`` when one is set."""

    def __init__(self, outcome: Callable[[str, int], PassOutcome]) -> None:
        self.outcome = outcome
        self.runs: dict[str, int] = {}
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def run_pass(self, job_id: str) -> PassOutcome:
        n = self.runs[job_id] = self.runs.get(job_id, 0) + 1
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        return self.outcome(job_id, n)


class FakeFeed(SharedFeed):
    """A FAKE shared consumer: hands out the given deliveries, then waits until closed."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        # Deliberately not calling SharedFeed.__init__: there is no consumer.
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue()
        for d in deliveries:
            self._queue.put_nowait(d)
        self.fake_closed = False

    async def start(self) -> None:
        return None

    async def __anext__(self) -> Delivery:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self.fake_closed = True
        self._queue.put_nowait(None)


class RecordingScheduler(Scheduler):
    """A FAKE scheduler: records each wake (job, seq, source) instead of running passes."""

    def __init__(self) -> None:
        # Deliberately not calling Scheduler.__init__: it runs nothing.
        self.woken: list[tuple[str, int | None, str]] = []

    async def wake(self, job_id: str, delivery: Delivery | None, source: Source) -> None:
        self.woken.append((job_id, None if delivery is None else delivery.seq, source))

    def forget(self, job_id: str) -> bool:
        return True

    def jobs(self) -> frozenset[str]:
        return frozenset()

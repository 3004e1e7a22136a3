"""FAKE deliveries and a FAKE pass for the supervisor's scheduling and replica-loop unit
tests: no NATS. A :class:`FakeDelivery` records how it was settled; :class:`FakePasses`
runs "passes" the test scripts (their outcome, and a gate to hold one mid-run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispatch_nats import Delivery
from services.supervisor.passes import PassOutcome

__all__ = ["FakeDelivery", "FakePasses"]


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

"""Deadlines: every job's next deadline (from the status stream) and this replica's own
retries, as a heap; when one comes, a pass request goes to the work stream
(``dispatch.work.<job>`` with ``Nats-Msg-Id: wake:<job>:<wake at>``). However many replicas
publish it, JetStream stores it once and one replica runs the pass; a replica that dies loses
nothing, the others publish the same wake."""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Final

from services.common.clock import utcnow

__all__ = ["Deadlines"]

log = logging.getLogger("dispatch.supervisor")

_PUBLISH_CONCURRENCY: Final = 64
"""Most pass requests published at once."""


class Deadlines:
    """Every job's next deadline (from the status stream) and local retries, as a heap; when
    one comes, a pass request goes to the work stream with a msg id every replica derives
    the same way."""

    def __init__(
        self,
        publish: Callable[[str, str], Awaitable[bool]],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """``publish(job_id, msg_id)`` sends a pass request; it returns False on failure."""
        self._publish = publish
        self._clock = clock
        self._heap: list[tuple[datetime, str, str]] = []
        self._wake: dict[str, datetime] = {}
        self._changed = asyncio.Event()

    def set_wake(self, job_id: str, at: datetime | None) -> None:
        """Make ``at`` the job's deadline (None: it has none)."""
        if at is None:
            self._wake.pop(job_id, None)
            return
        if self._wake.get(job_id) == at:
            return
        self._wake[job_id] = at
        self._push(at, job_id, f"wake:{job_id}:{at.isoformat()}")

    def retry(self, job_id: str, at: datetime) -> None:
        """Request a pass of the job at ``at`` (this replica's own retry)."""
        self._push(at, job_id, f"retry:{job_id}:{at.isoformat()}")

    def _push(self, at: datetime, job_id: str, msg_id: str) -> None:
        heapq.heappush(self._heap, (at, job_id, msg_id))
        self._changed.set()

    def __len__(self) -> int:
        return len(self._heap)

    def jobs(self) -> frozenset[str]:
        """The jobs with a deadline."""
        return frozenset(self._wake)

    async def _fire(self, entry: tuple[datetime, str, str], slots: asyncio.Semaphore) -> None:
        async with slots:
            if not await self._publish(entry[1], entry[2]):
                # Try again in a second (the deadline is still due).
                again = self._clock() + timedelta(seconds=1)
                heapq.heappush(self._heap, (again, entry[1], entry[2]))

    async def run(self, stop: asyncio.Event) -> None:
        """Publish each request when it comes, until ``stop``."""
        while not stop.is_set():
            self._changed.clear()
            now = self._clock()
            due: list[tuple[datetime, str, str]] = []
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)
                at, job_id, msg_id = entry
                if msg_id.startswith("wake:") and self._wake.get(job_id) != at:
                    continue  # superseded by a newer deadline
                due.append(entry)
            if due:
                slots = asyncio.Semaphore(_PUBLISH_CONCURRENCY)
                await asyncio.gather(*(self._fire(e, slots) for e in due))
                continue
            timeout = None
            if self._heap:
                timeout = max((self._heap[0][0] - self._clock()).total_seconds(), 0.0)
            waiters = [
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self._changed.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

"""What the pass executor needs of the outside world, as Protocols.

``dispatch_nats.RecordStore`` and ``dispatch_nats.LatestStore`` satisfy them; the unit tests
use in-memory fakes with the same optimistic-concurrency rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from dispatch_core import Escalation
from dispatch_nats import LatestEntry, RecordEntry

__all__ = ["DeliverFn", "LatestPort", "RecordPort"]

DeliverFn = Callable[[str, Escalation], Awaitable[None]]
"""Seed 002's ``Deliver``: reach a person about ``escalation`` of job ``job_id``; return to
have it recorded delivered, raise to have it offered again after the next pass."""


class RecordPort(Protocol):
    """Each job's append-only record (``dispatch_nats.RecordStore``)."""

    async def read(self, job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        """Return the job's events after ``after_seq``, oldest first."""
        ...

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        """Append one event if the record's last seq is ``expected_last_seq``; return its seq.

        Raises:
            dispatch_nats.ConcurrencyConflict: another event was appended first.
        """
        ...

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        """Append several events, all or none, if the record's last seq is
        ``expected_last_seq``; return their seqs.

        Raises:
            dispatch_nats.ConcurrencyConflict: another event was appended first.
        """
        ...


class LatestPort(Protocol):
    """A latest-value-per-key stream (``dispatch_nats.LatestStore``): discovery or status."""

    async def get(self, key: tuple[str, ...]) -> LatestEntry | None:
        """Return the current value of ``key``, or None."""
        ...

    async def put(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Make ``payload`` the value of ``key`` (only over ``expected_last_seq`` if given).

        Raises:
            dispatch_nats.ConcurrencyConflict: the key's current seq is another.
        """
        ...

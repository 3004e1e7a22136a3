"""What the pass executor needs of the outside world, as Protocols.

``dispatch_nats.RecordStore`` and ``dispatch_nats.LatestStore`` satisfy them; the unit tests
use in-memory fakes with the same optimistic-concurrency rules. ``RecordPort`` is the record
repository's (``dispatch_nats.RecordPort``), which the pass will load and append through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from dispatch_core import Escalation
from dispatch_nats import LatestEntry, RecordPort

__all__ = ["DeliverFn", "LatestPort", "RecordPort"]

DeliverFn = Callable[[str, Escalation], Awaitable[None]]
"""Seed 002's ``Deliver``: reach a person about ``escalation`` of job ``job_id``; return to
have it recorded delivered, raise to have it offered again after the next pass."""


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

    async def publish(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``put`` without waiting for the ack (the outcome shows on a watch)."""
        ...

"""The services' one clock: the time of a pass, a decision or a delivery fact.

Every service takes a ``clock`` parameter (a test passes its own) whose default is
:func:`utcnow`; nothing else in ``services/`` reads the wall clock for a job's life.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["Clock", "utcnow"]

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware."""


def utcnow() -> datetime:
    """Return the current time in UTC (timezone-aware)."""
    return datetime.now(UTC)

"""Exponential backoff with jitter, capped; the randomness comes from the caller.

The one backoff of the project: the notifier's delivery retries, every service's start-up
(connecting to NATS, creating the streams while a cluster elects its leaders), the shared
consumers re-created after a leader change, and the stores' retries of a stream that has no
leader. Pure (no clock, no randomness of its own), so it lives beside the core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import msgspec

__all__ = ["Backoff"]

_MAX_EXPONENT: Final = 62  # 2**62 times any base is past any cap; keeps the float finite


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """Delays of ``base_s * 2**(n-1)`` before retry ``n``, at most ``max_s``, each shortened
    by up to ``jitter`` of itself so that many escalations failing together spread out.

    Attributes:
        base_s: the first delay, in seconds.
        max_s: the longest delay, in seconds.
        jitter: fraction (0..1) of a delay that may be taken off at random.
    """

    base_s: float
    max_s: float
    jitter: float = 0.2

    def delay(self, attempt: int, u: float) -> float:
        """Return the delay after failed attempt number ``attempt`` (1 for the first).

        Args:
            attempt: how many attempts failed so far (1 or more).
            u: a number in ``[0, 1)`` from the injected jitter source.

        Returns:
            Seconds to wait, in ``[(1 - jitter) * d, d]`` for the capped exponential ``d``.
        """
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        capped = min(self.max_s, self.base_s * 2.0**exponent)
        return capped * (1.0 - self.jitter * min(max(u, 0.0), 1.0))

    def delays(self, u: Callable[[], float] | None = None) -> Iterator[float]:
        """Yield the delays after attempt 1, 2, 3, ... for ever.

        Args:
            u: the jitter source, numbers in ``[0, 1)``; None takes no jitter off.
        """
        attempt = 0
        while True:
            attempt += 1
            yield self.delay(attempt, 0.0 if u is None else u())

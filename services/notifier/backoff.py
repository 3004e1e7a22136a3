"""Exponential backoff with jitter, capped; the randomness comes from the caller."""

from __future__ import annotations

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

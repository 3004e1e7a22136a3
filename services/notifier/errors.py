"""The notifier's errors: one root, :class:`NotifierError`."""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = ["ChannelError", "NotifierError"]


class NotifierError(Exception):
    """Root of the notifier's errors."""

    retryable: ClassVar[bool] = False


class ChannelError(NotifierError):
    """A channel did not accept a notice.

    Attributes:
        channel: the channel's name.
        reason: what went wrong, for logs (never a secret: URLs show only their origin).
        outcome: ``failed`` (unreachable, timed out, 5xx, 429: likely to pass later) or
            ``rejected`` (the receiver refused this notice, e.g. a 4xx: likely a
            configuration problem). Both are retried; the outcome labels metrics and logs.
        retry_after_s: the receiver asked to wait at least this long (``Retry-After``).
    """

    retryable: ClassVar[bool] = True

    def __init__(
        self,
        channel: str,
        reason: str,
        *,
        outcome: Literal["failed", "rejected"] = "failed",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"channel {channel!r}: {reason}")
        self.channel, self.reason, self.outcome = channel, reason, outcome
        self.retry_after_s = retry_after_s

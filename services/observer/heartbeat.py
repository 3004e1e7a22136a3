"""The observer's heartbeat on ``dispatch.observer.<cluster>`` (core NATS, not stored).

Published after every poll, so a reader learns within one poll interval whether the
cluster's scheduler is reachable. An unreachable scheduler changes no job's state (seed 000:
"A scheduler you can't reach is an ErrUnreachable error, never a state"); the heartbeat is
where it shows.
"""

from __future__ import annotations

from typing import Final

import msgspec

from dispatch_core import UtcDatetime

__all__ = ["Heartbeat", "decode_heartbeat", "encode_heartbeat"]


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """One observer poll's verdict on its scheduler.

    Attributes:
        cluster: the cluster.
        at: when the poll asked the scheduler.
        reachable: whether the scheduler answered.
        error: the scheduler's (or the adapter's) error when it did not, verbatim.
        jobs: jobs with at least one object on the cluster (when reachable).
        poll_interval_s: seconds between polls: the next heartbeat is due by then.
    """

    cluster: str
    at: UtcDatetime
    reachable: bool
    error: str = ""
    jobs: int = 0
    poll_interval_s: float = 1.0


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Heartbeat)


def encode_heartbeat(beat: Heartbeat) -> bytes:
    """Encode a heartbeat as JSON."""
    return _ENCODER.encode(beat)


def decode_heartbeat(data: bytes) -> Heartbeat:
    """Decode a heartbeat.

    Raises:
        msgspec.DecodeError: not a heartbeat.
    """
    return _DECODER.decode(data)

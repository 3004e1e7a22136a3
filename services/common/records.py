"""Reading a job's record as ``fold`` takes it: each stored event decoded, with the kind of
writer that appended it (contract v2; issue 10, "Writer kinds" and "Poison contained")."""

from __future__ import annotations

from collections.abc import Iterable

from dispatch_core import RecordItem, decode_record_event
from dispatch_nats import RecordEntry

__all__ = ["record_items"]


def record_items(job_id: str, entries: Iterable[RecordEntry]) -> list[RecordItem]:
    """Decode ``job_id``'s stored events into ``(seq, event, writer)`` items for ``fold``.

    Raises:
        UndecodableEvent: an event doesn't decode; names the job and its seq (a
            ``MalformedRecord``: that job's record is unreadable, no other job's).
    """
    return [
        (e.seq, decode_record_event(e.payload, job_id=job_id, seq=e.seq), e.writer) for e in entries
    ]

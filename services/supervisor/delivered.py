"""The Discovery a pass plans from, taken from the delivery that woke it rather than read
again (issue 11 item 4).

The supervisor's discovery consumer delivers payloads; each delivery's value is kept here
until the job's next pass asks for that key, which takes it (once). A pass that finds
nothing kept (woken by a record append or a deadline, a follow-up, or a re-plan after a
conflict) reads the stream leader as before.

Why taking a delivered value is as good as reading the leader: when JetStream delivered
it, it was the key's latest (the stream keeps one message per subject). A newer value goes
to some replica as its own delivery and wakes a pass there; a pass that plans from the
older one a moment later commits with optimistic concurrency on the record, and on a
conflict re-plans with a value read from the leader. So a pass sees what a pass that
started a moment earlier would have read.

That holds for the pass the delivery woke only: a value kept for a pass that failed
before it read it is dropped (``Replica._run_pass``), as its delivery is nak'd and newer
values may go to another replica; a later pass here reads the leader.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NATS

from dispatch_nats import Delivery, LatestEntry, LatestStore, StreamKind

__all__ = ["DeliveredLatest"]


class DeliveredLatest(LatestStore):
    """A ``LatestStore`` whose ``get`` first takes a value a delivery brought (once)."""

    def __init__(self, nc: NATS, kind: StreamKind, **options: Any) -> None:
        """As ``LatestStore``."""
        super().__init__(nc, kind, **options)
        self._kept: dict[tuple[str, ...], LatestEntry] = {}

    def keep(self, delivery: Delivery) -> None:
        """Keep the value ``delivery`` carries for the next ``get`` of its key (a newer one
        replaces it; an older one is ignored).

        Raises:
            InvalidName: the delivery's subject is not one of this store's.
        """
        kept = self._kept
        key = self.key_of(delivery.subject)
        current = kept.get(key)
        if current is not None and current.seq >= delivery.seq:
            return
        kept[key] = LatestEntry(
            key=key,
            seq=delivery.seq,
            payload=delivery.payload,
            time=delivery.time,
            headers={k: v for k, v in delivery.headers.items() if not k.startswith("Nats-")},
        )

    def forget(self, job_id: str) -> None:
        """Drop what is kept for ``job_id`` (the job settled)."""
        kept = self._kept
        if kept:
            for key in [k for k in kept if k[-1] == job_id]:
                del kept[key]

    def kept_jobs(self) -> frozenset[str]:
        """The jobs a value is kept for."""
        return frozenset(k[-1] for k in self._kept)

    def __len__(self) -> int:
        """How many values are kept."""
        return len(self._kept)

    async def get(self, key: tuple[str, ...]) -> LatestEntry | None:
        """The kept value of ``key`` (taken: the next ``get`` reads the stream), else the
        stream's (see ``LatestStore.get``)."""
        kept = self._kept
        if kept:
            entry = kept.pop(key, None)
            if entry is not None:
                return entry
        return await super().get(key)

"""In-memory stand-ins for the pass executor's ports, with JetStream's rules: a record
append extends the record only from its expected last seq, a msg id already stored after
that seq is the same append's earlier try (as ``RecordStore`` resolves it), a latest-value
put honours its expected seq; and a scheduler whose calls the test can watch and delay."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime

from dispatch_backends import Snapshot
from dispatch_core import (
    Declarations,
    JobEvent,
    Launch,
    ObjectRef,
    ObservedObject,
    WriterKind,
    decode_event,
    encode,
)
from dispatch_nats import AppendOutcomeUnknown, ConcurrencyConflict, LatestEntry, RecordEntry
from tests.util import writer_of

__all__ = ["FakeBackend", "FakeLatest", "FakeRecords"]


class FakeRecords:
    """Job records on one stream: one global sequence, gaps between a job's events."""

    def __init__(self) -> None:
        self.seq = 0
        self.entries: dict[str, list[RecordEntry]] = {}
        self.before_append: Callable[[str], Awaitable[None]] | None = None
        """Called at the start of every append (to interleave another writer)."""
        self.silent = 0
        """The next this many appends are stored but answered by silence (the store then
        raises AppendOutcomeUnknown, as RecordStore does when JetStream never answers)."""

    def events(self, job_id: str) -> list[JobEvent]:
        return [decode_event(e.payload) for e in self.entries.get(job_id, [])]

    def last(self, job_id: str) -> int:
        entries = self.entries.get(job_id)
        return entries[-1].seq if entries else 0

    async def read(self, job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        await asyncio.sleep(0)
        return [e for e in self.entries.get(job_id, []) if e.seq > after_seq]

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        return (
            await self.append_many(
                job_id, [payload], expected_last_seq=expected_last_seq, msg_ids=[msg_id]
            )
        )[0]

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        if self.before_append is not None:
            await self.before_append(job_id)
        await asyncio.sleep(0)
        entries = self.entries.setdefault(job_id, [])
        stored = {e.msg_id: e.seq for e in entries if e.seq > expected_last_seq}
        if all(m in stored for m in msg_ids):
            return [stored[m] for m in msg_ids]  # the store's resolution of a retry
        if self.last(job_id) != expected_last_seq:
            raise ConcurrencyConflict(job_id, expected_last_seq, self.last(job_id))
        out = []
        for payload, msg_id in zip(payloads, msg_ids, strict=True):
            self.seq += 1
            entries.append(
                RecordEntry(
                    seq=self.seq,
                    payload=payload,
                    msg_id=msg_id,
                    time=datetime.now(UTC),
                    writer=WriterKind.SUPERVISOR,
                )
            )
            out.append(self.seq)
        if self.silent > 0:
            self.silent -= 1
            raise AppendOutcomeUnknown(job_id, msg_ids[-1], expected_last_seq, 3)
        return out

    def write(self, job_id: str, *events: JobEvent, writer: WriterKind | None = None) -> None:
        """Append as another writer would (no checks): as ``writer``, or as the kind that
        appends each event in production."""
        entries = self.entries.setdefault(job_id, [])
        for event in events:
            self.seq += 1
            entries.append(
                RecordEntry(
                    seq=self.seq,
                    payload=encode(event),
                    msg_id=f"other:{self.seq}",
                    time=datetime.now(UTC),
                    writer=writer or writer_of(event),
                )
            )


class FakeLatest:
    """A latest-value-per-key stream."""

    def __init__(self) -> None:
        self.seq = 0
        self.values: dict[tuple[str, ...], LatestEntry] = {}
        self.puts = 0

    async def get(self, key: tuple[str, ...]) -> LatestEntry | None:
        await asyncio.sleep(0)
        return self.values.get(key)

    async def put(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        await asyncio.sleep(0)
        current = self.values.get(key)
        actual = 0 if current is None else current.seq
        if expected_last_seq is not None and expected_last_seq != actual:
            raise ConcurrencyConflict(key[-1], expected_last_seq, actual)
        self.seq += 1
        self.values[key] = LatestEntry(
            key=key,
            seq=self.seq,
            payload=payload,
            time=datetime.now(UTC),
            headers=dict(headers or {}),
        )
        self.puts += 1
        return self.seq


class FakeBackend:
    """A scheduler that makes objects on ``start``; ``on_start`` runs inside the call."""

    def __init__(self, cluster: str = "fake") -> None:
        self._cluster = cluster
        self.started: list[Launch] = []
        self.opened: list[ObjectRef] = []
        self.stopped: list[ObjectRef] = []
        self.on_start: Callable[[Launch], Awaitable[None]] | None = None
        self.objects: dict[str, list[ObservedObject]] = {}

    @property
    def cluster(self) -> str:
        return self._cluster

    def declarations(self) -> Declarations:
        return Declarations(node_loss_window_s=60.0)

    async def start(self, launch: Launch) -> ObjectRef:
        if self.on_start is not None:
            await self.on_start(launch)
        self.started.append(launch)
        return ObjectRef(cluster=self._cluster, id=str(len(self.started)))

    async def open_gate(self, ref: ObjectRef) -> None:
        self.opened.append(ref)

    async def stop(self, ref: ObjectRef) -> None:
        self.stopped.append(ref)

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        return Snapshot(
            cluster=self._cluster,
            seen_at=datetime.now(UTC),
            objects={k: tuple(v) for k, v in self.objects.items()},
        )

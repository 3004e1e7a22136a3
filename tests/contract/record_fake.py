"""IN-MEMORY FAKE of the record stream (a test double, not production code), and a fault
injector for any record store.

`FakeRecordStream` keeps every job's record on one global sequence (gaps between a job's
events, as on `DISPATCH_RECORD`); `FakeRecordStream.store(writer)` is a `RecordPort` with
`RecordStore`'s rules: an append extends a job's record only from its expected last seq
(checked against the job's whole record, every writer's events), else
`ConcurrencyConflict`; an append whose msg ids this writer already stored for the job is
answered with the stored seqs (JetStream's deduplication and the store's resolution of a
retry). The contract suite (`tests/integration/nats/test_record_repository.py`) runs the
same tests on it and on the real store, so the fake can't drift from the real thing.

`FaultyStore` wraps any `RecordPort` (the fake or a real `RecordStore`) and injects the
faults an append meets in production: the ack lost after the event was stored, the request
lost before it was, another writer appending first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from dispatch_core import WriterKind
from dispatch_nats import (
    Appended,
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    RecordEntry,
    RecordPort,
)

__all__ = ["FakeRecordStore", "FakeRecordStream", "FaultyStore"]


class FakeRecordStream:
    """IN-MEMORY FAKE: every job's record, on one stream sequence."""

    def __init__(self) -> None:
        self.seq = 0
        self.entries: dict[str, list[RecordEntry]] = {}

    def store(self, writer: WriterKind) -> FakeRecordStore:
        """A store appending as ``writer``."""
        return FakeRecordStore(self, writer)

    def last(self, job_id: str) -> int:
        """The seq of the job's last event (0: none)."""
        entries = self.entries.get(job_id)
        return entries[-1].seq if entries else 0

    def put(self, job_id: str, payload: bytes, writer: WriterKind, msg_id: str | None) -> int:
        """Store one event, unchecked (what an append does once its checks passed, or a raw
        publish by someone who bypassed dispatch)."""
        self.seq += 1
        self.entries.setdefault(job_id, []).append(
            RecordEntry(
                seq=self.seq,
                payload=payload,
                msg_id=msg_id,
                time=datetime.now(UTC),
                writer=writer,
            )
        )
        return self.seq


class FakeRecordStore:
    """IN-MEMORY FAKE of `RecordStore` for one writer kind (see the module docstring)."""

    def __init__(self, stream: FakeRecordStream, writer: WriterKind) -> None:
        self._stream = stream
        self.writer = writer

    async def read(self, job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        await asyncio.sleep(0)
        return [e for e in self._stream.entries.get(job_id, []) if e.seq > after_seq]

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        [seq] = await self.append_many(
            job_id, [payload], expected_last_seq=expected_last_seq, msg_ids=[msg_id]
        )
        return seq

    async def append_outcome(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> Appended:
        stored = self._mine(job_id).get(msg_id)
        if stored is not None:
            await asyncio.sleep(0)
            return Appended(stored, fresh=False)  # deduplicated, as JetStream does
        return Appended(
            await self.append(job_id, payload, expected_last_seq=expected_last_seq, msg_id=msg_id),
            fresh=True,
        )

    def _mine(self, job_id: str) -> dict[str, int]:
        return {
            e.msg_id: e.seq
            for e in self._stream.entries.get(job_id, [])
            if e.writer == self.writer and e.msg_id is not None
        }

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        await asyncio.sleep(0)
        mine = self._mine(job_id)
        if all(m in mine for m in msg_ids):
            return [mine[m] for m in msg_ids]  # a retry of a stored append
        last = self._stream.last(job_id)
        if last != expected_last_seq:
            raise ConcurrencyConflict(job_id, expected_last_seq, last)
        return [
            self._stream.put(job_id, p, self.writer, m)
            for p, m in zip(payloads, msg_ids, strict=True)
        ]


class FaultyStore:
    """Injects faults into appends to a record store (fake or real); reads pass through.

    Attributes:
        lose_acks: the next this many appends are stored, then answered by silence
            (`AppendOutcomeUnknown`, as the store raises when JetStream never acks).
        lose_sends: the next this many appends are lost before reaching the store (nothing
            stored), answered by silence.
        before_append: awaited with the job id before every append reaches the store (to
            let another writer append first).
        appends: appends that reached the store.
    """

    def __init__(self, store: RecordPort) -> None:
        self._store = store
        self.lose_acks = 0
        self.lose_sends = 0
        self.before_append: Callable[[str], Awaitable[None]] | None = None
        self.appends = 0

    async def read(self, job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        return await self._store.read(job_id, after_seq)

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        [seq] = await self._faulty(
            job_id,
            expected_last_seq,
            [msg_id],
            lambda: self._one(job_id, payload, expected_last_seq, msg_id),
        )
        return seq

    async def append_outcome(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> Appended:
        outcomes: list[Appended] = []

        async def one() -> list[int]:
            outcomes.append(
                await self._store.append_outcome(
                    job_id, payload, expected_last_seq=expected_last_seq, msg_id=msg_id
                )
            )
            return [outcomes[-1].seq]

        await self._faulty(job_id, expected_last_seq, [msg_id], one)
        return outcomes[-1]

    async def _one(self, job_id: str, payload: bytes, expected: int, msg_id: str) -> list[int]:
        return [
            await self._store.append(job_id, payload, expected_last_seq=expected, msg_id=msg_id)
        ]

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        return await self._faulty(
            job_id,
            expected_last_seq,
            msg_ids,
            lambda: self._store.append_many(
                job_id, payloads, expected_last_seq=expected_last_seq, msg_ids=msg_ids
            ),
        )

    async def _faulty(
        self,
        job_id: str,
        expected: int,
        msg_ids: Sequence[str],
        append: Callable[[], Awaitable[list[int]]],
    ) -> list[int]:
        if self.before_append is not None:
            await self.before_append(job_id)
        if self.lose_sends > 0:
            self.lose_sends -= 1
            raise AppendOutcomeUnknown(job_id, msg_ids[-1], expected, 1)
        self.appends += 1
        seqs = await append()
        if self.lose_acks > 0:
            self.lose_acks -= 1
            raise AppendOutcomeUnknown(job_id, msg_ids[-1], expected, 1)
        return seqs

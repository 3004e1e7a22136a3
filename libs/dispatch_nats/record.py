"""The append-only record of each job, on the `DISPATCH_RECORD` stream.

Payloads are opaque bytes here (the typed layer encodes and decodes events); what this
module guarantees is the record's order, optimistic concurrency and idempotency:

* A store is built with the writer kind of its identity (`RecordStore(nc, writer=...)`), and
  every append goes to that writer's subject of the job, `dispatch.record.<job>.<writer>`
  (contract v2); reads take the job's whole record, `dispatch.record.<job>.*`, and each
  `RecordEntry` says which kind of writer appended it.
* `append` extends a job's record only if its last seq is still `expected_last_seq`
  (`Nats-Expected-Last-Subject-Sequence`, checked against the job's whole record with
  `Nats-Expected-Last-Subject-Sequence-Subject: dispatch.record.<job>.*`, whoever wrote its
  last event), else raises `ConcurrencyConflict`.
* A retried append (same `msg_id`) is stored once and returns the first try's seq, even
  when JetStream answers the retry with `wrong last sequence` (it checks the expected seq
  before deduplicating) and even when another writer appended after the first try: the
  store resolves both by reading the job's events after `expected_last_seq` and looking
  for the msg id.
* A publish that timed out is an unknown outcome (it may be stored): resolved the same
  way, and re-sent with the same msg id and expected seq if not found (JetStream stores it
  at most once), never assumed failed. `AppendOutcomeUnknown` is raised only if JetStream
  stays silent through every attempt.
* No wait is unbounded: appends don't use nats-py's `publish_async`, whose future never
  resolves on a JetStream error (nats-io/nats.py#985).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple, Self

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from dispatch_core import MalformedRecord, WriterKind
from dispatch_core.backoff import Backoff
from dispatch_nats._feed import MessageFeed, OrderedFeed
from dispatch_nats._wire import (
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    MSG_ID,
    PUB_ACK_DECODER,
    NoResponders,
    PubAck,
    ReplyTimeout,
    Wire,
    header_int,
    parse_nats_time,
)
from dispatch_nats.contract import DEFAULT_LAYOUT, Layout
from dispatch_nats.errors import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    InvalidName,
    JetStreamApiError,
    MsgIdReused,
    StaleRead,
    StoreUnavailable,
    StreamNotFound,
    api_error,
)
from dispatch_nats.shared import SharedFeed

__all__ = ["MAX_BATCH", "Appended", "RecordChange", "RecordEntry", "RecordFeed", "RecordStore"]

log = logging.getLogger("dispatch_nats.record")

MAX_BATCH: Final = 1000
"""Most events `append_many` takes at once (nats-server's default atomic batch limit)."""

_ERR_WRONG_LAST_SEQ: Final = 10071
_ERR_WRONG_LAST_SEQ_IN_FLIGHT: Final = 10164
"""`wrong last sequence` without a number: a clustered stream's leader could not check the
expected seq because an earlier append to the subject was still being replicated (seen on
an R3 stream right after a follower thawed). Nothing was stored: send it again."""
_ERR_BATCH_INCOMPLETE: Final = 10176
_ERR_BATCH_DUPLICATE_MSG_ID: Final = 10201
_WRONG_LAST_SEQ: Final = re.compile(r"wrong last sequence: (\d+)")
_MSG_ID_RE: Final = re.compile(r"[!-~]{1,256}")
_BATCH_ID: Final = "Nats-Batch-Id"
_BATCH_SEQ: Final = "Nats-Batch-Sequence"
_BATCH_COMMIT: Final = "Nats-Batch-Commit"
_STALE_READ_RETRIES: Final = 3
_NO_STREAM_BACKOFF: Final = Backoff(base_s=0.25, max_s=2.0, jitter=0.0)
"""Pauses between appends that no stream answered (a stream leader being elected)."""
_STALE_BACKOFF: Final = Backoff(base_s=0.05, max_s=0.25, jitter=0.0)
"""Pauses before reading again from a replica still behind the stream's leader."""


class Appended(NamedTuple):
    """The outcome of one append (`RecordStore.append_outcome`)."""

    seq: int
    """The event's stream seq."""
    fresh: bool
    """Stored by this request just now, on `expected_last_seq` (so nothing lies between);
    False when an earlier copy with the same msg id was found instead."""


class RecordEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One event of a job's record, as stored."""

    seq: int
    """The JetStream stream sequence: the event's place in the record (increasing)."""
    payload: bytes
    """The encoded event, as appended."""
    msg_id: str | None
    """The `Nats-Msg-Id` it was appended with (None if written without one)."""
    time: datetime
    """When JetStream stored it (UTC, microseconds)."""
    writer: WriterKind
    """The kind of writer that appended it (from its subject, `dispatch.record.<job>.<writer>`);
    `fold` checks it may write the event's type."""


class RecordChange(NamedTuple):
    """A record was extended: `job_id`'s event at stream seq `seq` was stored."""

    job_id: str
    seq: int


class RecordFeed(MessageFeed[RecordChange]):
    """Every append to any job's record, in stream order: an async iterator of `RecordChange`.

        async with store.follow(after_seq=seq) as changes:
            async for job_id, seq in changes:
                wake(job_id)

    Built on an ordered consumer (headers only), so it survives reconnects and server
    restarts, re-starting after the last seq it delivered.
    """

    def __init__(self, feed: OrderedFeed, layout: Layout) -> None:
        """Wrap an ordered feed on the record stream (use `RecordStore.follow`)."""
        super().__init__(feed)
        self._layout = layout

    def item(self, msg: Msg) -> RecordChange:
        """The append a message reports."""
        return RecordChange(
            self._layout.job_id_from_record_subject(msg.subject), msg.metadata.sequence.stream
        )


class RecordStore:
    """Append-only per-job records on JetStream, with optimistic concurrency.

    One instance per connection is enough; it is safe to use from many tasks at once (a
    busy supervisor appends to many jobs concurrently).
    """

    def __init__(
        self,
        nc: NATS,
        *,
        writer: WriterKind,
        layout: Layout = DEFAULT_LAYOUT,
        ack_timeout_s: float = 2.0,
        read_timeout_s: float = 2.0,
        attempts: int = 3,
        max_in_flight: int = 1024,
        page_size: int = 1000,
        page_bytes: int = 8 * 1024 * 1024,
        follow_heartbeat_s: float = 2.0,
        check_reads: bool = False,
    ) -> None:
        """Use `nc` and the streams of `layout` (created beforehand by `ensure_streams`).

        Args:
            nc: a connected NATS client.
            writer: the kind of writer this store appends as (its identity's: `api`,
                `supervisor` or `notifier`); every append goes to
                `dispatch.record.<job>.<writer>`.
            layout: stream and subject names; the public contract's by default.
            ack_timeout_s: how long one publish waits for JetStream's ack, in seconds.
            read_timeout_s: how long a read waits for each reply, in seconds.
            attempts: publishes per append before giving up as `AppendOutcomeUnknown`
                (each one after a timeout or a missing stream leader).
            max_in_flight: most requests waiting for replies at once.
            page_size: most events per batch direct get.
            page_bytes: most payload bytes per batch direct get.
            follow_heartbeat_s: idle heartbeat of `follow`'s consumer, in seconds.
            check_reads: check every `read` against the stream leader's last seq of the job
                and read again while it is behind (see `read`); for a reader that acts on
                what it read, such as a supervisor pass.
        """
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self._layout = layout
        self._writer = WriterKind(writer)
        self._wire = Wire(nc, max_in_flight=max_in_flight)
        self._ack_timeout_s = ack_timeout_s
        self._read_timeout_s = read_timeout_s
        self._attempts = attempts
        self._page_size = page_size
        self._page_bytes = page_bytes
        self._follow_heartbeat_s = follow_heartbeat_s
        self._stream = layout.record_stream
        self._check_reads = check_reads
        self._batch_prefix = uuid.uuid4().hex[:16]
        self._batches = 0

    @property
    def layout(self) -> Layout:
        """The stream and subject names in use."""
        return self._layout

    @property
    def writer(self) -> WriterKind:
        """The kind of writer this store appends as."""
        return self._writer

    def _append_headers(self, job_id: str, expected_last_seq: int) -> dict[str, str]:
        """The optimistic-concurrency headers of an append: checked against the job's whole
        record (every writer's subject), not only this writer's."""
        return {
            EXPECTED_LAST_SUBJECT_SEQ: str(expected_last_seq),
            EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: self._layout.record_job_filter(job_id),
        }

    async def aclose(self) -> None:
        """Release the store's reply subscription (the connection stays open)."""
        await self._wire.close()

    # ---------------------------------------------------------------- append

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        """Append one event if the job's last seq is still `expected_last_seq`; return its
        seq (`append_outcome` without the ``fresh`` flag, which says the same errors)."""
        outcome = await self.append_outcome(
            job_id, payload, expected_last_seq=expected_last_seq, msg_id=msg_id
        )
        return outcome.seq

    async def append_outcome(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> Appended:
        """Append one event to the job's record if its last seq is still `expected_last_seq`.

        Args:
            job_id: the job (a subject-safe token).
            payload: the encoded event.
            expected_last_seq: the seq of the record's last event as the caller folded it;
                0 for the first event of a new record.
            msg_id: the event's idempotency key, unique per event (e.g. `<job>:<step key>`);
                the same msg id on a retry means the same event.

        Returns:
            The event's stream seq, and whether this request stored it just now (``fresh``);
            for a retry whose earlier try was stored, or an event another writer stored under
            the same msg id (JetStream's deduplication), that event's seq and not fresh:
            other events of the job may then lie between `expected_last_seq` and it.

        Raises:
            ConcurrencyConflict: another event was appended after `expected_last_seq` (and it
                is not this msg id's earlier try): re-read, re-fold, re-decide.
            AppendOutcomeUnknown: JetStream never answered; retry with the same msg id.
            MsgIdReused: the msg id was used by another job's event within the duplicate window.
            InvalidName: bad job id or msg id.
            PayloadTooLarge: the payload exceeds the server's max_payload.
            StreamNotFound: the record stream never answered (missing, or no leader, through
                every attempt).
            StoreUnavailable: the connection is closed.
            JetStreamApiError: JetStream refused the append for another reason.
        """
        subject = self._layout.record_subject(job_id, self._writer)
        _check_msg_id(msg_id)
        if expected_last_seq < 0:
            raise ValueError(f"expected_last_seq must be >= 0, got {expected_last_seq}")
        headers = {**self._append_headers(job_id, expected_last_seq), MSG_ID: msg_id}
        unknown = False  # an earlier try timed out: it may yet be stored
        for attempt in range(1, self._attempts + 1):
            try:
                reply = await self._wire.request(
                    "record append",
                    subject,
                    payload,
                    timeout_s=self._ack_timeout_s,
                    headers=headers,
                )
            except ReplyTimeout:
                unknown = True
                found = await self._after_timeout(job_id, expected_last_seq, [msg_id])
                if found is not None:
                    return Appended(found[msg_id], fresh=False)
                continue
            except NoResponders:
                await self._no_stream(job_id, subject, attempt, unknown, msg_id, expected_last_seq)
                continue
            ack = _decode_ack(reply)
            if ack.error is None:
                if ack.duplicate:
                    await self._check_duplicate(job_id, subject, msg_id, ack.seq)
                return Appended(ack.seq, fresh=not ack.duplicate)
            if ack.error.err_code == _ERR_WRONG_LAST_SEQ:
                [seq] = await self._resolve_conflict(job_id, expected_last_seq, ack, [msg_id])
                return Appended(seq, fresh=False)
            if ack.error.err_code == _ERR_WRONG_LAST_SEQ_IN_FLIGHT:
                await self._in_flight(job_id, attempt)
                continue
            raise api_error(
                f"job {job_id!r}: record append",
                ack.error.code,
                ack.error.err_code,
                ack.error.description,
            )
        raise AppendOutcomeUnknown(job_id, msg_id, expected_last_seq, self._attempts)

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        """Append several events at once, all or none (an atomic batch, ADR-50).

        Same rules as `append` for the whole batch: it extends the record only if its last
        seq is `expected_last_seq`; a retry (same msg ids) returns the stored seqs.

        Args:
            job_id: the job (a subject-safe token).
            payloads: the encoded events, in order (1 to `MAX_BATCH`).
            expected_last_seq: the seq of the record's last event; 0 for a new record.
            msg_ids: one unique idempotency key per event.

        Returns:
            The events' stream seqs, in order.

        Raises:
            ValueError: empty, too long, mismatched lengths or repeated msg ids.
            ConcurrencyConflict, AppendOutcomeUnknown, InvalidName, PayloadTooLarge,
            StreamNotFound, StoreUnavailable, JetStreamApiError: as for `append`.
        """
        if len(payloads) != len(msg_ids):
            raise ValueError(f"{len(payloads)} payloads but {len(msg_ids)} msg ids")
        if not 1 <= len(payloads) <= MAX_BATCH:
            raise ValueError(f"append_many takes 1..{MAX_BATCH} events, got {len(payloads)}")
        if len(set(msg_ids)) != len(msg_ids):
            raise ValueError("msg ids of one batch must be distinct")
        if len(payloads) == 1:
            return [
                await self.append(
                    job_id, payloads[0], expected_last_seq=expected_last_seq, msg_id=msg_ids[0]
                )
            ]
        subject = self._layout.record_subject(job_id, self._writer)
        for msg_id in msg_ids:
            _check_msg_id(msg_id)
        if expected_last_seq < 0:
            raise ValueError(f"expected_last_seq must be >= 0, got {expected_last_seq}")
        n = len(payloads)
        unknown = False  # an earlier try timed out: it may yet be stored
        for attempt in range(1, self._attempts + 1):
            # Unique among this store's batches (a random prefix per store, then a count):
            # no uuid4 per batch, whose urandom call showed in the supervisor's profile.
            self._batches += 1
            batch_id = f"{self._batch_prefix}{self._batches:x}"
            try:
                # The non-commit messages go without a reply (the server acks only the commit);
                # if one is lost, the commit fails as incomplete and nothing is stored.
                for i in range(n - 1):
                    headers = {_BATCH_ID: batch_id, _BATCH_SEQ: str(i + 1), MSG_ID: msg_ids[i]}
                    if i == 0:
                        headers.update(self._append_headers(job_id, expected_last_seq))
                    await self._wire.publish("record append_many", subject, payloads[i], headers)
                reply = await self._wire.request(
                    "record append_many",
                    subject,
                    payloads[-1],
                    timeout_s=self._ack_timeout_s,
                    headers={
                        _BATCH_ID: batch_id,
                        _BATCH_SEQ: str(n),
                        _BATCH_COMMIT: "1",
                        MSG_ID: msg_ids[-1],
                    },
                )
            except ReplyTimeout:
                unknown = True
                found = await self._after_timeout(job_id, expected_last_seq, msg_ids)
                if found is not None:
                    return [found[m] for m in msg_ids]
                continue
            except NoResponders:
                await self._no_stream(
                    job_id, subject, attempt, unknown, msg_ids[-1], expected_last_seq
                )
                continue
            ack = _decode_ack(reply)
            if ack.error is None:
                if ack.count != n:
                    raise StoreUnavailable(
                        f"job {job_id!r}: record append_many",
                        f"JetStream acked a batch of {ack.count}, sent {n}",
                    )
                # A batch is committed as one block: its seqs are consecutive.
                return list(range(ack.seq - n + 1, ack.seq + 1))
            if ack.error.err_code == _ERR_WRONG_LAST_SEQ:
                return await self._resolve_conflict(job_id, expected_last_seq, ack, msg_ids)
            if ack.error.err_code == _ERR_WRONG_LAST_SEQ_IN_FLIGHT:
                await self._in_flight(job_id, attempt)
                continue
            if ack.error.err_code == _ERR_BATCH_DUPLICATE_MSG_ID:
                # For a batch JetStream checks msg ids before the expected seq: a retry of a
                # stored batch lands here rather than on "wrong last sequence".
                found = await self._find(job_id, expected_last_seq, msg_ids, through=None)
                if len(found) == n:
                    return [found[m] for m in msg_ids]
            elif ack.error.err_code == _ERR_BATCH_INCOMPLETE:
                log.warning(
                    "record.append_many.incomplete",
                    extra={"job_id": job_id, "attempt": attempt, "batch_id": batch_id},
                )
                continue  # nothing was stored; send the whole batch again
            raise api_error(
                f"job {job_id!r}: record append_many",
                ack.error.code,
                ack.error.err_code,
                ack.error.description,
            )
        raise AppendOutcomeUnknown(job_id, msg_ids[-1], expected_last_seq, self._attempts)

    async def _after_timeout(
        self, job_id: str, expected: int, msg_ids: Sequence[str]
    ) -> dict[str, int] | None:
        """Resolve a publish that got no ack: it may have been stored. None if not (yet) found."""
        log.warning(
            "record.append.unknown_outcome",
            extra={"job_id": job_id, "msg_id": msg_ids[-1], "expected": expected},
        )
        try:
            found = await self._find(job_id, expected, msg_ids, through=None)
        except (StoreUnavailable, StreamNotFound):
            return None  # still no answer: try publishing again (deduplicated if it landed)
        if len(found) == len(msg_ids):
            log.info(
                "record.append.resolved",
                extra={"job_id": job_id, "msg_id": msg_ids[-1], "seq": found[msg_ids[-1]]},
            )
            return found
        return None

    async def _resolve_conflict(
        self, job_id: str, expected: int, ack: PubAck, msg_ids: Sequence[str]
    ) -> list[int]:
        """Tell a retry whose earlier try landed (return its seqs) from a lost race (raise)."""
        assert ack.error is not None
        match = _WRONG_LAST_SEQ.search(ack.error.description)
        actual = int(match.group(1)) if match else 0
        found = await self._find(job_id, expected, msg_ids, through=actual or None)
        if len(found) == len(msg_ids):
            log.info(
                "record.append.resolved",
                extra={"job_id": job_id, "msg_id": msg_ids[-1], "seq": found[msg_ids[-1]]},
            )
            return [found[m] for m in msg_ids]
        if not match:
            raise api_error(
                f"job {job_id!r}: record append",
                ack.error.code,
                ack.error.err_code,
                ack.error.description,
            )
        raise ConcurrencyConflict(job_id, expected, actual)

    async def _no_stream(
        self, job_id: str, subject: str, attempt: int, unknown: bool, msg_id: str, expected: int
    ) -> None:
        """No stream answered this try: it stored nothing. Wait (a leader may be elected), or
        give up: unknown outcome if an earlier try timed out, else no stream."""
        if attempt >= self._attempts:
            if unknown:
                raise AppendOutcomeUnknown(job_id, msg_id, expected, self._attempts)
            raise StreamNotFound(self._stream, subject)
        delay = _NO_STREAM_BACKOFF.delay(attempt, 0.0)
        log.warning(
            "record.append.no_stream",
            extra={"job_id": job_id, "attempt": attempt, "retry_in_s": delay},
        )
        await asyncio.sleep(delay)

    async def _in_flight(self, job_id: str, attempt: int) -> None:
        """The leader could not check the expected seq yet (10164): wait, then send the same
        append again (same msg ids, same expected seq: stored at most once)."""
        delay = _NO_STREAM_BACKOFF.delay(attempt, 0.0)
        log.info(
            "record.append.in_flight",
            extra={"job_id": job_id, "attempt": attempt, "retry_in_s": delay},
        )
        await asyncio.sleep(delay)

    async def _check_duplicate(self, job_id: str, subject: str, msg_id: str, seq: int) -> None:
        """JetStream deduplicated the append: make sure the original is this job's event."""
        msg = await self._wire.direct_get(
            f"job {job_id!r}: check duplicate",
            self._stream,
            {"seq": seq},
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )
        headers = (msg.headers or {}) if msg is not None else {}
        other_subject = headers.get("Nats-Subject", "")
        if other_subject != subject or headers.get(MSG_ID) != msg_id:
            raise MsgIdReused(job_id, msg_id, seq, other_subject)

    async def _find(
        self, job_id: str, after: int, msg_ids: Collection[str], *, through: int | None
    ) -> dict[str, int]:
        """Return the seqs of `msg_ids` among the job's events after seq `after` (every
        writer's: the expected seq is checked against the whole record).

        With `through` (the last seq JetStream reported for the subject), a read that did not
        reach it came from a lagging replica (direct gets may be served by followers) and is
        repeated a few times before trusting it.
        """
        found: dict[str, int] = {}
        for attempt in range(_STALE_READ_RETRIES):
            found, last_seen = await self._scan(job_id, after, msg_ids)
            if len(found) == len(msg_ids) or through is None or last_seen >= through:
                break
            await asyncio.sleep(_STALE_BACKOFF.delay(attempt + 1, 0.0))
        return found

    async def _scan(
        self, job_id: str, after: int, msg_ids: Collection[str]
    ) -> tuple[dict[str, int], int]:
        wanted = set(msg_ids)
        found: dict[str, int] = {}
        last_seen = after
        subject = self._layout.record_job_filter(job_id)
        # Only this writer's own appends can be an earlier try of this append: another kind
        # of writer's event with the same msg id is not ours to claim.
        own = self._layout.record_subject(job_id, self._writer)
        async for msgs in self._pages(subject, after, f"scan {subject!r}"):
            for msg in msgs:
                last_seen = header_int(msg, "Nats-Sequence")
                headers = msg.headers or {}
                mid = headers.get(MSG_ID)
                if mid in wanted and headers.get("Nats-Subject") == own:
                    found[mid] = last_seen
            if len(found) == len(wanted):
                break
        return found, last_seen

    # ---------------------------------------------------------------- read

    def _pages(self, subject: str, after: int, what: str) -> _PageIter:
        """Pages of the messages matching `subject` (a filter) after seq `after`."""
        return _PageIter(self, subject, after, what)

    async def read(self, job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        """Return the job's events with seq greater than `after_seq`, in order.

        One batch direct get per page (`page_size` events or `page_bytes`), paging on the
        pending count JetStream reports at the end of each batch.

        A direct get may be answered by any replica of the stream, one still catching up
        included (after a restart or a leader change), so a read may miss events the leader
        acknowledged. With `check_reads`, the leader is asked first for the job's next event
        after `after_seq` (none: the read is empty and nothing else is sent), then for its
        last seq (`leader_last_seq`), and the read is repeated, briefly, until it reaches
        it; a read that stays behind raises `StaleRead`, never returns less than what is
        stored.

        Args:
            job_id: the job.
            after_seq: return only events after this seq (0: the whole record).

        Returns:
            The events, oldest first; empty for an unknown job.

        Raises:
            InvalidName: bad job id.
            MalformedRecord: an event was appended on a subject that names no writer kind
                (naming the job and seq).
            ValueError: `after_seq` is negative.
            StreamNotFound: the record stream does not answer.
            StoreUnavailable: a reply did not come within `read_timeout_s`.
            StaleRead: with `check_reads`, the replicas answering stayed behind the leader.
        """
        subject = self._layout.record_job_filter(job_id)
        if after_seq < 0:
            raise ValueError(f"after_seq must be >= 0, got {after_seq}")
        through = 0
        if self._check_reads:
            # A caller that reads what is new after its fold mostly finds nothing: one
            # question to the leader (its next event after `after_seq`) settles that,
            # without a direct get (issue 11: one message pair per pass, not two).
            first = await self._leader_next(job_id, after_seq)
            if first is None:
                return []
            through = await self.leader_last_seq(job_id)
            if through == header_int(first, "Nats-Sequence"):
                return [self._entry(job_id, first)]  # the one new event: no direct get
        what = f"job {job_id!r}: read record"
        reached = after_seq
        for attempt in range(_STALE_READ_RETRIES + 2):
            out: list[RecordEntry] = []
            async for msgs in self._pages(subject, after_seq, what):
                out.extend(self._entry(job_id, m) for m in msgs)
            reached = out[-1].seq if out else after_seq
            if reached >= through:
                return out
            log.info(
                "record.read.stale",
                extra={"job_id": job_id, "reached": reached, "leader": through, "try": attempt},
            )
            await asyncio.sleep(_STALE_BACKOFF.delay(attempt + 1, 0.0))
        raise StaleRead(what, through, reached)

    async def scan_writer(
        self, writer: WriterKind, after_seq: int = 0
    ) -> AsyncIterator[tuple[str, RecordEntry]]:
        """Every event appended by writers of kind `writer` to any job's record, in stream
        order, with its job id: a few batch direct gets over `dispatch.record.*.<writer>`
        (e.g. every `job.created`, which the API appends, without a read per job).

        Raises:
            ValueError: `after_seq` is negative.
            StreamNotFound: the record stream does not answer.
            StoreUnavailable: a reply did not come within `read_timeout_s`.
        """
        if after_seq < 0:
            raise ValueError(f"after_seq must be >= 0, got {after_seq}")
        subject = self._layout.record_writer_filter(writer)
        async for msgs in self._pages(subject, after_seq, f"scan {subject!r}"):
            for msg in msgs:
                try:
                    job_id = self._layout.job_id_from_record_subject(
                        (msg.headers or {})["Nats-Subject"]
                    )
                except (InvalidName, KeyError):
                    continue
                yield job_id, self._entry(job_id, msg)

    async def _leader_next(self, job_id: str, after_seq: int) -> Msg | None:
        """The job's first event after `after_seq` as the stream's leader holds it (None:
        the leader holds none), asked with `STREAM.MSG.GET` `next_by_subj`.

        Raises:
            StreamNotFound, StoreUnavailable, JetStreamApiError: as `leader_last_seq`.
        """
        return await self._wire.leader_get(
            f"job {job_id!r}: leader next event",
            self._stream,
            {"seq": after_seq + 1, "next_by_subj": self._layout.record_job_filter(job_id)},
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )

    async def leader_last_seq(self, job_id: str) -> int:
        """Return the seq of the job's last event as the stream's leader holds it (0: none).

        Asked with `STREAM.MSG.GET`, which only the leader answers, so it includes every
        append JetStream acknowledged; `last_seq` (a direct get) may be answered by a
        replica that is behind.

        Raises:
            InvalidName: bad job id.
            StreamNotFound: the record stream does not exist.
            StoreUnavailable: no reply within `read_timeout_s` (no leader yet).
            JetStreamApiError: another refusal (`JetStreamTemporaryError` while electing).
        """
        subject = self._layout.record_job_filter(job_id)
        msg = await self._wire.leader_get(
            f"job {job_id!r}: leader last seq",
            self._stream,
            {"last_by_subj": subject},
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )
        return 0 if msg is None else header_int(msg, "Nats-Sequence")

    def _entry(self, job_id: str, msg: Msg) -> RecordEntry:
        """The entry of a direct-get reply.

        Raises:
            MalformedRecord: its subject names no writer kind (not appended by dispatch: the
                stream's subjects are `dispatch.record.*.*`, so anyone allowed to publish could
                use any last token); naming the job and seq, so only this job's reads fail.
        """
        headers = msg.headers or {}
        seq = int(headers["Nats-Sequence"])
        subject = headers["Nats-Subject"]
        try:
            _, writer = self._layout.parse_record_subject(subject)
        except InvalidName as err:
            raise MalformedRecord(
                job_id, seq, f"appended on {subject!r}, which names no writer kind: {err}"
            ) from err
        return RecordEntry(
            seq=seq,
            payload=msg.data,
            msg_id=headers.get(MSG_ID),
            time=parse_nats_time(headers["Nats-Time-Stamp"]),
            writer=writer,
        )

    async def last_seq(self, job_id: str) -> int:
        """Return the seq of the job's last event, 0 if it has none.

        Raises:
            InvalidName: bad job id.
            StreamNotFound: the record stream does not answer.
            StoreUnavailable: no reply within `read_timeout_s`.
        """
        subject = self._layout.record_job_filter(job_id)
        msg = await self._wire.direct_get(
            f"job {job_id!r}: last seq",
            self._stream,
            {"last_by_subj": subject},
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )
        return 0 if msg is None else header_int(msg, "Nats-Sequence")

    async def list_jobs(self) -> list[str]:
        """Return the ids of every job with a record, sorted.

        Raises:
            StreamNotFound: the record stream does not exist.
            StoreUnavailable: JetStream did not answer within `read_timeout_s`.
        """
        return sorted((await self.job_event_counts()).keys())

    async def job_event_counts(self) -> dict[str, int]:
        """Return each job's number of events, from the stream's per-subject counts (the sum
        over the job's writer subjects).

        Pages through `STREAM.INFO` with `subjects_filter` (nats-py's `stream_info` keeps
        only the first page).

        Raises:
            StreamNotFound: the record stream does not exist.
            StoreUnavailable: JetStream did not answer within `read_timeout_s`.
        """
        counts: dict[str, int] = {}
        offset = 0  # subjects seen: a job has one per writer kind that appended to it
        while True:
            info = await self._stream_info(
                {
                    "subjects_filter": self._layout.record_filter,
                    "offset": offset,
                }
            )
            subjects: dict[str, int] = (info.get("state") or {}).get("subjects") or {}
            for subject, n in subjects.items():
                try:
                    job_id = self._layout.job_id_from_record_subject(subject)
                except InvalidName:
                    # Not a job dispatch could name (a raw publish into the stream's
                    # wildcard): no job's record, and no reason to fail every job's listing.
                    log.warning("record.unnamed_subject", extra={"subject": subject})
                    continue
                counts[job_id] = counts.get(job_id, 0) + int(n)
            offset += len(subjects)
            if not subjects or offset >= int(info.get("total") or 0):
                return counts

    async def stream_last_seq(self) -> int:
        """Return the record stream's last seq (0 if empty): a start point for `follow`.

        Raises:
            StreamNotFound: the record stream does not exist.
            StoreUnavailable: JetStream did not answer within `read_timeout_s`.
        """
        info = await self._stream_info(None)
        return int((info.get("state") or {}).get("last_seq") or 0)

    async def _stream_info(self, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            return await self._wire.api(
                "record stream info",
                f"{self._layout.api_prefix}.STREAM.INFO.{self._stream}",
                body,
                timeout_s=self._read_timeout_s,
                stream=self._stream,
            )
        except JetStreamApiError as err:
            if err.err_code == 10059:
                raise StreamNotFound(self._stream, self._layout.record_filter) from err
            raise

    def follow(self, *, after_seq: int | None = None) -> RecordFeed:
        """Follow appends to every job's record: an async iterator of `RecordChange`.

        Args:
            after_seq: deliver appends with a greater stream seq (0: every event ever
                appended); None: only appends made from now on. To miss nothing between a
                start-up scan and following, take `stream_last_seq()` before the scan and
                pass it here.

        Returns:
            A feed to use as `async with store.follow(...) as changes: async for c in changes`.
        """
        if after_seq is None:
            policy, start = DeliverPolicy.NEW, None
        else:
            policy, start = DeliverPolicy.BY_START_SEQUENCE, after_seq + 1
        feed = OrderedFeed(
            self._wire.nc,
            stream=self._stream,
            filter_subject=self._layout.record_filter,
            deliver_policy=policy,
            start_seq=start,
            headers_only=True,
            heartbeat_s=self._follow_heartbeat_s,
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )
        return RecordFeed(feed, self._layout)

    def shared(
        self,
        durable: str,
        *,
        ack_wait_s: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int = 1000,
        batch: int = 64,
        from_start: bool = True,
    ) -> SharedFeed:
        """Share the appends to every job's record among replicas: each to one of them.

        A durable pull consumer named `durable` (the same in every replica), headers only:
        each `Delivery` names a job and seq; ack it when the job's pass is done.

        Args:
            durable: the consumer's name (a subject-safe token), e.g. `supervisor`.
            ack_wait_s: redeliver a message not acked within this many seconds.
            max_deliver: most deliveries of one message (-1: unlimited).
            max_ack_pending: most unacked messages over all replicas.
            batch: most messages this replica fetches at once.
            from_start: a new consumer starts at the first event (else at the next one).

        Returns:
            A feed to use as `async with store.shared("supervisor") as work: async for d in
            work`.

        Raises:
            InvalidName: `durable` is not a subject-safe token.
        """
        return SharedFeed(
            self._wire.nc,
            stream=self._stream,
            durable=durable,
            filter_subject=self._layout.record_filter,
            job_of=self._layout.job_id_from_record_subject,
            api_prefix=self._layout.api_prefix,
            ack_wait_s=ack_wait_s,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            batch=batch,
            headers_only=True,
            from_start=from_start,
            timeout_s=self._read_timeout_s,
        )


class _PageIter:
    """Pages of a subject's messages after a seq, by batch direct get."""

    def __init__(self, store: RecordStore, subject: str, after: int, what: str) -> None:
        self._store, self._subject, self._next, self._what = store, subject, after + 1, what
        self._done = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> list[Msg]:
        if self._done:
            raise StopAsyncIteration
        s = self._store
        msgs, pending = await s._wire.direct_get_batch(
            self._what,
            s._stream,
            {
                "seq": self._next,
                "next_by_subj": self._subject,
                "batch": s._page_size,
                "max_bytes": s._page_bytes,
            },
            api_prefix=s._layout.api_prefix,
            timeout_s=s._read_timeout_s,
        )
        if not msgs or pending == 0:
            self._done = True
        if msgs:
            self._next = header_int(msgs[-1], "Nats-Sequence") + 1
            return msgs
        raise StopAsyncIteration


def _decode_ack(reply: Msg) -> PubAck:
    try:
        return PUB_ACK_DECODER.decode(reply.data)
    except msgspec.DecodeError as err:
        raise StoreUnavailable("record append", f"undecodable ack {reply.data[:200]!r}") from err


def _check_msg_id(msg_id: str) -> None:
    if not _MSG_ID_RE.fullmatch(msg_id):
        raise InvalidName("msg id", str(msg_id), "use 1-256 printable ASCII characters, no spaces")

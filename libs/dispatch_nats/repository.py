"""One conversation with a job's record: load it, commit decisions, append facts.

Every service that reads a job's record, folds it and appends to it (the API, the notifier,
the supervisor) does it through a `RecordRepository`, so the rules of that conversation are
written once (the eventsourcing library's repository; STYLE.md "Three copies of one
conversation"):

* **Load, incremental.** `load(job_id, prior=job)` reads only the events after `job.seq`
  and folds them onto it (`fold(..., prior=job)`); without `prior` the whole record. An
  event that doesn't decode, or that its writer kind may not write, raises the core's
  `MalformedRecord` naming the job and the seq: that job's problem, never another job's
  (issue 10, "Poison contained").
* **Commit decisions.** `decide(job_id, decide_fn)` loads (or takes the caller's load), asks
  `decide_fn` what to commit on that version, and appends it all or none with
  `Nats-Expected-Last-Subject-Sequence` = the version's last seq (the contract's optimistic
  concurrency, `RecordStore.append_many`). A `ConcurrencyConflict` (another writer got there
  first) re-loads what is new and asks `decide_fn` again: a stale decision is never
  appended. Bounded: `conflict_tries` lost races raise `TooManyConflicts`.
* **Append facts.** `append_fact(job, msg_id, event)` appends what an action found over
  whatever the record holds now: on a conflict it re-loads and appends the same fact again
  on the new last seq, without re-deciding (a fact stays true whatever was appended
  meanwhile). A fact the record already holds (`redundant`), or one the record's own `fold`
  now refuses (moot: another writer recorded it in another form), is not appended.
* **Unknown outcomes.** An append whose ack was lost (`AppendOutcomeUnknown`; or the store
  unreachable, no stream leader, JetStream "temporarily unavailable") may have been stored.
  The repository finds out by reading the record after the expected seq and looking for the
  append's msg ids among this writer's events; found, it is the commit's result; not found,
  the same append (same msg ids, same expected seq: JetStream stores it at most once) is
  sent again after a pause from `dispatch_core.backoff`, for up to `unknown_for_s` seconds,
  then the error is raised (retryable: the caller tries later with the same msg ids).

**Msg ids.** A fact's msg id is derived from what it records, so two writers of the same
fact store it once. A decision's must be unique to the writer *instance* (the supervisor adds
its replica's token): two replicas deciding the same step on the same version must not share
a msg id, or the one that lost the race would find the winner's append and take it for its
own (and, say, launch the same attempt a second time); with distinct ids it gets a plain
conflict and decides again.

The store is any `RecordPort` (`RecordStore` in production, the in-memory fake of the
contract suite in `tests/`); `tests/integration/nats/test_record_repository.py` runs the same
suite on both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import ClassVar, Final, NamedTuple, Protocol, TypeVar

import msgspec

from dispatch_core import (
    DispatchError,
    Job,
    JobEvent,
    MalformedRecord,
    RecordItem,
    WriterKind,
    WriterRefused,
    decode_record_event,
    encode,
    event_tag,
    fold,
    writers_of,
)
from dispatch_core.backoff import Backoff
from dispatch_nats.errors import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    JetStreamTemporaryError,
    NatsStoreError,
    StoreUnavailable,
    StreamNotFound,
)
from dispatch_nats.record import Appended, RecordEntry

__all__ = [
    "UNKNOWN_BACKOFF",
    "Change",
    "Committed",
    "Decide",
    "FactAppended",
    "Loaded",
    "RecordPort",
    "RecordRepository",
    "StoredEvent",
    "TooManyConflicts",
    "UnfoldableDecision",
    "record_items",
]

log = logging.getLogger("dispatch_nats.repository")

T = TypeVar("T")

UNKNOWN_BACKOFF: Final = Backoff(base_s=0.2, max_s=5.0, jitter=0.0)
"""Pauses between tries of an append whose outcome is unknown or whose stream has no leader."""

_UNKNOWN: Final = (AppendOutcomeUnknown, StoreUnavailable, StreamNotFound, JetStreamTemporaryError)
"""What an append may raise when it may or may not have been stored, or could not be sent
yet: the same append, sent again with the same msg ids, is stored at most once."""


class RecordPort(Protocol):
    """Each job's append-only record, as `RecordStore` keeps it (the repository's store)."""

    async def read(self, job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        """Return the job's events after `after_seq`, oldest first (empty: none)."""
        ...

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        """Append one event if the record's last seq is `expected_last_seq`; return its seq
        (a retry of a stored append, same msg id, returns the stored seq).

        Raises:
            ConcurrencyConflict: another event was appended first.
            AppendOutcomeUnknown: no answer; it may be stored.
        """
        ...

    async def append_outcome(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> Appended:
        """`append`, also saying whether this request stored the event just now (else an
        earlier copy with the msg id was found: other events may lie before it)."""
        ...

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        """Append several events, all or none, as `append` does one.

        Raises:
            ConcurrencyConflict: another event was appended first.
            AppendOutcomeUnknown: no answer; they may be stored.
        """
        ...


class TooManyConflicts(NatsStoreError):
    """Other writers kept extending a job's record faster than this writer could decide (or
    append a fact) on it. Retryable: the same work, tried later, may win."""

    retryable: ClassVar[bool] = True

    def __init__(self, job_id: str, tries: int, what: str) -> None:
        super().__init__(
            f"job {job_id!r}: {what} lost the race to other writers {tries} times in a row; "
            "try again later"
        )
        self.job_id, self.tries, self.what = job_id, tries, what


class UnfoldableDecision(NatsStoreError):
    """Decided events would not fold onto the version they were decided on (a bug of the
    decider: nothing was appended). Not `MalformedRecord`, which says the *stored* record
    can't be read: a caller tells its poison from its own bug. The core's refusal is the
    cause (`__cause__`)."""

    def __init__(self, job_id: str, seq: int, error: Exception) -> None:
        super().__init__(
            f"job {job_id!r}: the decided events would not fold onto seq {seq}, so they were "
            f"not appended (a bug of the decider): {error}"
        )
        self.job_id, self.seq = job_id, seq


class Change(NamedTuple):
    """One event to append, with its `Nats-Msg-Id` (unique per event; the same on a retry)."""

    msg_id: str
    event: JobEvent


class Loaded(NamedTuple):
    """A job's record folded to `job.seq`, and the entries this load read to get there."""

    job: Job
    """The job folded to its record's last seq as read."""
    entries: tuple[RecordEntry, ...]
    """The entries read by this load: after the prior's seq (all of them without a prior);
    empty when nothing was new. Their msg ids say who appended what (the API finds its own
    earlier commits by them)."""


class StoredEvent(NamedTuple):
    """One event of a record as stored and decoded (see `RecordRepository.events`)."""

    entry: RecordEntry
    event: JobEvent

    @property
    def item(self) -> RecordItem:
        """The event as `fold` takes it: `(seq, event, writer)`."""
        return (self.entry.seq, self.event, self.entry.writer)


class Committed(NamedTuple):
    """What `decide` (or `commit`) did."""

    loaded: Loaded | None
    """The version the decision was made on (None: the job had no record)."""
    job: Job | None
    """The job after the commit (the loaded one when nothing was committed)."""
    events: tuple[tuple[int, JobEvent], ...]
    """The events committed with their stored seqs, in order (empty: nothing to commit)."""

    @property
    def seqs(self) -> list[int]:
        """The stored seqs of the committed events."""
        return [seq for seq, _ in self.events]


class FactAppended(NamedTuple):
    """What `append_fact` did."""

    job: Job
    """The job as this writer now knows it (with the fact, if appended)."""
    seq: int | None
    """The fact's seq if this call appended it; None if the record already held it (or
    something that makes it moot)."""


Decide = Callable[[Loaded | None], Awaitable[Sequence[Change]]]
"""Decide on a loaded version of the record (None: no record yet): the changes to commit,
empty for none. Called again on the re-loaded record after every lost race; raise to
refuse (the exception goes to the caller of `decide`)."""


def record_items(job_id: str, entries: Iterable[RecordEntry]) -> list[RecordItem]:
    """Decode `job_id`'s stored events into `(seq, event, writer)` items for `fold`.

    Raises:
        UndecodableEvent: an event doesn't decode; names the job and its seq (a
            `MalformedRecord`: that job's record is unreadable, no other job's).
    """
    return [
        (e.seq, decode_record_event(e.payload, job_id=job_id, seq=e.seq), e.writer) for e in entries
    ]


class RecordRepository:
    """Load, commit and append facts on jobs' records for one writer kind (module docstring).

    Safe to use from many tasks at once; it keeps no per-job state (its callers keep the
    jobs they loaded and pass them back as `prior`).
    """

    def __init__(
        self,
        store: RecordPort,
        *,
        writer: WriterKind,
        clock: Callable[[], datetime],
        conflict_tries: int = 20,
        unknown_for_s: float = 60.0,
        backoff: Backoff = UNKNOWN_BACKOFF,
        on_conflict: Callable[[str], None] | None = None,
    ) -> None:
        """Use `store`, appending as `writer`.

        Args:
            store: the record store (`RecordStore` built with the same `writer`).
            writer: the writer kind of this service's appends: events are folded as written
                by it, and only its own events can be an earlier try of its appends.
            clock: the time of a read (passed to `fold`), timezone-aware.
            conflict_tries: most lost races of one `decide` or `append_fact` before
                `TooManyConflicts`.
            unknown_for_s: seconds an append whose outcome stays unknown is tried again
                before its error is raised.
            backoff: the pauses between those tries (no jitter needed: the same msg ids).
            on_conflict: told of each lost race (`"decision"` or `"fact"`), e.g. to count it.

        Raises:
            ValueError: `conflict_tries` < 1 or `unknown_for_s` < 0.
        """
        if conflict_tries < 1:
            raise ValueError(f"conflict_tries must be >= 1, got {conflict_tries}")
        if unknown_for_s < 0:
            raise ValueError(f"unknown_for_s must be >= 0, got {unknown_for_s}")
        self._store = store
        self._writer = WriterKind(writer)
        self._clock = clock
        self._conflict_tries = conflict_tries
        self._unknown_for_s = unknown_for_s
        self._backoff = backoff
        self._on_conflict = on_conflict

    @property
    def writer(self) -> WriterKind:
        """The writer kind this repository appends as."""
        return self._writer

    # ------------------------------------------------------------------------- load

    async def load(self, job_id: str, prior: Job | None = None) -> Loaded | None:
        """Return the job's record folded to its end, reading only what is after `prior`.

        Args:
            job_id: the job.
            prior: the job as folded earlier (from this record): only the events after
                `prior.seq` are read and folded onto it.

        Returns:
            The job and the entries read; None when the job has no record (and no `prior`).

        Raises:
            MalformedRecord: an event doesn't decode, its writer may not write it, or the
                history is malformed (naming the job and seq).
            NatsStoreError: the read failed (`StaleRead`, `StoreUnavailable`, ...).
        """
        entries = await self._store.read(job_id, 0 if prior is None else prior.seq)
        if not entries:
            return None if prior is None else Loaded(prior, ())
        job = fold(record_items(job_id, entries), self._clock(), prior=prior)
        return Loaded(job, tuple(entries))

    async def events(self, job_id: str, after_seq: int = 0) -> list[StoredEvent]:
        """Return the job's events after `after_seq`, decoded, each refused if its writer
        kind may not write it (what `fold` refuses), without folding: for a reader that
        shows a part of the record.

        Raises:
            MalformedRecord: `UndecodableEvent` or `WriterRefused`, naming the job and seq.
            NatsStoreError: the read failed.
        """
        out: list[StoredEvent] = []
        for entry in await self._store.read(job_id, after_seq):
            event = decode_record_event(entry.payload, job_id=job_id, seq=entry.seq)
            allowed = writers_of(event)
            if entry.writer not in allowed:
                kinds = tuple(sorted(str(k) for k in allowed))
                raise WriterRefused(job_id, entry.seq, event_tag(event), str(entry.writer), kinds)
            out.append(StoredEvent(entry, event))
        return out

    # --------------------------------------------------------------------- decisions

    async def decide(
        self, job_id: str, decide: Decide, *, loaded: Loaded | None = None
    ) -> Committed:
        """Decide on the record and commit the decision; on a lost race, re-load and decide
        again (at most `conflict_tries` times).

        Args:
            job_id: the job.
            decide: what to commit on a version (see `Decide`).
            loaded: the version to decide on first (the caller's own load); None reads it.

        Returns:
            What was committed (nothing if `decide` returned no change).

        Raises:
            TooManyConflicts: every try lost a race.
            MalformedRecord: the record can't be read.
            UnfoldableDecision: the decided events would not fold onto the record (a bug:
                nothing is appended).
            AppendOutcomeUnknown, StoreUnavailable, StreamNotFound, JetStreamTemporaryError:
                the outcome stayed unknown for `unknown_for_s` (retry with the same msg ids).
            Whatever `decide` raises.
        """
        current = loaded if loaded is not None else await self.load(job_id)
        for _ in range(self._conflict_tries):
            changes = await decide(current)
            if not changes:
                return Committed(current, None if current is None else current.job, ())
            try:
                return await self.commit(job_id, current, changes)
            except ConcurrencyConflict as err:
                self._conflict("decision", job_id, err)
                current = await self.load(job_id, None if current is None else current.job)
        raise TooManyConflicts(job_id, self._conflict_tries, "a decision")

    async def commit(
        self, job_id: str, loaded: Loaded | None, changes: Sequence[Change]
    ) -> Committed:
        """Append `changes`, all or none, over the version `loaded` (one try: a lost race is
        the caller's to re-decide; `decide` does that).

        Raises:
            ConcurrencyConflict: another writer extended the record after `loaded`.
            UnfoldableDecision: the events would not fold onto `loaded` (nothing is appended).
            AppendOutcomeUnknown, StoreUnavailable, StreamNotFound, JetStreamTemporaryError:
                the outcome stayed unknown for `unknown_for_s`.
        """
        prior = None if loaded is None else loaded.job
        base = 0 if prior is None else prior.seq
        events = [c.event for c in changes]
        try:
            # Refuse to write a record dispatch's own fold would reject.
            folded = fold(
                ((base + i + 1, e, self._writer) for i, e in enumerate(events)),
                self._clock(),
                prior=prior,
            )
        except DispatchError as err:
            log.exception("repository.malformed_decision", extra={"job_id": job_id})
            raise UnfoldableDecision(job_id, base, err) from err
        payloads = [encode(e) for e in events]
        msg_ids = [c.msg_id for c in changes]
        seqs = await self._until_known(
            job_id,
            base,
            msg_ids,
            lambda: self._store.append_many(
                job_id, payloads, expected_last_seq=base, msg_ids=msg_ids
            ),
        )
        # A Job holds no seq but its last one: the fold above, with the stored last seq.
        job = msgspec.structs.replace(folded, seq=seqs[-1])
        return Committed(loaded, job, tuple(zip(seqs, events, strict=True)))

    # -------------------------------------------------------------------------- facts

    async def append_fact(
        self,
        job: Job,
        msg_id: str,
        event: JobEvent,
        *,
        redundant: Callable[[Job, JobEvent], bool] | None = None,
    ) -> FactAppended:
        """Append a fact over whatever the record holds now (re-loading after a lost race),
        unless the record already holds it.

        Args:
            job: the job as the caller last loaded it.
            msg_id: the fact's msg id (derived from its step, so two writers of the same
                fact store it once).
            event: the fact.
            redundant: whether a version of the job already holds what `event` says (e.g.
                another writer recorded the delivery); checked before every try.

        Returns:
            The job as now known, and the fact's seq if this call appended it.

        Raises:
            TooManyConflicts: every try lost a race.
            MalformedRecord: a re-load found the record unreadable.
            AppendOutcomeUnknown, StoreUnavailable, StreamNotFound, JetStreamTemporaryError:
                the outcome stayed unknown for `unknown_for_s`.
        """
        job_id = job.job_id
        current = job
        payload = encode(event)
        for _ in range(self._conflict_tries):
            if redundant is not None and redundant(current, event):
                return FactAppended(current, None)
            try:
                folded = fold(((current.seq + 1, event, self._writer),), event.at, prior=current)
            except MalformedRecord as err:
                log.info(
                    "repository.fact_moot",
                    extra={"job_id": job_id, "fact": type(event).__name__, "why": str(err)},
                )
                return FactAppended(current, None)
            expected = current.seq
            fresh = False

            async def append(expected: int = expected) -> list[int]:
                nonlocal fresh
                outcome = await self._store.append_outcome(
                    job_id, payload, expected_last_seq=expected, msg_id=msg_id
                )
                fresh = outcome.fresh
                return [outcome.seq]

            try:
                [seq] = await self._until_known(job_id, expected, [msg_id], append)
            except ConcurrencyConflict as err:
                self._conflict("fact", job_id, err)
                current = await self._reload(job_id, current)
                continue
            if seq <= expected:
                # JetStream deduplicated it against an earlier try stored before `job`: the
                # record, and so `current`, already holds it.
                return FactAppended(current, None)
            if fresh:
                return FactAppended(msgspec.structs.replace(folded, seq=seq), seq)
            # Found, not stored now: an earlier try whose ack was lost, or the same fact
            # another replica stored (facts share msg ids across replicas). Other events may
            # lie between `expected` and it, so the job is read again rather than assumed.
            return FactAppended(await self._reload(job_id, current), seq)
        raise TooManyConflicts(job_id, self._conflict_tries, f"fact {msg_id!r}")

    async def _reload(self, job_id: str, job: Job) -> Job:
        loaded = await self.load(job_id, job)
        assert loaded is not None  # a prior was given
        return loaded.job

    def _conflict(self, what: str, job_id: str, err: ConcurrencyConflict) -> None:
        log.info(
            "repository.conflict",
            extra={"job_id": job_id, "what": what, "expected": err.expected, "actual": err.actual},
        )
        if self._on_conflict is not None:
            self._on_conflict(what)

    # ---------------------------------------------------------------- unknown outcomes

    async def _until_known(
        self,
        job_id: str,
        expected: int,
        msg_ids: Sequence[str],
        append: Callable[[], Awaitable[list[int]]],
    ) -> list[int]:
        """Run `append` until its outcome is known: stored (its seqs), or a conflict.

        After an unknown outcome, read the record after `expected`: this writer's events
        with the append's msg ids there are the append, stored (its ack was lost). Else send
        it again after a pause (same msg ids and expected seq: stored at most once), for up
        to `unknown_for_s` seconds.

        Raises:
            ConcurrencyConflict: another writer extended the record first.
            AppendOutcomeUnknown, StoreUnavailable, StreamNotFound, JetStreamTemporaryError:
                still unknown after `unknown_for_s`.
        """
        deadline = time.monotonic() + self._unknown_for_s
        delays = self._backoff.delays()
        while True:
            try:
                return await append()
            except _UNKNOWN as err:
                delay = next(delays)
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "repository.append_unknown",
                    extra={
                        "job_id": job_id,
                        "msg_id": msg_ids[-1],
                        "expected": expected,
                        "error": str(err),
                        "retry_in_s": delay,
                    },
                )
                await asyncio.sleep(delay)
                found = await self._landed(job_id, expected, msg_ids)
                if found is not None:
                    return found

    async def _landed(self, job_id: str, expected: int, msg_ids: Sequence[str]) -> list[int] | None:
        """Return the seqs of `msg_ids` if this writer's events after `expected` hold them
        all (the append landed), else None (not yet, or the read failed too)."""
        try:
            entries = await self._store.read(job_id, expected)
        except _UNKNOWN:
            return None
        wanted = set(msg_ids)
        found = {
            e.msg_id: e.seq
            for e in entries
            if e.msg_id in wanted and e.writer == self._writer and e.msg_id is not None
        }
        if len(found) != len(wanted):
            return None
        log.info(
            "repository.append_resolved",
            extra={"job_id": job_id, "msg_id": msg_ids[-1], "seq": found[msg_ids[-1]]},
        )
        return [found[m] for m in msg_ids]

"""The jobs index: every job's Status head, kept in the API process; the one source of
``GET /v1/jobs`` and of the web page's jobs list (services/api/web).

Built once by a scan (every published Status; each record that is ahead of its Status, or
has none, is folded: a job without a Status is projected, one whose record can't be read is
listed apart and its Status marked stale), then kept current by two feeds started *before*
the scan, so nothing written meanwhile is missed:

* the Status feed (every put to the status stream): the newest Status head per job;
* the record feed (headers only, from the record stream's last seq before the scan): which
  jobs' records went past their Status (a job just submitted, a command just committed, an
  event that can't be read). Those are folded at the next listing (the fold cache makes that
  O(new events)), so a new job is listed at once and an unreadable record is named.

Each listing first asks both streams for their last seq (two small requests) and waits until
both feeds have delivered that far: a listing shows everything written before it was asked
(a caller reads its own writes). The feeds are JetStream ordered consumers (they re-create
themselves after a gap and across reconnects and server restarts); if one fails anyway, or
does not catch up within ``catch_up_s``, the index is built again by the next listing.

What never changes of a job (cluster, creation time, checkpoint root: ``job.created``) is
kept per job once known: from any fold the index or the API makes, the cluster also from the
jobs' Discoveries (keyed by cluster) and Status objects; for the rows of a page that don't
have it yet, the record is folded once. A listing is then a filter and a slice in memory,
not a read per job (bench/web_jobs.py).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from datetime import datetime
from typing import Final, Literal, Protocol, TypeVar

import msgspec
from multidict import MultiMapping

from dispatch_core import (
    DecodeError,
    Job,
    JobCreated,
    State,
    Status,
    WriterKind,
    decode,
    decode_event,
    is_job_id,
)
from dispatch_nats import (
    LatestEntry,
    LatestStore,
    NatsStoreError,
    RecordStore,
)
from services.api.errors import BadRequest, UnreadableRecord
from services.api.query import query_int
from services.api.schemas import JobList, JobSummary, UnreadableJob

__all__ = ["LISTING_PARAMS", "MAX_OFFSET", "JobFacts", "JobIndex", "ListingQuery", "parse_listing"]

log = logging.getLogger("services.api.jobindex")

T = TypeVar("T")
R = TypeVar("R")
F = TypeVar("F")
F_co = TypeVar("F_co", covariant=True)


class _Feed(Protocol[F_co]):
    """A store's feed (``LatestFeed``, ``RecordFeed``): its items, then closed."""

    def __aiter__(self) -> AsyncIterator[F_co]: ...

    async def aclose(self) -> None: ...


class JobFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What never changes of a job after creation (its ``job.created``)."""

    cluster: str
    created_at: datetime
    checkpoint: str | None


def facts_of(job: Job) -> JobFacts:
    """The facts of a folded record."""
    return JobFacts(
        cluster=job.spec.cluster, created_at=job.created_at, checkpoint=job.spec.checkpoint
    )


class JobIndex:
    """Every job's Status head, current to the last listing (module docstring)."""

    def __init__(
        self,
        *,
        records: RecordStore,
        statuses: LatestStore,
        discoveries: LatestStore,
        load: Callable[[str], Awaitable[Job | None]],
        project: Callable[[Job], Awaitable[Status]],
        configured: Collection[str] = (),
        concurrency: int = 32,
        catch_up_s: float = 5.0,
    ) -> None:
        """Index the jobs of these stores.

        Args:
            records, statuses, discoveries: the API's stores (their connection stays the
                caller's).
            load: fold a job's record to its end (None: no record); raises
                :class:`UnreadableRecord` for a record that can't be read.
            project: the Status of a folded record (with its latest Discovery, now).
            configured: the clusters the API is configured with (a listing by any other
                cluster, unless a job is on it, is refused).
            concurrency: most records folded at once.
            catch_up_s: seconds a listing waits for the feeds to reach the streams' last
                seqs before building the index again.
        """
        self._records = records
        self._statuses = statuses
        self._discoveries = discoveries
        self._load_job = load
        self._project = project
        self._configured = frozenset(configured)
        self._concurrency = concurrency
        self._catch_up_s = catch_up_s
        self._lock = asyncio.Lock()
        self._moved = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._facts: dict[str, JobFacts] = {}  # never changes: survives a rebuild
        self.builds = 0
        """How many times the index was built (once, plus once per feed failure)."""
        self._reset()

    def _reset(self) -> None:
        self._built = False
        self._failed_at: float | None = None
        self._jobs: dict[str, JobSummary] = {}
        self._ids: list[str] | None = None
        self._stale: set[str] = set()
        self._unreadable: dict[str, UnreadableJob] = {}
        self._last: dict[str, int] = {}
        self._checked: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._projected: set[str] = set()
        self._clusters: dict[str, str] = {}
        self._seen = {"status": 0, "record": 0}  # the stream seqs each feed reached

    # -------------------------------------------------------------------- what is known

    def learn(self, job: Job) -> None:
        """Note a fold made elsewhere in the API (its facts; the record read through it)."""
        self._facts[job.job_id] = facts_of(job)

    def _put(self, summary: JobSummary) -> None:
        old = self._jobs.get(summary.job_id)
        if old is None or (summary.seq, summary.at) >= (old.seq, old.at):
            if old is None:
                self._ids = None
            self._jobs[summary.job_id] = summary
        if summary.seq >= self._last.get(summary.job_id, 0):
            self._dirty.discard(summary.job_id)

    def _on_status(self, entry: LatestEntry) -> int:
        try:
            status = decode(entry.payload, Status)
        except DecodeError:
            log.warning("status.undecodable", extra={"seq": entry.seq}, exc_info=True)
            return entry.seq
        for ref in status.objects[:1]:
            self._clusters.setdefault(status.job_id, ref.cluster)
        self._projected.discard(status.job_id)
        if status.job_id in self._unreadable:
            self._stale.add(status.job_id)  # published from before the unreadable event
        self._put(JobSummary.of(status))
        return entry.seq

    def _on_append(self, job_id: str, seq: int) -> int:
        if seq > self._last.get(job_id, 0):
            self._last[job_id] = seq
        known = self._jobs.get(job_id)
        if known is None or known.seq < seq:
            self._dirty.add(job_id)
        return seq

    # ---------------------------------------------------------------------------- feeds

    def _feed_failed(self) -> bool:
        return self._failed_at is not None

    async def _failed(self, what: str, err: BaseException | None) -> None:
        log.warning("jobindex.feed_ended", extra={"feed": what, "error": repr(err)})
        async with self._moved:
            self._failed_at = time.monotonic()
            self._moved.notify_all()

    async def _follow(
        self, what: Literal["status", "record"], feed: _Feed[F], take: Callable[[F], int]
    ) -> None:
        """Take each item of ``feed`` into the index (``take`` returns its stream seq, now
        seen); when the feed ends or fails, say so, so the next listing builds again."""
        err: BaseException | None = None
        try:
            async for item in feed:
                seq = take(item)
                async with self._moved:
                    self._seen[what] = max(self._seen[what], seq)
                    self._moved.notify_all()
        except NatsStoreError as exc:
            err = exc
        finally:
            with contextlib.suppress(NatsStoreError):
                await feed.aclose()
        await self._failed(what, err)

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, NatsStoreError):
                await task

    async def aclose(self) -> None:
        """Stop following (at the API's shutdown)."""
        await self._stop()

    # ---------------------------------------------------------------------------- build

    async def _bounded(self, items: Sequence[T], fn: Callable[[T], Awaitable[R]]) -> list[R]:
        slots = asyncio.Semaphore(self._concurrency)

        async def one(item: T) -> R:
            async with slots:
                return await fn(item)

        return list(await asyncio.gather(*(one(i) for i in items)))

    async def _fold(self, job_id: str) -> Job | None:
        """Fold one record; one that can't be read is listed apart (None)."""
        try:
            job = await self._load_job(job_id)
        except UnreadableRecord as err:
            self._unreadable[job_id] = UnreadableJob(
                job_id=job_id, seq=err.seq or 0, message=err.message
            )
            if job_id in self._jobs:
                self._stale.add(job_id)
            self._dirty.discard(job_id)
            return None
        if job is not None:
            self._facts[job_id] = facts_of(job)
            self._checked[job_id] = max(self._checked.get(job_id, 0), job.seq)
        return job

    async def _catch_up(self, job_id: str) -> None:
        """Fold a record that went past its Status: project it when it has no Status."""
        job = await self._fold(job_id)
        if job is None:
            return
        if job_id not in self._jobs or job_id in self._projected:
            # No Status published yet: the API's own projection stands for it, made again
            # from each new event until the supervisor publishes one.
            self._projected.add(job_id)
            self._put(JobSummary.of(await self._project(job)))
        if self._checked.get(job_id, 0) >= self._last.get(job_id, 0):
            self._dirty.discard(job_id)

    async def _build(self) -> None:
        await self._stop()
        self._reset()
        self.builds += 1
        # Follow first, then scan: nothing written during the scan is missed.
        changes = self._statuses.watch((), initial=False)
        await changes.__aenter__()
        self._tasks.append(asyncio.create_task(self._follow("status", changes, self._on_status)))
        status_last, record_last = await asyncio.gather(
            self._statuses.stream_last_seq(), self._records.stream_last_seq()
        )
        self._seen = {"status": status_last, "record": record_last}
        appends = self._records.follow(after_seq=record_last)
        await appends.__aenter__()
        follow = self._follow("record", appends, lambda change: self._on_append(*change))
        self._tasks.append(asyncio.create_task(follow))
        entries, ids, observed, _ = await asyncio.gather(
            self._statuses.get_all(),
            self._records.list_jobs(),
            self._discoveries.get_all(),
            self._scan_created(),
        )
        for seen in observed:
            self._clusters.setdefault(seen.key[-1], seen.key[0])
        for entry in entries:
            self._on_status(entry)

        async def last_of(job_id: str) -> None:
            last = await self._records.last_seq(job_id)
            self._on_append(job_id, last)

        await self._bounded([j for j in ids if j in self._jobs], last_of)
        self._dirty.update(j for j in ids if j not in self._jobs)
        await self._bounded(sorted(self._dirty), self._catch_up)
        self._built = True

    async def _scan_created(self) -> None:
        """Learn every job's facts from the ``job.created`` events the API appended: a few
        batch reads of the API's appends, not a read per job."""
        async for job_id, entry in self._records.scan_writer(WriterKind.API):
            if job_id in self._facts:
                continue
            try:
                event = decode_event(entry.payload)
            except DecodeError:
                continue  # that job's reads name it; its facts are read when shown
            if isinstance(event, JobCreated):
                self._facts[job_id] = JobFacts(
                    cluster=event.spec.cluster,
                    created_at=event.at,
                    checkpoint=event.spec.checkpoint,
                )

    async def warm(self) -> None:
        """Build the index ahead of the first listing (at the API's start); a failure is
        logged, and the next listing builds it again."""
        try:
            await self._current()
        except NatsStoreError as err:
            log.warning("jobindex.warm_failed", extra={"error": str(err)})

    async def _current(self) -> None:
        """Build if needed, then wait until the feeds reach the streams' last seqs and fold
        what went past its Status.

        Raises:
            NatsStoreError: the stores didn't answer (a 503 or 500).
        """
        async with self._lock:
            if not self._built or self._feed_failed():
                await self._build()
                return
            status_last, record_last = await asyncio.gather(
                self._statuses.stream_last_seq(), self._records.stream_last_seq()
            )

            def reached() -> bool:
                return self._feed_failed() or (
                    self._seen["status"] >= status_last and self._seen["record"] >= record_last
                )

            try:
                async with self._moved:
                    await asyncio.wait_for(self._moved.wait_for(reached), self._catch_up_s)
            except TimeoutError:
                log.warning(
                    "jobindex.behind",
                    extra={
                        "status_seen": self._seen["status"],
                        "status_last": status_last,
                        "record_seen": self._seen["record"],
                        "record_last": record_last,
                    },
                )
                await self._build()
                return
            if self._feed_failed():  # while waiting
                await self._build()
                return
            await self._bounded(sorted(self._dirty), self._catch_up)

    # -------------------------------------------------------------------------- reading

    def _sorted(self) -> list[str]:
        if self._ids is None:
            self._ids = sorted(self._jobs)
        return self._ids

    def cluster_known(self, job_id: str) -> str | None:
        """The job's cluster if the index knows it without reading."""
        facts = self._facts.get(job_id)
        return facts.cluster if facts is not None else self._clusters.get(job_id)

    async def rows(
        self, states: Collection[State] | None = None, clusters: Collection[str] | None = None
    ) -> tuple[list[JobSummary], tuple[UnreadableJob, ...]]:
        """The jobs in ``states`` (None: all) on ``clusters`` (None: all), by id, without
        their facts (:meth:`with_facts`); and every job whose record can't be read. A job is
        on the cluster it was submitted to and on its current submission's (after a failover,
        issue 14 part 2: ``lab2->local`` lists under both).

        Raises:
            BadRequest: a cluster that is neither configured nor any job's (code
                ``unknown-cluster``, field ``cluster``), as a submission naming it is refused.
            NatsStoreError: the stores didn't answer.
        """
        await self._current()
        if clusters:
            await self._refuse_unknown(clusters)
        rows = [self._jobs[j] for j in self._sorted()]
        if states:
            rows = [r for r in rows if r.state in states]
        if clusters:
            unknown = [r.job_id for r in rows if self.cluster_known(r.job_id) is None]
            await self._bounded(unknown, self._fold)
            rows = [
                r
                for r in rows
                if self.cluster_known(r.job_id) in clusters or r.current_cluster in clusters
            ]
        rows = [
            msgspec.structs.replace(r, unreadable=True) if r.job_id in self._stale else r
            for r in rows
        ]
        unreadable = tuple(self._unreadable[j] for j in sorted(self._unreadable))
        return rows, unreadable

    async def _refuse_unknown(self, clusters: Collection[str]) -> None:
        """Refuse a listing by a cluster neither configured nor any job's: a typo would
        otherwise list no jobs, as if the cluster had none. A cluster dropped from the
        configuration is still known while jobs of it remain (their records say so; the
        jobs whose cluster isn't known yet are folded, only on this path)."""
        strange = set(clusters) - self._configured
        if not strange:
            return
        await self._bounded([j for j in self._jobs if self.cluster_known(j) is None], self._fold)
        held = {c for c in map(self.cluster_known, self._jobs) if c is not None}
        strange -= held
        if strange:
            names = ", ".join(repr(c) for c in sorted(strange))
            known = ", ".join(sorted(self._configured | held)) or "none is configured"
            raise BadRequest(
                f"unknown cluster{'s' if len(strange) > 1 else ''} {names} (known: {known})",
                code="unknown-cluster",
                field="cluster",
            )

    async def facts(self, job_id: str) -> JobFacts | None:
        """The job's facts (its record folded once, the first time they are asked for);
        None for a job without a readable record."""
        if job_id not in self._facts:
            await self._fold(job_id)
        return self._facts.get(job_id)

    async def with_facts(self, rows: Sequence[JobSummary]) -> list[JobSummary]:
        """``rows`` with their cluster, creation time and checkpoint root (a job's record is
        folded once, the first time it is shown)."""
        await self._bounded([r.job_id for r in rows if r.job_id not in self._facts], self._fold)
        out = []
        for r in rows:
            facts = self._facts.get(r.job_id)
            if facts is None:
                out.append(msgspec.structs.replace(r, cluster=self.cluster_known(r.job_id)))
                continue
            out.append(
                msgspec.structs.replace(
                    r,
                    cluster=facts.cluster,
                    created_at=facts.created_at,
                    checkpoint=facts.checkpoint,
                )
            )
        return out

    async def page(
        self,
        *,
        states: Collection[State] | None = None,
        clusters: Collection[str] | None = None,
        after: str | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> JobList:
        """One page of the listing (:class:`JobList`): the jobs matching ``states`` and
        ``clusters`` with an id greater than ``after``, from ``offset``, at most ``limit``.

        Raises:
            NatsStoreError: the stores didn't answer.
        """
        rows, unreadable = await self.rows(states, clusters)
        if after is not None:
            rows = rows[bisect.bisect_right([r.job_id for r in rows], after) :]
        end = len(rows) if limit is None else offset + limit
        page = await self.with_facts(rows[offset:end])
        return JobList(
            jobs=tuple(page),
            unreadable=unreadable,
            total=len(rows),
            offset=offset,
            limit=limit,
            next_after=page[-1].job_id if page and end < len(rows) else None,
        )


# ------------------------------------------------------------------------ the query


class ListingQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The jobs listing's query (``GET /v1/jobs``, and the web page's ``/ui/api/jobs``)."""

    states: frozenset[State] | None = None
    clusters: frozenset[str] | None = None
    after: str | None = None
    offset: int = 0
    limit: int | None = None


LISTING_PARAMS: Final = ("state", "cluster", "after", "offset", "limit")
"""The query parameters :func:`parse_listing` reads (the OpenAPI document names each)."""
MAX_OFFSET: Final = 10**9
"""The largest ``offset`` (and ``limit``) a listing takes."""


def parse_listing(
    query: MultiMapping[str], *, default_limit: int | None = None, max_limit: int = MAX_OFFSET
) -> ListingQuery:
    """Read ``state`` and ``cluster`` (each repeatable, or comma-separated), ``after`` (a job id),
    ``offset`` and ``limit`` (1..``max_limit``; ``default_limit`` when absent, None: all).

    Raises:
        BadRequest: an unknown state, a bad job id or integer (``field`` names it).
    """
    states: set[State] = set()
    for value in query.getall("state", []):
        for name in filter(None, (v.strip() for v in value.split(","))):
            try:
                states.add(State(name))
            except ValueError:
                known = ", ".join(s.value for s in State)
                raise BadRequest(
                    f"unknown state {name!r} (states: {known})", field="state"
                ) from None
    after = query.get("after") or None
    if after is not None and not is_job_id(after):
        raise BadRequest(f"after must be a job id, got {after!r}", field="after")
    limit = query_int(query, "limit", 1, max_limit)
    return ListingQuery(
        states=frozenset(states) or None,
        clusters=frozenset(
            c for v in query.getall("cluster", []) for c in (x.strip() for x in v.split(",")) if c
        )
        or None,
        after=after,
        offset=query_int(query, "offset", 0, MAX_OFFSET) or 0,
        limit=default_limit if limit is None else limit,
    )

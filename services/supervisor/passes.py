"""One supervisor pass of one job (docs/runtime.md, "One pass"): commit, carry out, append
facts. Every rule of the pass is the core's (``dispatch_core.supervision``); the record is
read and written through ``dispatch_nats.RecordRepository`` (its conflict and unknown-outcome
handling); this module carries out the steps and calls the backend.

1. Read what is new in the record since the cached fold and fold it in (``prior=``); take
   the latest Discovery of the job's current cluster (its current submission's: a failover
   moves it, issue 14), merged with that of every other cluster where the job has an object
   not known ended (``dispatch_core.discovery_clusters``).
2. ``plan_pass(job, discovery, declarations, now, delivers=...)``.
3. **Decisions** (``PassPlan.decisions``) are appended together, all or none, with
   ``Nats-Expected-Last-Subject-Sequence`` = the seq the pass planned from
   (``RecordRepository.decide``). A ``ConcurrencyConflict`` means another writer got there
   first: the repository re-reads, re-folds and the pass re-plans; a stale decision is never
   carried out. An append whose ack was lost is resolved by the repository (found in the
   record, or sent again with the same msg ids) for up to ``store_retry_s``.
4. **Actions** are carried out after their intent is committed: ``Stop`` (or the emergency
   stop), ``OpenGate``, ``Launch`` (backend ``start``, tried again while the scheduler is
   unreachable for as long as the core's ``StartRetry`` says), ``AskCessation``, ``Deliver``.
5. **Facts** (the core's ``launch_fact``, ``gate_opened``, ``cessation_observed``,
   ``escalation_delivered``) are appended (``RecordRepository.append_fact``) with the current
   last seq, and on a conflict
   re-read and appended again without re-deciding: a fact stays true whatever was appended
   meanwhile. A fact the record already holds (``is_redundant``) or holds in another form (a
   launch another replica found in the meantime) is dropped: the record's own ``fold``
   decides, so the record is never made malformed.
6. ``conclude`` says whether another pass is needed, whether the job is settled, and its
   next deadline. The Status is projected and published when it (or the next deadline)
   changed, with optimistic concurrency on the status subject, never over a Status of a
   newer record seq.

**Reads (issue 11).** A cached fold nothing says is behind (no record delivery or Status
of a later seq noted: ``note_appended``) is planned from without a read (step 1) when its
plan commits decisions: the commit's expected last seq is the fold's, so it lands only on
the version planned from (a conflict re-reads and re-plans); a plan that commits nothing is
read for before anything is carried out.

**Message ids.** A fact's ``Nats-Msg-Id`` is derived from its step's key, so two writers of
the same fact store it once. A decision's is the step's key *plus this writer's token*: two
replicas planning from the same version decide the same steps with the same keys, and the
record store resolves an append whose msg id it finds stored as "mine, already stored"; with
the bare key, the replica that lost the race would take the winner's launch intent for its
own and launch the same attempt a second time. With the token it gets a plain conflict and
re-plans.

**Escalations (seed 002).** With an in-process ``deliver``, the pass's ``Deliver`` step is
offered after its other steps, and ``EscalationDelivered`` is appended for each escalation
``deliver`` returned for; one that raised is offered again after the next pass. When
``PassPlan.last_look`` (the pass settled the job), the record is re-read and the core's
``last_look`` escalations are offered, once. Without ``deliver`` (the notifier delivers) the
core plans no ``Deliver`` step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, assert_never

import msgspec

from dispatch_backends import (
    Backend,
    BackendError,
    CessationSignal,
    EmergencyStopper,
    LaunchRefusedError,
    LaunchUnknownError,
    Unreachable,
)
from dispatch_core import (
    AnyStep,
    AskCessation,
    Commit,
    DecodeError,
    Deliver,
    Discovery,
    EscalationCommitted,
    Fact,
    Job,
    Launch,
    MalformedRecord,
    OpenGate,
    PassPlan,
    Started,
    StartOutcome,
    StartRefused,
    StartRetry,
    StartUnknown,
    StartUnreachable,
    Status,
    Stop,
    SubmissionOpened,
    SubmissionWhy,
    WriterKind,
    cessation_observed,
    conclude,
    current_cluster,
    decode,
    discovery_clusters,
    encode,
    escalation_delivered,
    gate_opened,
    is_redundant,
    last_look,
    launch_fact,
    merge_discoveries,
    plan_pass,
    project,
)
from dispatch_core.escalations import escalation_kind
from dispatch_nats import (
    Change,
    ConcurrencyConflict,
    LatestEntry,
    Loaded,
    RecordRepository,
    StaleRead,
)
from dispatch_nats.contract import WAKE_AT_HEADER
from services.common.clock import utcnow
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.ports import DeliverFn, LatestPort, RecordPort

__all__ = [
    "PassError",
    "PassExecutor",
    "PassOutcome",
    "PoisonRecord",
    "UnknownCluster",
    "step_kind",
]

log = logging.getLogger("dispatch.supervisor")

_CONFLICT_TRIES: Final = 20
"""Most lost races of one commit of decisions, or of one fact, before the pass gives up."""
_MAX_STATUS_TRIES: Final = 5
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""Stands in for ``Status.at`` when statuses are compared: a Status that differs only in
when it was projected is not a change."""


class PassError(Exception):
    """Root of the errors a pass raises. ``retryable`` says whether running it again may
    succeed (the deliveries are offered again) or not (they are dropped, and logged)."""

    retryable: bool = True


class PoisonRecord(PassError):
    """The job's record can't be decoded or folded: dispatch did not write it (an event that
    does not decode, one its writer may not write, a malformed history). The job is left
    alone; every other job is supervised as before (issue 10, "Poison contained").

    Attributes:
        job_id: the job.
        seq: the seq of the event that can't be read (0 when the record as a whole is wrong).
        error: the core's error, naming job and seq.
    """

    retryable = False

    def __init__(self, job_id: str, error: MalformedRecord) -> None:
        super().__init__(f"job {job_id!r}: the record can't be read: {error}")
        self.job_id, self.seq, self.error = job_id, error.seq, error


class UnknownCluster(PassError):
    """The job runs on a cluster this replica has no backend for."""

    retryable = False

    def __init__(self, job_id: str, cluster: str, known: Sequence[str]) -> None:
        super().__init__(
            f"job {job_id!r}: cluster {cluster!r} is not in the clusters file "
            f"(clusters: {', '.join(known) or 'none'})"
        )
        self.job_id, self.cluster = job_id, cluster


class PassOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one pass did.

    Attributes:
        job_id: the job.
        found: whether the job has a record at all.
        seq: the record's last seq as this replica knows it after the pass.
        planned_seq: the seq of the record the pass's last plan covers: the one its decisions
            were planned from, or, when planning again on what it appended found nothing
            to do, the record's last seq.
        appended: events this pass appended (decisions and facts).
        follow_up: another pass should run at once (planning again on what this pass
            appended gave steps to carry out).
        settled: whether the job is settled (seed 002: supervision of it is over).
        wake_at: the job's next deadline, or None.
        retry: an action failed in a way worth trying again soon (scheduler unreachable).
        status: the Status published (or found current).
        steps: steps carried out.
    """

    job_id: str
    found: bool = True
    seq: int = 0
    planned_seq: int = 0
    appended: int = 0
    follow_up: bool = False
    settled: bool = False
    wake_at: datetime | None = None
    retry: bool = False
    status: Status | None = None
    steps: int = 0


class _Published(msgspec.Struct, kw_only=True):
    """The job's Status as last seen on the status stream (published here or elsewhere)."""

    stream_seq: int
    record_seq: int
    comparable: bytes


def step_kind(step: AnyStep) -> str:
    """The step's tag (``commit``, ``launch``, ``open-gate``, ``stop``, ...)."""
    return str(type(step).__struct_config__.tag)


class PassExecutor:
    """Runs passes of jobs, keeping each job's fold and last Status between passes.

    One executor per replica. It does not serialise passes of one job: its caller does (a
    per-job lock); passes of different jobs may run concurrently.
    """

    def __init__(
        self,
        *,
        records: RecordPort,
        discoveries: LatestPort,
        statuses: LatestPort,
        backends: Mapping[str, Backend],
        metrics: SupervisorMetrics,
        deliver: DeliverFn | None = None,
        channel: str = "in-process",
        clock: Callable[[], datetime] = utcnow,
        writer: str | None = None,
        launch_retry_s: float = 30.0,
        store_retry_s: float = 60.0,
        crash_after_intent: bool = False,
        status_echo_s: float | None = None,
    ) -> None:
        """Prepare the executor.

        Args:
            records: the record store (appending as the supervisor).
            discoveries: the discovery stream.
            statuses: the status stream.
            backends: the backend of each cluster, by name.
            metrics: where to count.
            deliver: seed 002's ``Deliver``; None when the notifier delivers.
            channel: recorded in ``EscalationDelivered.channel``.
            clock: the time of a pass (timezone-aware).
            writer: this writer's token in decisions' msg ids (default: a fresh random one).
            launch_retry_s: seconds a start is retried while the scheduler is unreachable
                (nothing was created) before its outcome is recorded unknown.
            store_retry_s: seconds an append whose outcome stays unknown is sent again
                (same msg ids: stored at most once) before the pass gives up.
            crash_after_intent: TEST HOOK: SIGKILL this process right after a launch
                intent is committed, before the backend is called.
            status_echo_s: publish a Status without waiting for JetStream's ack, and take
                its coming back through ``note_status`` (the caller follows every Status)
                as the ack, waiting this many seconds for it before asking with an acked
                put; None: an acked put each time.
        """
        self._repo = RecordRepository(
            records,
            writer=WriterKind.SUPERVISOR,
            clock=clock,
            conflict_tries=_CONFLICT_TRIES,
            unknown_for_s=store_retry_s,
            on_conflict=lambda what: self._metrics.conflicts.labels(what).inc(),
        )
        self._discoveries = discoveries
        self._statuses = statuses
        self._backends = dict(backends)
        self._metrics = metrics
        self._deliver = deliver
        self._channel = channel
        self._clock = clock
        self._writer = writer or uuid.uuid4().hex[:12]
        self._start_retry = StartRetry(retry_s=launch_retry_s)
        self._crash_after_intent = crash_after_intent
        self._jobs: dict[str, Job] = {}
        self._ahead: dict[str, int] = {}
        """The highest record seq of each job known to be stored (told by `note_appended`
        and by Statuses): a cached fold behind it is read before it is planned from."""
        self._published: dict[str, _Published] = {}
        self._status_echo_s = status_echo_s
        self._echoes: dict[str, _Echo] = {}
        """The Status each job's pass published and waits to see come back."""

    def forget(self, job_id: str) -> None:
        """Drop ``job_id`` from the per-job caches (it settled; a later pass reads it again)."""
        self._jobs.pop(job_id, None)
        self._ahead.pop(job_id, None)
        self._published.pop(job_id, None)

    def cached_jobs(self) -> frozenset[str]:
        """The jobs the caches hold (for tests and debugging)."""
        return frozenset(self._jobs) | frozenset(self._published)

    @property
    def writer(self) -> str:
        """This writer's token (part of each decision's msg id)."""
        return self._writer

    def cached_seq(self, job_id: str) -> int:
        """The last record seq folded into this replica's cache of the job (0 if none)."""
        job = self._jobs.get(job_id)
        return 0 if job is None else job.seq

    def cached(self, job_id: str) -> Job | None:
        """The job as this replica last folded it."""
        return self._jobs.get(job_id)

    def note_appended(self, job_id: str, seq: int | None = None) -> None:
        """Take note that the job's record holds an event at ``seq`` (None: some event
        after the cached fold), e.g. another writer's append was delivered: the next pass
        reads the record if its cached fold is behind it, and a read that does not reach
        ``seq`` is stale (``_load``). Noted for a job not cached too: its first pass, woken
        by the API's ``job.created``, must not take a read that misses it for "no record"."""
        if seq is None:
            job = self._jobs.get(job_id)
            if job is None:
                return  # the next pass reads the record anyway
            seq = job.seq + 1
        if seq > self._ahead.get(job_id, 0):
            self._ahead[job_id] = seq

    def note_status(self, job_id: str, entry: LatestEntry) -> Status | None:
        """Take note of a Status seen on the status stream (from any replica).

        Returns:
            The decoded Status, or None if it can't be decoded (logged).
        """
        echo = self._echoes.get(job_id)
        wake = entry.headers.get(WAKE_AT_HEADER)
        own: _Echo | None = None
        if echo is not None and entry.seq > echo.expected and not echo.seen.done():
            # The first Status after the one the put expected: the put's, if stored.
            mine = entry.payload == echo.payload
            echo.seen.set_result((entry.seq, mine))
            if mine and wake == echo.wake:
                own = echo
        if own is not None:
            # The put's own bytes came back: they were encoded from this Status, so decoding
            # them and encoding the comparable form again would only give what it holds.
            status, comparable = own.status, own.comparable
        else:
            try:
                status = decode(entry.payload, Status)
            except DecodeError as err:
                log.error(
                    "supervisor.status_undecodable", extra={"job_id": job_id, "error": str(err)}
                )
                return None
            comparable = None
        self.note_appended(job_id, status.seq)  # another replica's appends show here
        current = self._published.get(job_id)
        if current is None or entry.seq > current.stream_seq:
            self._published[job_id] = _Published(
                stream_seq=entry.seq,
                record_seq=status.seq,
                comparable=_comparable(status, wake) if comparable is None else comparable,
            )
        return status

    # -- the pass ---------------------------------------------------------------------------

    async def run_pass(self, job_id: str) -> PassOutcome:
        """Run one pass of ``job_id`` (see the module docstring).

        Returns:
            What it did; ``found=False`` when the job has no record.

        Raises:
            PoisonRecord: the record can't be decoded or folded.
            UnknownCluster: the job's cluster has no backend here.
            dispatch_nats.TooManyConflicts: every re-plan (or a fact's append) lost a race.
            dispatch_nats.NatsStoreError: the store failed (retry later).
        """
        started = time.monotonic()
        prior = self._jobs.get(job_id)
        unread = prior is not None and self._ahead.get(job_id, 0) <= prior.seq
        # Issue 11: a cached fold nothing says is behind is planned from without a read; a
        # commit of its decisions (expected last seq = the fold's) proves it current before
        # any action, and a plan with none is read for below.
        loaded = Loaded(prior, ()) if unread and prior is not None else None
        if loaded is None:
            loaded = await self._load(job_id, prior)
        if loaded is None:
            return PassOutcome(job_id=job_id, found=False)
        planned: list[tuple[PassPlan, Backend, Discovery | None]] = []

        async def decide(current: Loaded | None) -> list[Change]:
            assert current is not None  # the job has a record: a re-load keeps it
            job = self._jobs[job_id] = current.job
            backend = self._backend(job)
            discovery = await self._discovery(job)
            declarations = backend.declarations()
            plan = plan_pass(
                job, discovery, declarations, self._clock(), delivers=self._deliver is not None
            )
            for step in plan.steps:
                if isinstance(step, Launch):
                    # Before any intent is committed: a failover to a cluster this replica
                    # has no backend for is refused like the job's own cluster.
                    self._backend(job, step.spec.cluster)
            planned.append((plan, backend, discovery))
            return [Change(f"{d.key}~{self._writer}", d.event) for d in plan.decisions]

        try:
            done = await self._repo.decide(job_id, decide, loaded=loaded)
            if unread and not done.events and done.loaded is loaded:
                # Nothing committed, so nothing proved the unread fold current: read what
                # is new (one leader request when nothing is) before acting on its plan.
                fresh = await self._repo.load(job_id, loaded.job)
                if fresh is not None and fresh.entries:
                    done = await self._repo.decide(job_id, decide, loaded=fresh)
        except MalformedRecord as err:  # a re-load after a lost race found it unreadable
            raise PoisonRecord(job_id, err) from err
        plan, backend, discovery = planned[-1]
        assert done.job is not None
        self._jobs[job_id] = done.job
        appended = len(done.events)
        if (
            done.events
            and self._crash_after_intent
            and any(isinstance(s, Launch) and not s.resume for s in plan.steps)
        ):
            log.warning("supervisor.crash_after_intent", extra={"job_id": job_id})
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
        offered: set[str] = set()
        retry = False
        for step in plan.steps:
            self._metrics.steps.labels(step_kind(step)).inc()
            match step:
                case Commit():
                    if isinstance(step.event, EscalationCommitted):
                        kind = escalation_kind(step.event.id)
                        self._metrics.escalations.labels(kind or "other").inc()
                    elif (
                        isinstance(step.event, SubmissionOpened)
                        and step.event.why is SubmissionWhy.RECOVERY
                    ):
                        cause = step.event.cause
                        self._metrics.recoveries.labels(
                            "unknown" if cause is None else cause.kind
                        ).inc()
                case Stop():
                    retry |= not await self._stop(job_id, backend, step)
                case OpenGate():
                    ok, n = await self._open_gate(job_id, backend, step)
                    retry |= not ok
                    appended += n
                case Launch():
                    # A failover's launch goes to its submission's cluster (issue 14).
                    target = self._backend(self._jobs[job_id], step.spec.cluster)
                    appended += await self._launch(job_id, target, step)
                case AskCessation():
                    ok, n = await self._ask_cessation(job_id, backend, step)
                    retry |= not ok
                    appended += n
                case Deliver():
                    offered.update(e.id for e in step.escalations)
                    for escalation in step.escalations:
                        appended += await self._deliver_one(job_id, escalation.id)
                case _:
                    assert_never(step)
        if plan.last_look:
            # Seed 002: the settling pass's last look delivers, once, what the record
            # holds undelivered and this pass did not offer.
            looked = await self._load(job_id, self._jobs[job_id])
            assert looked is not None  # a prior was given
            self._jobs[job_id] = looked.job
            for escalation in last_look(looked.job, offered):
                appended += await self._deliver_one(job_id, escalation.id)
        job = self._jobs[job_id]
        now = self._clock()
        end = conclude(plan, job, discovery, backend.declarations(), now, appended=appended)
        status = await self._publish_status(job, discovery, end.wake_at, now)
        self._metrics.pass_duration.observe(time.monotonic() - started)
        return PassOutcome(
            job_id=job_id,
            seq=job.seq,
            planned_seq=end.covered_seq,
            appended=appended,
            follow_up=end.follow_up,
            settled=end.settled,
            wake_at=end.wake_at,
            retry=retry,
            status=status,
            steps=len(plan.steps),
        )

    # -- reading ----------------------------------------------------------------------------

    async def _load(self, job_id: str, prior: Job | None) -> Loaded | None:
        """Read what is new in the job's record after ``prior`` and fold it in.

        Raises:
            PoisonRecord: an event can't be read (naming the job and seq).
            dispatch_nats.StaleRead: the read stops short of a seq noted stored
                (``note_appended``).
        """
        try:
            loaded = await self._repo.load(job_id, prior)
        except MalformedRecord as err:  # undecodable, refused writer, out of order...
            raise PoisonRecord(job_id, err) from err
        # The record is read from the stream's leader, which acknowledged every append; but
        # JetStream stores an append on each server as that server applies it, and a loaded
        # leader may apply it after a follower whose consumer already delivered it (seen:
        # a job.created delivered, the leader "holds no message", the pass "found no
        # record", its delivery acked, the job never supervised). A read short of a seq
        # known stored is stale: the pass fails retryably and its deliveries come again.
        ahead = self._ahead.get(job_id, 0)
        got = 0 if loaded is None else loaded.job.seq
        if got < ahead:
            raise StaleRead(f"job {job_id!r}: read record", ahead, got)
        return loaded

    def _backend(self, job: Job, cluster: str | None = None) -> Backend:
        """The backend of ``cluster``, by default the job's current cluster (the cluster of
        its current submission: a failover moves it, issue 14 part 2)."""
        name = current_cluster(job) if cluster is None else cluster
        backend = self._backends.get(name)
        if backend is None:
            raise UnknownCluster(job.job_id, name, sorted(self._backends))
        return backend

    async def _discovery(self, job: Job) -> Discovery | None:
        """The job's Discovery: the current cluster's, merged with that of every other
        cluster where the job has an object not known ended (the core's
        ``discovery_clusters``; one read for a job that never failed over)."""
        found: list[Discovery] = []
        for cluster in discovery_clusters(job):
            entry = await self._discoveries.get((cluster, job.job_id))
            if entry is None:
                continue
            try:
                found.append(decode(entry.payload, Discovery))
            except DecodeError as err:
                # The observer wrote it; a newer build's Discovery is refused, never guessed
                # at.
                log.error(
                    "supervisor.discovery_undecodable",
                    extra={"job_id": job.job_id, "cluster": cluster, "error": str(err)},
                )
        return merge_discoveries(found)

    # -- writing ----------------------------------------------------------------------------

    async def _fact(self, job_id: str, fact: Fact) -> int:
        """Append a fact over whatever the record holds now (the repository re-loads after a
        lost race, and resolves an unknown outcome); return 1 if appended, 0 if the record
        already held it (``is_redundant``) or something that makes it moot.

        Raises:
            PoisonRecord: a re-load found the record unreadable.
            dispatch_nats.TooManyConflicts: every try lost a race.
        """
        try:
            done = await self._repo.append_fact(
                self._jobs[job_id], fact.key, fact.event, redundant=is_redundant
            )
        except MalformedRecord as err:
            raise PoisonRecord(job_id, err) from err
        self._jobs[job_id] = done.job
        return 0 if done.seq is None else 1

    # -- actions ----------------------------------------------------------------------------

    async def _stop(self, job_id: str, default: Backend, step: Stop) -> bool:
        backend = self._backends.get(step.ref.cluster, default)
        try:
            if step.intent.emergency and isinstance(backend, EmergencyStopper):
                await backend.emergency_stop(step.ref)
            else:
                await backend.stop(step.ref)
        except BackendError as err:
            log.warning(
                "supervisor.stop_failed",
                extra={"job_id": job_id, "ref": str(step.ref), "error": str(err)},
            )
            return False
        log.debug(
            "supervisor.stopped",
            extra={"job_id": job_id, "ref": str(step.ref), "why": step.intent.why},
        )
        return True

    async def _open_gate(self, job_id: str, default: Backend, step: OpenGate) -> tuple[bool, int]:
        backend = self._backends.get(step.ref.cluster, default)
        try:
            await backend.open_gate(step.ref)
        except Unreachable as err:
            log.warning(
                "supervisor.open_gate_failed",
                extra={"job_id": job_id, "ref": str(step.ref), "error": str(err)},
            )
            return False, 0
        except BackendError as err:
            # An admin hold, or the object vanished: the next Discovery shows which.
            log.warning(
                "supervisor.open_gate_refused",
                extra={"job_id": job_id, "ref": str(step.ref), "error": str(err)},
            )
            return True, 0
        log.debug("supervisor.gate_opened", extra={"job_id": job_id, "ref": str(step.ref)})
        return True, await self._fact(job_id, gate_opened(step, job_id, self._clock()))

    async def _launch(self, job_id: str, backend: Backend, step: Launch) -> int:
        started = time.monotonic()
        tries, attempt = 0, f"{step.submission}/{step.attempt}"
        outcome: StartOutcome
        while True:
            try:
                outcome = Started(ref=await backend.start(step))
            except Unreachable as err:
                # Nothing was created (the Protocol's promise): the same start may be tried
                # again, for as long as the core's unknown-launch policy says.
                tries += 1
                delay = self._start_retry.delay(tries, time.monotonic() - started)
                if delay is not None:
                    log.warning(
                        "supervisor.launch_unreachable",
                        extra={"job_id": job_id, "attempt": attempt, "error": str(err)},
                    )
                    await asyncio.sleep(delay)
                    continue
                outcome = StartUnreachable(detail=err.detail)
            except LaunchRefusedError as err:
                outcome = StartRefused(detail=err.detail)
            except LaunchUnknownError as err:
                outcome = StartUnknown(detail=err.detail)
            except Exception as err:
                # Whatever went wrong, an object may exist: the outcome is unknown, never
                # assumed failed (DESIGN.md section 5).
                log.exception("supervisor.launch_crashed", extra={"job_id": job_id})
                outcome = StartUnknown(detail=f"{type(err).__name__}: {err}")
            break
        word, fact = launch_fact(step, outcome, self._clock(), retry=self._start_retry)
        self._metrics.launches.labels(word).inc()
        log.info(
            "supervisor.launched",
            extra={"job_id": job_id, "attempt": attempt, "outcome": word},
        )
        return await self._fact(job_id, fact)

    async def _ask_cessation(
        self, job_id: str, default: Backend, step: AskCessation
    ) -> tuple[bool, int]:
        backend = self._backends.get(step.ref.cluster, default)
        if not isinstance(backend, CessationSignal):
            return True, 0
        try:
            answer = await backend.cessation(step.ref, step.nodes)
        except BackendError as err:
            log.warning(
                "supervisor.cessation_failed",
                extra={"job_id": job_id, "ref": str(step.ref), "error": str(err)},
            )
            return False, 0
        fact = cessation_observed(
            step, job_id, self._clock(), ceased=answer.ceased, detail=answer.detail
        )
        return True, await self._fact(job_id, fact)

    async def _deliver_one(self, job_id: str, escalation_id: str) -> int:
        assert self._deliver is not None
        escalation = self._jobs[job_id].escalation(escalation_id)
        if escalation is None or escalation.delivered is not None:
            return 0
        try:
            await self._deliver(job_id, escalation)
        except Exception as err:  # the user's channel: any error means "offer it again"
            self._metrics.delivered.labels("error").inc()
            log.warning(
                "supervisor.delivery_failed",
                extra={"job_id": job_id, "escalation": escalation_id, "error": repr(err)},
            )
            return 0
        self._metrics.delivered.labels("ok").inc()
        fact = escalation_delivered(job_id, escalation_id, self._clock(), channel=self._channel)
        return await self._fact(job_id, fact)

    # -- status -----------------------------------------------------------------------------

    async def _publish_status(
        self, job: Job, discovery: Discovery | None, wake_at: datetime | None, now: datetime
    ) -> Status:
        status = project(job, discovery, now)
        wake = None if wake_at is None else wake_at.isoformat()
        comparable = _comparable(status, wake)
        current = self._published.get(job.job_id)
        if current is not None and current.comparable == comparable:
            return status
        if current is None:
            entry = await self._statuses.get((job.job_id,))
            if entry is not None:
                self.note_status(job.job_id, entry)
                current = self._published.get(job.job_id)
                if current is not None and current.comparable == comparable:
                    return status
        headers = {WAKE_AT_HEADER: wake} if wake is not None else None
        payload = encode(status)
        for _ in range(_MAX_STATUS_TRIES):
            if current is not None and current.record_seq > status.seq:
                return status  # a newer record's Status is there: never overwrite it
            if current is not None and current.comparable == comparable:
                return status  # found there after a conflict (e.g. an unacked copy stored)
            expected = 0 if current is None else current.stream_seq
            try:
                seq = await self._put_status(
                    job.job_id, payload, expected, headers, status=status, comparable=comparable
                )
            except ConcurrencyConflict:
                self._metrics.conflicts.labels("status").inc()
                entry = await self._statuses.get((job.job_id,))
                if entry is not None:
                    self.note_status(job.job_id, entry)
                current = self._published.get(job.job_id)
                continue
            self._published[job.job_id] = _Published(
                stream_seq=seq, record_seq=status.seq, comparable=comparable
            )
            return status
        log.warning("supervisor.status_conflicts", extra={"job_id": job.job_id})
        return status

    async def _put_status(
        self,
        job_id: str,
        payload: bytes,
        expected: int,
        headers: dict[str, str] | None,
        *,
        status: Status,
        comparable: bytes,
    ) -> int:
        """Make ``payload`` (``status`` encoded; ``comparable`` its form without the time,
        with ``headers``' wake) the job's Status over stream seq ``expected``; return its seq.

        With ``status_echo_s``, published without an ack (issue 11: one message less per
        Status): the first Status of the job after ``expected`` that the watch brings back
        is this one if it was stored (the expected seq lets nothing else in between), or
        another writer's, which is a conflict. Without it back in time (the watch not
        following yet, a reconnect), the same put is sent acked: if the first copy was
        stored meanwhile that one conflicts, and the caller reads the Status and decides.

        Raises:
            ConcurrencyConflict: another value is the job's Status after ``expected``.
        """
        key = (job_id,)
        if self._status_echo_s is None or job_id in self._echoes:
            return await self._statuses.put(
                key, payload, expected_last_seq=expected, headers=headers
            )
        wake = None if headers is None else headers.get(WAKE_AT_HEADER)
        echo = self._echoes[job_id] = _Echo(expected, payload, status, comparable, wake)
        try:
            await self._statuses.publish(key, payload, expected_last_seq=expected, headers=headers)
            try:
                async with asyncio.timeout(self._status_echo_s):
                    seq, mine = await echo.seen
            except TimeoutError:
                log.info("supervisor.status_echo_missed", extra={"job_id": job_id})
                return await self._statuses.put(
                    key, payload, expected_last_seq=expected, headers=headers
                )
        finally:
            del self._echoes[job_id]
        if not mine:
            raise ConcurrencyConflict(job_id, expected, seq)
        return seq


class _Echo:
    """A Status published without an ack, waiting to come back on the status watch."""

    __slots__ = ("comparable", "expected", "payload", "seen", "status", "wake")

    def __init__(
        self, expected: int, payload: bytes, status: Status, comparable: bytes, wake: str | None
    ) -> None:
        self.expected = expected
        self.payload = payload
        self.status = status
        """What ``payload`` encodes, with ``comparable`` (its ``_comparable`` with ``wake``,
        the wake header sent): taken as they are when the same bytes and wake come back."""
        self.comparable = comparable
        self.wake = wake
        self.seen: asyncio.Future[tuple[int, bool]] = asyncio.get_running_loop().create_future()
        """The stream seq of the first Status after ``expected``, and whether it is this
        one (else another writer's value came first: this one was refused)."""


def _comparable(status: Status, wake_at: str | None) -> bytes:
    return encode(msgspec.structs.replace(status, at=_EPOCH)) + b"|" + (wake_at or "").encode()

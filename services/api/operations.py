"""What the API does, without HTTP: submit, operator commands, reads, escalations.

Commands are decided by the core's ``decide`` against the folded record and committed
through ``dispatch_nats.RecordRepository``, which appends with optimistic concurrency
(``expected_last_seq`` = the seq folded) and, after a lost race, re-loads what is new and
decides again (a command that no longer applies is then refused, 409; one that keeps losing
is answered 503); an append whose ack was lost is found by reading its msg ids.

Every event an API request appends has a ``Nats-Msg-Id`` of the form
``api-<32 hex>:<i>``; with an ``Idempotency-Key`` the hex part is derived from the actor, the
job, the command and the key, so a retried request finds its own earlier commit in the
record (at any age, not only within JetStream's duplicate window) and is answered from it
(``replayed``) instead of being decided again.

Folded records are cached per job (an LRU of :class:`Job` values and the msg-id bases seen):
a record is append-only, so a cached fold is a valid prefix and only the events after it are
read (``RecordRepository.load(job, prior=cached)``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple, TypeVar

import msgspec

from dispatch_backends import ClusterConfig, InvalidOption, check_options
from dispatch_backends.config import SlurmCluster, sees_checkpoint
from dispatch_core import Actor as CoreActor
from dispatch_core import (
    ActorKind,
    Declarations,
    DecodeError,
    Discovery,
    InvalidPolicy,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    MalformedRecord,
    OperatorCommand,
    OptionRefused,
    Plan,
    RecoveryPolicy,
    Refused,
    State,
    Status,
    Supersede,
    Superseded,
    WriterKind,
    decide,
    decode,
    discovery_clusters,
    fold,
    is_job_id,
    make_plan,
    merge_discoveries,
    policy_clusters,
    project,
)
from dispatch_nats import (
    Change,
    Committed,
    ConcurrencyConflict,
    InvalidName,
    LatestFeed,
    LatestStore,
    Loaded,
    RecordRepository,
    RecordStore,
    StoredEvent,
    TooManyConflicts,
)
from services.api.errors import (
    ApiError,
    BadRequest,
    Busy,
    Forbidden,
    IdempotencyKeyReused,
    NotFound,
    RefusedCommand,
    UnreadableRecord,
    accepted_values,
)
from services.api.jobindex import JobIndex
from services.api.metrics import ApiMetrics
from services.api.schemas import (
    COMMAND_REQUESTS,
    CommandResponse,
    EscalationList,
    EscalationView,
    JobList,
    RecordedEvent,
    RecordResponse,
    SubmitRequest,
    SubmitResponse,
    SupersedeRequest,
    UnreadableJob,
    check_spec,
    decode_body,
    strict_command,
)
from services.common.clock import utcnow

__all__ = ["MAX_SEQ", "CheckedSubmission", "Operations"]

log = logging.getLogger("services.api")

T = TypeVar("T")
R = TypeVar("R")

MAX_SEQ: Final = 2**53
"""The largest record seq a client may name (``after``): JSON-safe, far beyond any stream."""

_MSG_PREFIX: Final = "api-"
_OUTCOMES: Final[dict[type[ApiError], str]] = {
    RefusedCommand: "refused",
    IdempotencyKeyReused: "refused",
    Forbidden: "forbidden",
    BadRequest: "invalid",
    NotFound: "not-found",
    Busy: "busy",
    UnreadableRecord: "unreadable",
}


class CheckedSubmission(NamedTuple):
    """A ``POST /v1/jobs`` body that passed :meth:`Operations.check_submission`.

    Attributes:
        request: the decoded body.
        command: the core's ``submit`` command it makes (``job_id`` still to be chosen).
        plan: the plan the job would get.
    """

    request: SubmitRequest
    command: OperatorCommand
    plan: Plan


class _Folded(NamedTuple):
    """A job's record folded up to ``job.seq``, with the msg-id bases of its API commits."""

    job: Job
    bases: frozenset[str]


def _decode_body(type_: type[T], body: bytes) -> T:
    """``decode_body``, whose 400 for a value an enum field doesn't have also lists the
    values it does (msgspec's message names only the path).

    Raises:
        BadRequest: as ``decode_body``.
    """
    try:
        return decode_body(type_, body)
    except BadRequest as err:
        refused = err.__cause__
        values = None
        if isinstance(refused, msgspec.ValidationError):
            values = accepted_values(str(refused), type_)
        if values is None:
            raise
        raise BadRequest(
            f"{err.message}; accepted values: {', '.join(values)}",
            code=err.code,
            field=err.field,
        ) from refused


def _base_of(msg_id: str | None) -> str | None:
    if msg_id is None or not msg_id.startswith(_MSG_PREFIX):
        return None
    return msg_id.split(":", 1)[0]


def _suffix(seed: str | None) -> str:
    """Eight characters of ``a-z2-7``: derived from ``seed``, or random without one."""
    raw = hashlib.sha256(seed.encode()).digest()[:5] if seed else secrets.token_bytes(5)
    return base64.b32encode(raw).decode().lower()


_API: Final = WriterKind.API
"""The writer kind of everything the API appends (its record store's)."""


@contextlib.contextmanager
def _reading(job_id: str) -> Iterator[None]:
    """Answer a record that can't be read (an event that does not decode, one its writer may
    not write, a malformed history) as :class:`UnreadableRecord`, naming the job and seq:
    that job's problem, never another job's (issue 10, "Poison contained").

    Raises:
        UnreadableRecord: from ``MalformedRecord`` inside the block.
    """
    try:
        yield
    except MalformedRecord as err:
        log.warning(
            "record.unreadable", extra={"job_id": job_id, "seq": err.seq, "error": str(err)}
        )
        raise UnreadableRecord(job_id, err.seq, str(err)) from err


def _asked(event: JobEvent) -> object:
    """What of ``event`` a request decides: all of it, but a ``JobCreated``'s plan and
    declarations (the backend's, which may change between a request and its retry)."""
    if isinstance(event, JobCreated):
        return (
            event.job_id,
            event.at,
            event.spec,
            event.policy,
            event.generation,
            event.supersedes,
            event.by,
        )
    return event


def _recorded(stored: StoredEvent) -> RecordedEvent:
    return RecordedEvent(seq=stored.entry.seq, event=stored.event, writer=stored.entry.writer)


def _unreadable(err: UnreadableRecord) -> UnreadableJob:
    return UnreadableJob(job_id=err.job_id or "", seq=err.seq or 0, message=err.message)


class Operations:
    """The API's operations on the record, status and discovery streams."""

    def __init__(
        self,
        *,
        records: RecordStore,
        statuses: LatestStore,
        discoveries: LatestStore,
        declarations: Mapping[str, Declarations],
        metrics: ApiMetrics,
        cluster_configs: Mapping[str, ClusterConfig] | None = None,
        unix_users: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = utcnow,
        attempts: int = 16,
        unknown_for_s: float = 10.0,
        concurrency: int = 32,
        cache_size: int = 4096,
    ) -> None:
        """Use the given stores (their connection stays the caller's).

        Args:
            records: the record store.
            statuses: the latest Status per job (published by the supervisor).
            discoveries: the latest Discovery per cluster and job (published by observers).
            declarations: cluster name -> its backend's declarations (a submission's spec
                must name one of these clusters).
            metrics: where to count commands and conflicts.
            cluster_configs: cluster name -> its entry of the clusters file: a submission's
                ``spec.options`` are checked by its backend
                (:func:`dispatch_backends.check_options`); a cluster not in it has its
                options unchecked.
            unix_users: actor name -> the Unix user its jobs run as (the tokens file's
                ``unix_user``): a submission's ``spec.owner``, checked against the
                cluster's ``users``; such an actor may command only the jobs it owns.
            clock: the time of decisions and projections.
            attempts: how many times a command is decided before answering 503 when every
                append loses a race.
            unknown_for_s: seconds an append whose ack was lost is resolved (by reading)
                and sent again before the request fails.
            concurrency: most records read at once by the listings.
            cache_size: most folded records kept in memory.
        """
        self._records = records
        self._repo = RecordRepository(
            records,
            writer=_API,
            clock=clock,
            conflict_tries=attempts,
            unknown_for_s=unknown_for_s,
        )
        self._statuses = statuses
        self._discoveries = discoveries
        self._declarations = dict(declarations)
        self._cluster_configs = dict(cluster_configs or {})
        self._unix_users = dict(unix_users or {})
        self._metrics = metrics
        self._clock = clock
        self._attempts = attempts
        self._concurrency = concurrency
        self._cache_size = cache_size
        self._cache: OrderedDict[str, _Folded] = OrderedDict()
        self._index = JobIndex(
            records=records,
            statuses=statuses,
            discoveries=discoveries,
            load=self._load_job,
            project=self._project,
            configured=self._declarations,
            concurrency=concurrency,
        )

    @property
    def clusters(self) -> list[str]:
        """The clusters a submission may name."""
        return sorted(self._declarations)

    # ----------------------------------------------------------------- folding, projecting

    async def _load(self, job_id: str) -> _Folded | None:
        """Return the job's record folded to its end (None: no record), reading only what
        the cache doesn't hold.

        Raises:
            UnreadableRecord: the record holds an event that can't be read (job and seq).
        """
        cached = self._cache.get(job_id)
        with _reading(job_id):
            loaded = await self._repo.load(job_id, cached.job if cached else None)
        if loaded is None:
            return None
        return self._note(loaded, cached.bases if cached else frozenset())

    async def _load_job(self, job_id: str) -> Job | None:
        """The job's record folded to its end (None: no record), for the jobs index.

        Raises:
            UnreadableRecord: as :meth:`_load`.
        """
        folded = await self._load(job_id)
        return None if folded is None else folded.job

    async def job(self, job_id: str) -> Job | None:
        """The job's record folded to its end (None: no record), for a reader that needs more
        than its Status: the web page's inbox (escalations with delivery, abandoned targets).

        Raises:
            UnreadableRecord: as :meth:`_load`.
        """
        return await self._load_job(job_id)

    def _note(self, loaded: Loaded, known: frozenset[str]) -> _Folded:
        """Cache a load, with the msg-id bases of the API commits it read added to
        ``known`` (those of the version it was loaded from)."""
        bases = {b for b in (_base_of(e.msg_id) for e in loaded.entries) if b is not None}
        return self._remember(_Folded(loaded.job, known | bases))

    def _remember(self, folded: _Folded) -> _Folded:
        job_id = folded.job.job_id
        current = self._cache.get(job_id)
        if current is not None and current.job.seq > folded.job.seq:
            folded = current  # a concurrent load got further
        self._cache[job_id] = folded
        self._cache.move_to_end(job_id)
        self._index.learn(folded.job)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return folded

    async def _discovery(self, job: Job) -> Discovery | None:
        """The Discovery a Status is projected with: the job's current cluster's, merged with
        every other cluster's where it has an object not known ended (as the supervisor
        reads it; issue 14, failover)."""
        found: list[Discovery] = []
        for cluster in discovery_clusters(job):
            try:
                entry = await self._discoveries.get((cluster, job.job_id))
            except InvalidName:
                continue
            if entry is None:
                continue
            try:
                found.append(decode(entry.payload, Discovery))
            except DecodeError:
                log.warning(
                    "discovery.undecodable",
                    extra={"job_id": job.job_id, "seq": entry.seq},
                    exc_info=True,
                )
        return merge_discoveries(found)

    async def _project(self, job: Job) -> Status:
        return project(job, await self._discovery(job), self._clock())

    async def _bounded(self, items: Sequence[T], fn: Callable[[T], Awaitable[R]]) -> list[R]:
        """Run ``fn`` over ``items``, at most ``concurrency`` at once; results in order."""
        slots = asyncio.Semaphore(self._concurrency)

        async def one(item: T) -> R:
            async with slots:
                return await fn(item)

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(item)) for item in items]
        return [t.result() for t in tasks]

    # -------------------------------------------------------------------------- reads

    async def status(self, job_id: str) -> tuple[Status, str]:
        """Return the job's Status and where it came from (``supervisor`` or ``api``).

        The Status the supervisor published is served when it reflects the record's last
        event; when there is none yet, or the record is ahead of it (a command was just
        committed), the API folds the record and projects it with the latest Discovery
        itself, so a caller always reads its own writes.

        Raises:
            NotFound: no record (and no Status) for ``job_id``.
        """
        if not is_job_id(job_id):
            raise NotFound(f"no job {job_id!r}: not a job id")
        entry, last = await asyncio.gather(
            self._statuses.get((job_id,)), self._records.last_seq(job_id)
        )
        published: Status | None = None
        if entry is not None:
            try:
                published = decode(entry.payload, Status)
            except DecodeError:
                log.warning(
                    "status.undecodable", extra={"job_id": job_id, "seq": entry.seq}, exc_info=True
                )
        if published is not None and published.seq >= last:
            return published, "supervisor"
        folded = await self._load(job_id) if last else None
        if folded is None:
            if published is not None:
                return published, "supervisor"
            raise NotFound(f"no job {job_id!r}")
        return await self._project(folded.job), "api"

    async def existing_job(self, job_id: str) -> Job:
        """Return the job's record folded to its end, or say there is none (``dispatch logs``
        finds its objects there).

        Raises:
            NotFound: no record for ``job_id``.
            UnreadableRecord: the record holds an event that can't be read.
        """
        if not is_job_id(job_id):
            raise NotFound(f"no job {job_id!r}: not a job id")
        folded = await self._load(job_id)
        if folded is None:
            raise NotFound(f"no job {job_id!r}")
        return folded.job

    async def exists(self, job_id: str) -> bool:
        """Return whether the job has a record or a published Status."""
        if not is_job_id(job_id):
            return False
        if await self._records.last_seq(job_id):
            return True
        return await self._statuses.get((job_id,)) is not None

    def watch(self, job_id: str) -> LatestFeed:
        """Follow the job's published Status: its current value, then every change."""
        return self._statuses.watch((job_id,))

    def watch_changes(self) -> LatestFeed:
        """Follow every job's published Status from now on (changes only, no current values):
        the web page's live jobs list (services/api/web)."""
        return self._statuses.watch((), initial=False)

    def declarations_of(self, cluster: str) -> Declarations | None:
        """The declarations of ``cluster``'s backend, or None for a cluster the API doesn't
        know (the web page's plan preview makes the plan a submission would get)."""
        return self._declarations.get(cluster)

    async def record(self, job_id: str, after: int = 0) -> RecordResponse:
        """Return the job's events with seq greater than ``after``.

        Raises:
            NotFound: no record for ``job_id``.
            UnreadableRecord: an event (after ``after``) can't be read.
        """
        if not is_job_id(job_id):
            raise NotFound(f"no job {job_id!r}: not a job id")
        with _reading(job_id):
            stored = await self._repo.events(job_id, after)
        if not stored and (after == 0 or not await self._records.last_seq(job_id)):
            raise NotFound(f"no job {job_id!r}")
        return RecordResponse(job_id=job_id, events=tuple(_recorded(s) for s in stored))

    @property
    def index(self) -> JobIndex:
        """The jobs index (services/api/jobindex.py): the listings' one source."""
        return self._index

    async def list_jobs(
        self,
        states: frozenset[State] | None = None,
        *,
        clusters: frozenset[str] | None = None,
        after: str | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> JobList:
        """One page of the jobs, by id, from the jobs index (its Status heads, current to
        this call: see :mod:`services.api.jobindex`).

        A job whose Status hasn't been published yet (just submitted) is listed with the
        Status projected from its record. A job whose record can't be read is listed under
        ``unreadable`` (job, seq, why); if it has a published Status, it is listed with it
        too, marked ``unreadable`` (that Status is stale).

        Args:
            states: only jobs in one of these states (None: all).
            clusters: only jobs on one of these clusters (None: all).
            after: only jobs with a greater id (a keyset page).
            offset: skip this many of the matching jobs.
            limit: at most this many jobs (None: all).

        Raises:
            BadRequest: a cluster in ``clusters`` that is neither configured nor any job's
                (code ``unknown-cluster``, field ``cluster``; the message names the known).
            NatsStoreError: the stores didn't answer (503 or 500).
        """
        return await self._index.page(
            states=states, clusters=clusters, after=after, offset=offset, limit=limit
        )

    async def aclose(self) -> None:
        """Stop the jobs index's feeds (the stores stay the caller's)."""
        await self._index.aclose()

    async def escalations(
        self, *, delivered: bool | None = None, job_id: str | None = None
    ) -> EscalationList:
        """List escalations across jobs (or of one), oldest first.

        Escalations live in the records, not in Statuses, so every job's record is folded:
        O(all events) on a cold cache, then O(new events) per call (the folds are cached).
        Acceptable at the scale of one site's training jobs; an index kept by a record
        follower would replace it if listings grow hot.

        A job whose record can't be read is listed apart (``unreadable``, naming the job and
        the seq); the others are listed as ever.

        Args:
            delivered: only delivered (True) or undelivered (False) ones; None: all.
            job_id: only this job's.

        Raises:
            UnreadableRecord: ``job_id`` was given and its record can't be read.
        """
        out: list[EscalationView] = []
        unreadable: list[UnreadableJob] = []

        async def load(one: str) -> _Folded | None:
            try:
                return await self._load(one)
            except UnreadableRecord as err:
                unreadable.append(_unreadable(err))
                return None

        if job_id is not None:
            loaded = [await self._load(job_id)]  # this job's own read: its error is the answer
        else:
            loaded = await self._bounded(await self._records.list_jobs(), load)
        for folded in loaded:
            if folded is None:
                continue
            for esc in folded.job.escalations:
                if delivered is None or (esc.delivered is not None) == delivered:
                    out.append(
                        EscalationView(
                            job_id=folded.job.job_id,
                            id=esc.id,
                            at=esc.at,
                            detail=esc.detail,
                            delivered=esc.delivered,
                        )
                    )
        out.sort(key=lambda e: (e.at, e.job_id, e.id))
        return EscalationList(
            escalations=tuple(out), unreadable=tuple(sorted(unreadable, key=lambda u: u.job_id))
        )

    # ----------------------------------------------------------------------- commands

    def _count(self, command: str, outcome: str) -> None:
        self._metrics.commands.labels(command, outcome).inc()

    async def _counted(self, command: str, work: Awaitable[T]) -> T:
        try:
            result = await work
        except ApiError as err:
            self._count(command, _OUTCOMES.get(type(err), "error"))
            raise
        except Exception:
            self._count(command, "error")
            raise
        self._count(command, "replayed" if getattr(result, "replayed", False) else "committed")
        return result

    @staticmethod
    def _msg_base(actor: CoreActor, job_id: str, command: str, key: str | None) -> str:
        if key is None:
            return _MSG_PREFIX + uuid.uuid4().hex
        seed = f"{actor.kind}:{actor.name}\n{job_id}\n{command}\n{key}"
        return _MSG_PREFIX + hashlib.sha256(seed.encode()).hexdigest()[:32]

    async def submit(self, actor: CoreActor, body: bytes, key: str | None) -> SubmitResponse:
        """Submit a job (``POST /v1/jobs``).

        Args:
            actor: who submits.
            body: the request body (:class:`~services.api.schemas.SubmitRequest`).
            key: the request's ``Idempotency-Key``, if any: a retry with the same key (and
                actor) is answered from the first commit; without ``job_id`` the made id is
                derived from the key, so the retry names the same job.

        Raises:
            BadRequest: malformed body, unknown cluster, an option the cluster's backend
                would refuse at launch (``field`` ``spec.options.<key>``), invalid policy
                (code ``invalid-policy``); ``field`` names the place.
            Forbidden: the body asks for an owner other than the actor's Unix user, or
                the cluster may not run jobs as that user (``field`` ``spec.owner``).
            RefusedCommand: the job id is taken.
            Busy: every attempt lost a race.
        """
        return await self._counted("submit", self._submit(actor, body, key))

    def check_submission(self, actor: CoreActor, body: bytes) -> CheckedSubmission:
        """Validate a ``POST /v1/jobs`` body as a submission by ``actor`` would, without
        submitting: the one check both :meth:`submit` and the web page's preview run, so a
        body the preview accepts is one submit accepts (and a refusal is the same 400 with
        the same ``field``).

        Raises:
            BadRequest: malformed body (an unknown field at any depth), unknown cluster, an
                option the cluster's backend would refuse at launch (``field``
                ``spec.options.<key>``), invalid policy (code ``invalid-policy``).
            Forbidden: the body asks for an owner other than the actor's Unix user, or the
                cluster may not run jobs as that user (``field`` ``spec.owner``).
        """
        req = _decode_body(SubmitRequest, body)
        check_spec(req.spec)
        declarations = self._declarations.get(req.spec.cluster)
        if declarations is None:
            known = ", ".join(self.clusters) or "none is configured"
            raise BadRequest(
                f"unknown cluster {req.spec.cluster!r} (known: {known})",
                code="unknown-cluster",
                field="spec.cluster",
            )
        cluster = self._cluster_configs.get(req.spec.cluster)
        if cluster is not None:
            try:
                check_options(cluster, req.spec.options)
            except InvalidOption as err:
                raise BadRequest(str(err), field=f"spec.options.{err.key}") from err
        runs_on = (cluster, *(self._cluster_configs.get(n) for n in policy_clusters(req.policy)))
        owner = self._owner(actor, req.spec.owner, runs_on)
        raw: dict[str, Any] = msgspec.json.decode(body)
        raw["spec"]["owner"] = owner
        command = strict_command(
            {
                "command": "submit",
                "by": msgspec.to_builtins(actor),
                "job_id": req.job_id or "job",
                "spec": raw["spec"],
                "policy": raw.get("policy", {}),
                "declarations": msgspec.to_builtins(declarations),
                "reason": req.reason,
            }
        )
        try:
            plan = make_plan(req.spec, req.policy, declarations)
        except InvalidPolicy as err:
            field = f"policy.rules[{err.rule}]" + (".on" if err.cause else "")
            raise BadRequest(str(err), code="invalid-policy", field=field) from err
        self._check_failover(req.spec, req.policy)
        return CheckedSubmission(request=req, command=command, plan=plan)

    def _check_failover(self, spec: JobSpec, policy: RecoveryPolicy) -> None:
        """Refuse a failover the listed clusters can't carry out (issue 14, part 2).

        Every cluster a rule's ``clusters`` lists must be in the clusters file; its backend
        must accept the spec's options (a failover runs the same spec there); and the
        checkpoint root, when the spec has one, must be reachable from the job's own cluster
        and from every listed one (``dispatch_backends.sees_checkpoint``: an ``s3://`` root
        always, a path only on a cluster whose ``shared_paths`` covers it), or the job
        could not resume from its checkpoints where it fails over to.

        Raises:
            BadRequest: ``unknown-cluster`` (field ``policy.rules[i].clusters``), an option
                a listed cluster's backend refuses (field ``spec.options.<key>``, naming the
                cluster), or ``unreachable-checkpoint`` (field ``spec.checkpoint``, naming
                the root and the cluster).
        """
        listed = policy_clusters(policy)
        if not listed:
            return
        for i, rule in enumerate(policy.rules):
            for name in rule.clusters:
                if name not in self._declarations:
                    known = ", ".join(self.clusters) or "none is configured"
                    raise BadRequest(
                        f"rule {i} fails over to unknown cluster {name!r} (known: {known})",
                        code="unknown-cluster",
                        field=f"policy.rules[{i}].clusters",
                    )
        for name in listed:
            config = self._cluster_configs.get(name)
            if config is None or name == spec.cluster:
                continue  # spec.cluster's options are checked above
            try:
                check_options(config, spec.options)
            except InvalidOption as err:
                raise BadRequest(
                    f"cluster {name!r} (a failover target) would refuse option "
                    f"{err.key!r}: {err.reason}",
                    field=f"spec.options.{err.key}",
                ) from err
        root = spec.checkpoint
        if root is None:
            return
        for name in (spec.cluster, *listed):
            config = self._cluster_configs.get(name)
            if config is not None and not sees_checkpoint(config, root):
                raise BadRequest(
                    f"checkpoint root {root!r} is not reachable from cluster {name!r}, which "
                    "the job may fail over to or from: use an s3:// root, or a path the "
                    f"clusters file lists in {name!r}'s shared_paths",
                    code="unreachable-checkpoint",
                    field="spec.checkpoint",
                )

    async def _submit(self, actor: CoreActor, body: bytes, key: str | None) -> SubmitResponse:
        checked = self.check_submission(actor, body)
        req, command = checked.request, checked.command
        seed = f"{actor.kind}:{actor.name}\n{key}" if key is not None else None
        for _ in range(self._attempts):
            job_id = req.job_id or f"{req.name or 'job'}-{_suffix(seed)}"
            base = self._msg_base(actor, job_id, "submit", key)
            submit = msgspec.structs.replace(command, job_id=job_id)
            made_id = req.job_id is None and seed is None
            folded, done, _ = await self._commit("submit", job_id, base, submit, None, made_id)
            if not done.events and base not in folded.bases:
                continue  # a made id that is taken: make another
            if not done.events:
                assert key is not None  # only a key's base can be in the record already
                await self._check_replay(job_id, "submit", base, submit, key)
                entries = await self._records.read(job_id)
                return SubmitResponse(
                    job_id=job_id,
                    seq=next(e.seq for e in entries if _base_of(e.msg_id) == base),
                    plan=folded.job.plan,
                    status=await self._project(folded.job),
                    replayed=True,
                )
            seq = done.seqs[0]
            log.info(
                "job.submitted",
                extra={"job_id": job_id, "seq": seq, "actor": actor.name},
            )
            return SubmitResponse(
                job_id=job_id, seq=seq, plan=folded.job.plan, status=await self._project(folded.job)
            )
        raise Busy("the job id kept being taken by other submissions; try again")

    async def _commit(
        self,
        name: str,
        job_id: str,
        base: str,
        command: OperatorCommand,
        folded: _Folded | None,
        made_id: bool = False,
    ) -> tuple[_Folded, Committed, Sequence[JobEvent]]:
        """Decide ``command`` on the job's record (``folded``, else read) and commit the
        job's own events (msg ids ``<base>:<i>``), deciding again after each lost race.

        Returns:
            The job as committed, what was committed, and every event decided (a
            supersede's also creates another job). Nothing is committed when the record
            holds this request's earlier commit (a retry), or, with ``made_id``, when the
            job exists (the made id is taken).

        Raises:
            RefusedCommand, Busy, UnreadableRecord: as the commands.
        """
        current = folded
        tries = 0
        made: Sequence[JobEvent] = ()

        async def decided(loaded: Loaded | None) -> list[Change]:
            nonlocal current, tries, made
            tries += 1
            if tries > 1:
                self._metrics.conflicts.labels(name).inc()
                log.info("command.conflict", extra={"job_id": job_id, "command": name})
            if loaded is not None:
                current = self._note(loaded, current.bases if current else frozenset())
                if base in current.bases or made_id:
                    return []  # answered by the record (see Returns)
            job = loaded and loaded.job
            refused = None
            if job is not None and isinstance(command, Supersede):
                refused = self._refused_option(job.spec)
            try:
                made = decide(job, command, self._clock(), job_id=job_id, refused_option=refused)
            except Refused as err:
                raise RefusedCommand(err.reason) from err
            except InvalidPolicy as err:  # a supersede re-makes the plan
                raise RefusedCommand(str(err)) from err
            own = [e for e in made if e.job_id == job_id]
            return [Change(f"{base}:{i}", e) for i, e in enumerate(own)]

        start = None if folded is None else Loaded(folded.job, ())
        try:
            with _reading(job_id):
                done = await self._repo.decide(job_id, decided, loaded=start)
        except TooManyConflicts as err:
            raise Busy(
                f"job {job_id!r}: {name} lost the race to other writers {self._attempts} "
                "times; try again"
            ) from err
        assert done.job is not None
        if not done.events:
            assert current is not None
            return current, done, ()
        known = current.bases if current is not None else frozenset()
        return self._remember(_Folded(done.job, known | {base})), done, made

    async def command(
        self, actor: CoreActor, job_id: str, command: str, body: bytes, key: str | None
    ) -> CommandResponse:
        """Decide an operator command and commit its events (``POST /v1/jobs/{job}/{command}``).

        Args:
            actor: who gives it (recorded with it).
            job_id: the job.
            command: its name: one of :data:`~services.api.schemas.COMMAND_REQUESTS`.
            body: the request body.
            key: the request's ``Idempotency-Key``, if any (see :meth:`submit`).

        Raises:
            NotFound: no such job (or command).
            BadRequest: malformed body; ``field`` names it.
            Forbidden: a service actor abandoning; an actor with a Unix user commanding
                another user's job.
            RefusedCommand: the core refused it (the message is its reason).
            Busy: every attempt lost a race to another writer.
        """
        return await self._counted(command, self._command(actor, job_id, command, body, key))

    async def _command(
        self, actor: CoreActor, job_id: str, name: str, body: bytes, key: str | None
    ) -> CommandResponse:
        request_type = COMMAND_REQUESTS.get(name)
        if request_type is None:
            raise NotFound(f"no command {name!r}; commands: {', '.join(COMMAND_REQUESTS)}")
        if not is_job_id(job_id):
            raise NotFound(f"no job {job_id!r}: not a job id")
        req = _decode_body(request_type, body)
        if name == "abandon" and actor.kind is not ActorKind.HUMAN:
            raise Forbidden(f"only a human may abandon; {actor.name} is a {actor.kind} actor")
        raw: dict[str, Any] = msgspec.json.decode(body) if body.strip() else {}
        raw = {k: v for k, v in raw.items() if k not in ("name", "new_job_id")}
        raw.update(command=name, by=msgspec.to_builtins(actor))
        if name == "supersede":
            raw["new_job_id"] = "job"
        command = strict_command(raw)
        base = self._msg_base(actor, job_id, name, key)
        folded = await self._load(job_id)
        if folded is None:
            raise NotFound(f"no job {job_id!r}")
        self._check_owner(actor, job_id, name, folded.job.spec.owner)
        if base in folded.bases:
            assert key is not None  # only a key's base can be in the record already
            if isinstance(req, SupersedeRequest) and isinstance(command, Supersede):
                # The id this request names or derives from its key (no read: it has a key).
                new_id = req.new_job_id or await self._new_job_id(job_id, req, actor, key)
                command = msgspec.structs.replace(command, new_job_id=new_id)
            await self._check_replay(job_id, name, base, command, key)
            return await self._replay(job_id, name, base)
        if isinstance(req, SupersedeRequest) and isinstance(command, Supersede):
            if folded.job.superseded_by is not None:
                await self._complete_supersede(job_id)
            new_id = await self._new_job_id(job_id, req, actor, key)
            command = msgspec.structs.replace(command, new_job_id=new_id)
        folded, done, made = await self._commit(name, job_id, base, command, folded)
        if not done.events:
            assert key is not None  # only a key's base can be in the record already
            await self._check_replay(job_id, name, base, command, key)
            return await self._replay(job_id, name, base)
        log.info(
            "command.committed",
            extra={"job_id": job_id, "command": name, "actor": actor.name, "seqs": done.seqs},
        )
        new_job_id, plan = None, None
        created = [e for e in made if isinstance(e, JobCreated) and e.job_id != job_id]
        if created:
            new = created[0]
            await self._create(new, f"{base}:0:new")
            new_job_id, plan = new.job_id, new.plan
        return CommandResponse(
            job_id=job_id,
            command=name,
            seq=done.seqs[-1],
            events=tuple(RecordedEvent(seq=s, event=e, writer=_API) for s, e in done.events),
            status=await self._project(folded.job),
            new_job_id=new_job_id,
            plan=plan,
        )

    def _owner(self, actor: CoreActor, asked: str, clusters: Sequence[ClusterConfig | None]) -> str:
        """The ``spec.owner`` of a submission by ``actor`` (issue 16): its Unix user.

        Args:
            actor: who submits.
            asked: the body's ``spec.owner`` (empty: none asked).
            clusters: every cluster the job may run on: ``spec.cluster`` and each cluster a
                failover rule lists (issue 14, part 2); ``None`` for one not configured.

        Raises:
            Forbidden: the body asks for another owner than the actor's Unix user, or a
                cluster's backend may not act for that user (its ``users``).
        """
        mine = self._unix_users.get(actor.name, "")
        if asked and asked != mine:
            mapped = f"Unix user {mine!r}" if mine else "no Unix user"
            raise Forbidden(
                f"actor {actor.name!r} may not submit jobs as Unix user {asked!r} "
                f"(the tokens file maps it to {mapped})",
                field="spec.owner",
            )
        for cluster in clusters:
            if mine and isinstance(cluster, SlurmCluster):
                refused = cluster.refuse_owner(mine)
                if refused is not None:
                    raise Forbidden(
                        f"cluster {cluster.name!r}: {refused} (actor {actor.name!r})",
                        field="spec.owner",
                    )
        return mine

    def _check_owner(self, actor: CoreActor, job_id: str, command: str, owner: str) -> None:
        """An actor with a Unix user may command only its own jobs (and jobs without an
        owner); one without may command any job.

        Raises:
            Forbidden: the job belongs to another Unix user.
        """
        mine = self._unix_users.get(actor.name)
        if mine is not None and owner and owner != mine:
            raise Forbidden(
                f"actor {actor.name!r} (Unix user {mine!r}) may not {command} job {job_id!r}: "
                f"it runs as Unix user {owner!r}"
            )

    def _refused_option(self, spec: JobSpec) -> OptionRefused | None:
        """The first option of ``spec`` its backend now refuses (a job recorded before
        options were checked at submission), for ``decide`` to refuse a supersede with: the
        new job, with the same spec, could only fail at launch. None: all accepted, or the
        cluster is not in the clusters file."""
        cluster = self._cluster_configs.get(spec.cluster)
        if cluster is None:
            return None
        try:
            check_options(cluster, spec.options)
        except InvalidOption as err:
            return OptionRefused(key=err.key, reason=err.reason)
        return None

    async def _new_job_id(
        self, job_id: str, req: SupersedeRequest, actor: CoreActor, key: str | None
    ) -> str:
        """The id of the job a supersede creates: the one asked for (refused if taken), or
        ``<name>-<suffix>`` (derived from the key with one, else random and untaken)."""
        if req.new_job_id is not None:
            # The old job's own id is left to decide, whose refusal says why.
            if req.new_job_id != job_id and await self._records.last_seq(req.new_job_id):
                raise RefusedCommand(
                    f"job {req.new_job_id!r} already exists; give another new_job_id"
                )
            return req.new_job_id
        name = req.name or job_id[:54].rstrip("-")
        seed = f"{actor.kind}:{actor.name}\n{job_id}\nsupersede\n{key}" if key else None
        for _ in range(self._attempts):
            new_id = f"{name}-{_suffix(seed)}"
            if seed is not None or not await self._records.last_seq(new_id):
                return new_id
        raise Busy("could not make an untaken job id; give new_job_id")

    async def _create(self, created: JobCreated, msg_id: str) -> int:
        """Append a superseding job's creation to its (new) record; idempotent by msg id."""
        try:
            done = await self._repo.commit(created.job_id, None, [Change(msg_id, created)])
        except ConcurrencyConflict as err:
            log.error(
                "supersede.new_job_taken",
                extra={"job_id": created.supersedes, "new_job_id": created.job_id},
            )
            raise RefusedCommand(
                f"job {created.job_id!r} was created by someone else while "
                f"{created.supersedes!r} was being superseded by it; the old job names it as "
                "its successor: check both records"
            ) from err
        assert done.job is not None
        self._remember(_Folded(done.job, frozenset()))
        return done.seqs[0]

    async def _complete_supersede(self, job_id: str) -> JobCreated | None:
        """Finish a supersede whose new job's creation was never appended (a crash between
        the two appends): decide it again against the record as it was before
        ``Superseded``, and append the new job's creation.

        The old job's ``Superseded`` is appended first (its optimistic concurrency makes two
        racing supersedes of one job impossible); the new record second, so a crash in
        between leaves a link to a job with no record, which this repairs, never an orphan
        job that runs beside the one its predecessor names.

        Returns:
            The new job's creation, if this appended it.
        """
        with _reading(job_id):
            stored = await self._repo.events(job_id)
        at = next((i for i, s in enumerate(stored) if isinstance(s.event, Superseded)), None)
        if at is None:
            return None
        superseded, entry = stored[at].event, stored[at].entry
        assert isinstance(superseded, Superseded)
        if await self._records.last_seq(superseded.new_job):
            return None
        with _reading(job_id):
            before = fold([s.item for s in stored[:at]], self._clock())
        redo = Supersede(by=superseded.by, reason=superseded.reason, new_job_id=superseded.new_job)
        created = next(e for e in decide(before, redo, superseded.at) if isinstance(e, JobCreated))
        msg_id = entry.msg_id or f"repair-{job_id}-{entry.seq}"
        await self._create(created, f"{msg_id}:new")
        log.warning(
            "supersede.completed",
            extra={"job_id": job_id, "new_job_id": superseded.new_job},
        )
        return created

    async def _check_replay(
        self, job_id: str, name: str, base: str, command: OperatorCommand, key: str
    ) -> None:
        """Refuse a retry whose request differs from the one its key first committed.

        The core decides deterministically: the new request, decided against the record as
        it stood before the first try's events and at their time, gives the events the first
        try committed exactly when it asks the same (for a submit: the same spec, policy and
        submitter; the plan and the backend's declarations may have changed since).

        Raises:
            IdempotencyKeyReused: it gives other events, or is refused there.
        """
        with _reading(job_id):
            stored = await self._repo.events(job_id)
        first = next((i for i, s in enumerate(stored) if _base_of(s.entry.msg_id) == base), None)
        if first is None:
            return
        recorded = [s.event for s in stored if _base_of(s.entry.msg_id) == base]
        at = recorded[0].at
        with _reading(job_id):
            before = fold([s.item for s in stored[:first]], at) if first else None
        try:
            again = decide(before, command, at, job_id=job_id)
        except (Refused, InvalidPolicy) as err:
            raise IdempotencyKeyReused(key, job_id, name) from err
        mine = [e for e in again if e.job_id == job_id]
        if [_asked(e) for e in mine] != [_asked(e) for e in recorded]:
            raise IdempotencyKeyReused(key, job_id, name)

    async def _replay(self, job_id: str, name: str, base: str) -> CommandResponse:
        """Answer a retried request from the events its first try committed."""
        with _reading(job_id):
            stored = await self._repo.events(job_id)
        mine = [_recorded(s) for s in stored if _base_of(s.entry.msg_id) == base]
        new_job_id, plan = None, None
        for rec in mine:
            if isinstance(rec.event, Superseded):
                new_job_id = rec.event.new_job
                await self._complete_supersede(job_id)
                new = await self._load(new_job_id)
                plan = new.job.plan if new is not None else None
        folded = await self._load(job_id)
        assert folded is not None
        return CommandResponse(
            job_id=job_id,
            command=name,
            seq=mine[-1].seq if mine else folded.job.seq,
            events=tuple(mine),
            status=await self._project(folded.job),
            new_job_id=new_job_id,
            plan=plan,
            replayed=True,
        )

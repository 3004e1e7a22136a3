"""The folded job and the status a caller reads (DESIGN.md section 3).

``fold`` replays a record into a :class:`Job`; ``project`` combines a Job with a
:class:`~dispatch_core.state.Discovery` into a :class:`Status`. Both types are frozen and
hold tuples, so a Job can be shared between passes and processes.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final, Self, TypeVar

import msgspec

from dispatch_core.events import AbandonTarget, ProgressObserved
from dispatch_core.state import (
    Action,
    Actor,
    Cause,
    Declarations,
    HoldKind,
    JobSpec,
    Level,
    ObjectRef,
    Plan,
    RecoveryPolicy,
    State,
    UtcDatetime,
)

__all__ = [
    "STATUS_HISTORY_LIMIT",
    "Attempt",
    "Escalation",
    "Hold",
    "HoldView",
    "Indexed",
    "Job",
    "LaunchOutcome",
    "Marked",
    "ObjectRecord",
    "Recovery",
    "Status",
    "Submission",
    "Transition",
    "index_of",
    "marks_of",
    "recovery_kind",
    "submission_kind",
    "tally_of",
    "unconfirmed",
    "undelivered",
    "unknown_launch",
]

_T = TypeVar("_T")

STATUS_HISTORY_LIMIT: Final = 50
"""How many of a job's latest transitions a :class:`Status` carries (``Status.history``);
``Status.history_total`` says how many the record holds. The whole history is the record's
(``GET /v1/jobs/<job>/record``), so a Status stays small however long the job lives (issue 11:
a Status carrying every transition would pass NATS's 1 MB message limit near 35,000 events)."""


class Marked(tuple[_T, ...]):
    """A tuple of a folded Job that carries, in order, the positions of its items that are
    still open (``marks``: the objects whose end the scheduler hasn't confirmed, the
    submissions with a launch of unknown outcome, the escalations undelivered), and how many
    items it holds of each kind (``tally``: recoveries by rule and nativeness, submissions
    by why). ``fold`` keeps both as it goes, so the planner visits what is open and counts
    in one step, not by going through everything the record ever held. Each version of the
    job has its own. On the wire it is a plain array.
    """

    marks: tuple[int, ...]
    tally: Mapping[Hashable, int]

    def __new__(
        cls, items: Iterable[_T], marks: tuple[int, ...], tally: Mapping[Hashable, int]
    ) -> Self:
        self = super().__new__(cls, items)
        self.marks = marks
        self.tally = tally
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self), self.marks, self.tally))


class Indexed(Marked[_T]):
    """A :class:`Marked` tuple (``objects``, ``escalations``) that also carries its index:
    the position of each item by key (an object's ref, an escalation's id).

    ``fold`` builds the index once and shares it with every later version of the job,
    adding only the new keys, so a lookup is a dict access and a new version costs nothing
    per item it already held. Because versions share it, the index may hold keys of other
    versions (another fold of the same prior, or a later version): a position is trusted
    only when this tuple's item there has the key. An entry in a shared index is never
    changed, so each of this tuple's keys maps to its own position.
    """

    at: dict[Hashable, int]

    def __new__(
        cls,
        items: Iterable[_T],
        marks: tuple[int, ...],
        tally: Mapping[Hashable, int],
        at: dict[Hashable, int],
    ) -> Self:
        self = super().__new__(cls, items, marks, tally)
        self.at = at
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self), self.marks, self.tally, self.at))


def index_of(items: tuple[_T, ...], key: Callable[[_T], Hashable]) -> dict[Hashable, int]:
    """The index of ``items`` by ``key``: its own when ``items`` is :class:`Indexed`, else a
    new one (the first of two items with one key wins, as a linear scan would find it)."""
    if isinstance(items, Indexed):
        return items.at
    at: dict[Hashable, int] = {}
    for i, item in enumerate(items):
        at.setdefault(key(item), i)
    return at


def marks_of(items: tuple[_T, ...], is_open: Callable[[_T], bool]) -> tuple[int, ...]:
    """The positions of the open items: its own when ``items`` is :class:`Marked`, else
    found (``is_open`` must be the predicate ``fold`` marks that tuple with)."""
    if isinstance(items, Marked):
        return items.marks
    return tuple(i for i, item in enumerate(items) if is_open(item))


def tally_of(items: tuple[_T, ...], kind: Callable[[_T], Hashable]) -> Mapping[Hashable, int]:
    """How many items of each kind: its own when ``items`` is :class:`Marked`, else counted
    (``kind`` must be the one ``fold`` tallies that tuple by)."""
    if isinstance(items, Marked):
        return items.tally
    tally: dict[Hashable, int] = {}
    for item in items:
        k = kind(item)
        tally[k] = tally.get(k, 0) + 1
    return tally


def recovery_kind(recovery: Recovery) -> Hashable:
    """What recoveries are tallied by: their rule, and whether the backend made it; a free
    one (issue 14) also by that, so ``spent`` leaves it out."""
    if recovery.free:
        return (recovery.rule, recovery.native, "free")
    return (recovery.rule, recovery.native)


def submission_kind(sub: Submission) -> Hashable:
    """What submissions are tallied by: why each was opened."""
    return str(sub.why)


def unconfirmed(obj: ObjectRecord) -> bool:
    """Whether the record holds no end of the object the scheduler reported: no execution
    recorded ended, or only the fence's (gone is not ended, issue 15)."""
    return obj.fenced or not obj.ended


def unknown_launch(sub: Submission) -> bool:
    """Whether a launch attempt of the submission has an unknown outcome."""
    return any(a.outcome is LaunchOutcome.UNKNOWN for a in sub.attempts)


def undelivered(esc: Escalation) -> bool:
    """Whether no channel has accepted the escalation yet."""
    return esc.delivered is None


def _find(
    items: tuple[_T, ...], at: dict[Hashable, int], k: Hashable, key: Callable[[_T], Any]
) -> _T | None:
    """The item of ``items`` with key ``k`` through the index ``at``, or ``None``."""
    i = at.get(k)
    if i is not None and i < len(items):
        item = items[i]
        if key(item) == k:
            return item
    return None  # absent, or another version's key (see Indexed)


def _ref_of(obj: ObjectRecord) -> Hashable:
    return obj.ref


def _id_of(esc: Escalation) -> Hashable:
    return esc.id


class LaunchOutcome(enum.StrEnum):
    """What the record knows of one launch attempt.

    ``unknown``: intended, and neither an object nor a refusal is recorded (in flight,
    crashed between intent and call, or the call's outcome was unknown). ``launched``: an
    object is recorded for it. ``refused``: the scheduler refused it. ``abandoned``: a
    person closed it while unknown (seed 002).
    """

    UNKNOWN = "unknown"
    LAUNCHED = "launched"
    REFUSED = "refused"
    ABANDONED = "abandoned"


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """One launch attempt of a submission.

    Attributes:
        submission: N.
        attempt: a, 1 for the first attempt of a submission.
        intended_at: when the intent was committed; the unresolved age runs from here.
        outcome: see :class:`LaunchOutcome`.
        ref: the object it made, once known.
        detail: the scheduler's words for a refusal, or the error of an unknown outcome.
        unknown_at: when a start last came back with an unknown outcome (``LaunchUnknown``),
            ``None`` while no start has answered (in flight, or the launcher crashed).
    """

    submission: int
    attempt: int
    intended_at: UtcDatetime
    outcome: LaunchOutcome = LaunchOutcome.UNKNOWN
    ref: ObjectRef | None = None
    detail: str = ""
    unknown_at: UtcDatetime | None = None


class Submission(msgspec.Struct, frozen=True, kw_only=True):
    """One submission of the job: N, why it was opened, and its launch attempts.

    ``cluster`` is the cluster it runs on when that is not ``spec.cluster`` (a failover,
    issue 14 part 2), else ``None``; ``dispatch_core.failover.cluster_of`` resolves it.
    """

    number: int
    opened_at: UtcDatetime
    why: str
    cause: Cause | None = None
    attempts: tuple[Attempt, ...] = ()
    cluster: str | None = None


class ObjectRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the record holds about one of dispatch's objects.

    Attributes:
        ref: the object.
        submission, attempt: the launch that made it.
        gate_opened_at: when dispatch opened its gate.
        stop_requested_at: the last time dispatch asked for it to stop, and ``stop_why``.
        emergency_stop_at: the last emergency stop of it.
        node_loss_since: when its current node-loss window began (``NodeLossObserved``:
            first seen running with cause node-lost), with ``node_loss_restart`` the
            execution that was on the lost node; ``None`` when no window is open (never seen
            so, or seen running since without node-lost).
        ended: the restart counts R of its executions recorded as ended.
        fenced: whether an execution was ended by the node-loss fence.
        cessation_asked_at: the last cessation answer's time; ``ceased`` the answer.
        duplicate: whether the object is a duplicate the record never launched (stopped
            with why ``duplicate``, or seen ended): its ends are recorded but never drive
            recovery; ``submission``/``attempt`` are then as read from it (0 when unknown).
        first_stop_requested_at: the first time dispatch asked for it to stop (re-asks keep
            it); ``stop-overdue:<object id>`` counts ``JobSpec.stop_overdue_s`` from it.
        stop_cause: the cause of a ``no-capacity`` stop (``StopRequested.cause``; re-asks
            keep it): a ``cancelled`` end of the object stopped for it is recorded with it.
        no_capacity_since: when its current no-capacity wait began (``NoCapacityObserved``:
            first seen pending, gate open, with cause ``no-capacity``); ``None`` when no
            wait runs (never seen so, or seen since without it).
    """

    ref: ObjectRef
    submission: int
    attempt: int
    gate_opened_at: UtcDatetime | None = None
    stop_requested_at: UtcDatetime | None = None
    stop_why: str = ""
    emergency_stop_at: UtcDatetime | None = None
    node_loss_since: UtcDatetime | None = None
    node_loss_restart: int | None = None
    ended: tuple[int, ...] = ()
    fenced: bool = False
    cessation_asked_at: UtcDatetime | None = None
    ceased: bool | None = None
    duplicate: bool = False
    first_stop_requested_at: UtcDatetime | None = None
    stop_cause: Cause | None = None
    no_capacity_since: UtcDatetime | None = None


class Recovery(msgspec.Struct, frozen=True, kw_only=True):
    """A committed recovery: which rule spent its budget on which cause."""

    at: UtcDatetime
    rule: int
    action: Action
    cause: Cause
    native: bool = False
    free: bool = False
    """Spent nothing of the rule's budget (``free_if_progress``, issue 14)."""


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """A hold placed on the job, and its release if it has ended (seed 002)."""

    instance: int
    kind: HoldKind
    by: Actor
    reason: str
    placed_at: UtcDatetime
    deadline: UtcDatetime
    cause: Cause | None = None
    rule: int | None = None
    substituted_for: Action | None = None
    released_at: UtcDatetime | None = None
    released_by: Actor | None = None
    released_how: str = ""
    override: bool = False

    @property
    def active(self) -> bool:
        """Whether the hold is still in force."""
        return self.released_at is None


class Escalation(msgspec.Struct, frozen=True, kw_only=True):
    """dispatch asking a person to decide something (seed 002).

    Attributes:
        id: unique per job; its prefix says what happened (``overdue:``, ``all-unknown:``,
            ``unmatched:``, ``foreign:``, ``admin-held:``, ``failed:``, ``refused:``,
            ``cleanup-deadline``, ``stop-overdue:``, ``give-up``).
        at: when it was committed.
        detail: the sentence for the person.
        delivered: when a channel accepted it, or ``None``.
    """

    id: str
    at: UtcDatetime
    detail: str
    delivered: UtcDatetime | None = None


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """A transition committed to the record: a recovery, a hold or release, an outcome.

    ``Status.history`` holds these, never "running": whether a job runs is what the
    scheduler shows now (seed 000, "Where the state comes from").
    """

    at: UtcDatetime
    state: State
    cause: Cause
    detail: str = ""


class Job(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """A job's record, folded (seed 000, ``Fold``).

    Attributes:
        job_id: the job.
        seq: stream sequence of the last event folded in.
        spec, policy, plan, declarations: from creation.
        generation: G of the epoch.
        supersedes: the job this one supersedes; ``superseded_by`` the job that superseded
            this one.
        created_at, created_by: creation.
        submissions: every submission, in order.
        objects: every object the record knows of (launched or found).
        recoveries: every committed recovery, in order.
        holds: every hold, in order; at most the last is active.
        outcome: the committed outcome, with ``outcome_cause`` and ``outcome_at``.
        cancel_requested_at, cancelled_by: the cancel, when there was one.
        emergency_stop_at: the last emergency stop request.
        abandoned: the targets a person abandoned.
        escalations: every escalation, in commit order.
        history: the committed transitions, in order.
        ended_cause: the cause of the last execution the record shows ended (duplicates
            aside), or ``None`` while none has ended; a recovering job shows it (seed 000).
        progress: the job's publications each time one of its executions ended (issue 14),
            in order.

    ``object`` and ``escalation`` look up by index (:class:`Indexed`): built once per record
    by ``fold`` and carried by every later version, or built at the first lookup of a Job
    that didn't come from ``fold`` (decoded, or built by hand).
    """

    job_id: str
    seq: int
    spec: JobSpec
    policy: RecoveryPolicy
    plan: Plan
    declarations: Declarations
    generation: int
    supersedes: str | None
    superseded_by: str | None
    created_at: UtcDatetime
    created_by: Actor
    submissions: tuple[Submission, ...] = ()
    objects: tuple[ObjectRecord, ...] = ()
    recoveries: tuple[Recovery, ...] = ()
    holds: tuple[Hold, ...] = ()
    outcome: State | None = None
    outcome_cause: Cause | None = None
    outcome_at: UtcDatetime | None = None
    cancel_requested_at: UtcDatetime | None = None
    cancelled_by: Actor | None = None
    emergency_stop_at: UtcDatetime | None = None
    abandoned: tuple[AbandonTarget, ...] = ()
    escalations: tuple[Escalation, ...] = ()
    history: tuple[Transition, ...] = ()
    ended_cause: Cause | None = None
    progress: tuple[ProgressObserved, ...] = ()

    @property
    def hold(self) -> Hold | None:
        """The hold in force, or ``None``."""
        if self.holds and self.holds[-1].active:
            return self.holds[-1]
        return None

    @property
    def submission(self) -> Submission | None:
        """The current (latest) submission, or ``None`` before the first."""
        return self.submissions[-1] if self.submissions else None

    def object(self, ref: ObjectRef) -> ObjectRecord | None:
        """Return the record's entry for ``ref``, or ``None`` (a dict lookup)."""
        return _find(self.objects, self._objects_at, ref, _ref_of)

    def escalation(self, escalation_id: str) -> Escalation | None:
        """Return the escalation with ``escalation_id``, or ``None`` (a dict lookup)."""
        return _find(self.escalations, self._escalations_at, escalation_id, _id_of)

    def objects_among(self, refs: Iterable[ObjectRef]) -> list[ObjectRecord]:
        """The record's entries for those of ``refs`` it holds, in record order (each once)."""
        at = self._objects_at
        objects = self.objects
        found: set[int] = set()
        for ref in refs:
            i = at.get(ref)
            if i is not None and i < len(objects) and objects[i].ref == ref:
                found.add(i)
        return [objects[i] for i in sorted(found)]

    def first_launched(self, number: int) -> ObjectRecord | None:
        """The first object (in record order) launched for submission ``number`` and not a
        duplicate, or ``None``: the objects a ``launch.recorded`` made for its attempts."""
        if not 1 <= number <= len(self.submissions):
            return None
        refs = [a.ref for a in self.submissions[number - 1].attempts if a.ref is not None]
        launched = [o for o in self.objects_among(refs) if not o.duplicate]
        return launched[0] if launched else None

    def unconfirmed_objects(self) -> list[ObjectRecord]:
        """The objects whose end the record doesn't hold from the scheduler (none recorded,
        or only the fence's), in record order."""
        return [self.objects[i] for i in self._unconfirmed]

    def unknown_submissions(self) -> list[Submission]:
        """The submissions with a launch attempt of unknown outcome, in order."""
        return [self.submissions[i] for i in self._unknown]

    @functools.cached_property
    def _unconfirmed(self) -> tuple[int, ...]:
        return marks_of(self.objects, unconfirmed)

    @functools.cached_property
    def _unknown(self) -> tuple[int, ...]:
        return marks_of(self.submissions, unknown_launch)

    @functools.cached_property
    def _objects_at(self) -> dict[Hashable, int]:
        return index_of(self.objects, _ref_of)

    @functools.cached_property
    def _escalations_at(self) -> dict[Hashable, int]:
        return index_of(self.escalations, _id_of)

    def spent(self, rule: int) -> int:
        """How much of rule ``rule``'s budget its recoveries spent (a ``free`` one, issue 14,
        spends nothing: it is tallied apart)."""
        tally = self._recoveries_tally
        return tally.get((rule, False), 0) + tally.get((rule, True), 0)

    def recoveries_made(self, *, native: bool) -> int:
        """How many recoveries the backend made natively (``native``), or the supervisor."""
        made = 0
        for kind, n in self._recoveries_tally.items():
            if isinstance(kind, tuple) and kind[1] == native:
                made += n
        return made

    def submissions_opened(self, *whys: str) -> int:
        """How many submissions were opened for any of ``whys``."""
        tally = self._submissions_tally
        return sum(tally.get(why, 0) for why in whys)

    @functools.cached_property
    def _recoveries_tally(self) -> Mapping[Hashable, int]:
        return tally_of(self.recoveries, recovery_kind)

    @functools.cached_property
    def _submissions_tally(self) -> Mapping[Hashable, int]:
        return tally_of(self.submissions, submission_kind)


class HoldView(msgspec.Struct, frozen=True, kw_only=True):
    """The hold in force, as a Status shows it (``Status.Hold.Kind`` in seed 002)."""

    instance: int
    kind: HoldKind
    by: Actor
    reason: str
    since: UtcDatetime
    deadline: UtcDatetime
    overdue: bool
    cause: Cause | None = None
    substituted_for: Action | None = None


class Status(msgspec.Struct, frozen=True, kw_only=True):
    """What a caller reads of a job (seed 000, ``Project``).

    Attributes:
        job_id: the job.
        level: ``full`` from the record, ``object-only`` from the scheduler alone.
        state: the coarse state.
        cause: why it is in that state; kind ``none`` when there is nothing to say.
        at: the ``now`` it was projected at.
        seq: the record sequence it reflects (0 for object-only).
        hold: the hold in force.
        history: the latest committed transitions (recoveries, holds, outcomes), oldest
            first: at most ``STATUS_HISTORY_LIMIT`` of them; the record holds them all.
        supersedes: the job this one supersedes; ``superseded_by`` the one superseding it.
        submission: N of the current submission.
        epoch: ``DISPATCH_EPOCH`` of the current execution, when one is known.
        objects: the refs of the job's live objects.
        settled: whether the job has an outcome and nothing of it can still act.
        published_step: the latest published step a progress fact recorded (issue 14), and
            ``published_at`` when its ``pub/`` listing was read; ``None`` when none did.
        history_total: how many transitions the record holds; the ``history`` shown are the
            last of them. 0 in a Status written before the history was bounded, whose
            ``history`` is the whole history (see :attr:`history_count`).
        cluster: the cluster the current submission runs on (``spec.cluster`` unless a
            failover moved the job, issue 14 part 2); ``None`` for object-only.
    """

    job_id: str
    level: Level
    state: State
    cause: Cause
    at: UtcDatetime
    seq: int = 0
    hold: HoldView | None = None
    history: tuple[Transition, ...] = ()
    supersedes: str | None = None
    superseded_by: str | None = None
    submission: int | None = None
    epoch: int | None = None
    objects: tuple[ObjectRef, ...] = ()
    settled: bool = False
    history_total: int = 0
    published_step: int | None = None
    published_at: UtcDatetime | None = None
    cluster: str | None = None

    @property
    def history_count(self) -> int:
        """How many transitions the record holds (also for a Status written before
        ``history_total`` existed, which carried them all)."""
        return max(self.history_total, len(self.history))

    @property
    def history_omitted(self) -> int:
        """How many of the earliest transitions this Status leaves out of ``history``."""
        return self.history_count - len(self.history)

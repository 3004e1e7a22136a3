"""``fold``: replay a job's record into a :class:`~dispatch_core.job.Job` (seed 000, "Where the
state comes from"; docs/core-semantics.md, "fold").

Folding records facts: it never rejects a well-formed event because of what the event
decides (the planner and ``decide`` only commit legal events). It refuses a record dispatch
could not have written: a sequence that doesn't increase, a first event that isn't
``job.created``, a second ``job.created``, an event of another job, or an event that
references something that does not exist (an attempt never intended, a hold never placed, a
second outcome). Nothing is skipped.

The fold runs on a private accumulator over the prior job (or an empty one) and freezes it
into a ``Job`` once, at the end, so a 1,000-event record folds in linear time. The
accumulator shares the prior job's tuples and indexes and keeps what the new events append
or edit beside them, so folding events into a long job (``prior=``, :func:`fold_one`) costs
what those events change, not what the job already holds (issue 11, "Fold that is truly
incremental").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Final, Generic, Protocol, TypeVar, assert_never

from msgspec.structs import replace

from dispatch_core.errors import MalformedRecord, OutOfOrderEvent, WriterRefused
from dispatch_core.events import (
    Abandoned,
    AbandonTarget,
    CancelRequested,
    CessationObserved,
    EmergencyStopRequested,
    EscalationCommitted,
    EscalationDelivered,
    ExecutionEnded,
    GateOpened,
    GaveUp,
    HoldPlaced,
    HoldReleased,
    JobCreated,
    JobEvent,
    LaunchIntended,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
    NoCapacityObserved,
    NodeLossObserved,
    OutcomeCommitted,
    ProgressObserved,
    RecoveryCommitted,
    StopRequested,
    SubmissionOpened,
    Superseded,
)
from dispatch_core.job import (
    Attempt,
    Escalation,
    Hold,
    Indexed,
    Job,
    LaunchOutcome,
    Marked,
    ObjectRecord,
    Recovery,
    Submission,
    Transition,
    index_of,
    marks_of,
    recovery_kind,
    submission_kind,
    tally_of,
    unconfirmed,
    undelivered,
    unknown_launch,
)
from dispatch_core.state import (
    Cause,
    CauseKind,
    ObjectRef,
    Provenance,
    State,
)
from dispatch_core.writers import WRITERS, WriterKind, event_tag, writers_of

__all__ = ["RecordItem", "fold", "fold_one"]

RecordItem = tuple[int, JobEvent, WriterKind]
"""One event of a record as ``fold`` takes it: its stream seq, the event, and the kind of
writer that appended it (contract v2's record subject says which)."""


_T = TypeVar("_T")


def _never(item: object) -> bool:
    return False


def _nothing(item: object) -> Hashable:
    return None


class _Vec(Generic[_T]):
    """A tuple of the prior job being changed: appends and edits are kept beside it, so a
    fold that appends one transition to a 10,000-transition history does no work per
    transition held (the prior's tuple is shared, never thawed); :meth:`freeze` builds the
    new tuple once, and returns the prior's own tuple when nothing changed."""

    __slots__ = ("added", "base", "edits", "is_open", "kind", "n")

    def __init__(
        self,
        base: tuple[_T, ...],
        is_open: Callable[[_T], bool] = _never,
        kind: Callable[[_T], Hashable] = _nothing,
    ) -> None:
        self.base = base
        self.n = len(base)  # the hot paths compare with it: kept, not asked
        self.added: list[_T] = []
        self.edits: dict[int, _T] = {}
        self.is_open = is_open
        self.kind = kind

    def __len__(self) -> int:
        return self.n + len(self.added)

    def __getitem__(self, i: int) -> _T:
        """Item ``i`` (``0 <= i < len``, or -1 for the last)."""
        n = self.n
        if i < 0:
            i += n + len(self.added)
        if i >= n:
            return self.added[i - n]
        if self.edits:
            edited = self.edits.get(i)
            if edited is not None:
                return edited
        return self.base[i]

    def __setitem__(self, i: int, value: _T) -> None:
        n = self.n
        if i < 0:
            i += n + len(self.added)
        if i >= n:
            self.added[i - n] = value
        else:
            self.edits[i] = value

    def __iter__(self) -> Iterator[_T]:
        for i in range(len(self.base)):
            yield self[i]
        yield from self.added

    def append(self, value: _T) -> None:
        self.added.append(value)

    def freeze(self) -> tuple[_T, ...]:
        base = self.base
        if self.edits:
            if len(self.edits) == 1:
                ((i, value),) = self.edits.items()
                base = (*base[:i], value, *base[i + 1 :])
            else:
                items = list(base)
                for i, value in self.edits.items():
                    items[i] = value
                base = tuple(items)
        return (*base, *self.added) if self.added else base

    def marks(self) -> tuple[int, ...]:
        """The open items' positions (:class:`~dispatch_core.job.Marked`): the prior's,
        with those of the items this fold edited or added found again."""
        is_open = self.is_open
        prior = marks_of(self.base, is_open)
        if not self.edits and not self.added:
            return prior
        n = len(self.base)
        new = [n + j for j, item in enumerate(self.added) if is_open(item)]
        if not self.edits:
            return (*prior, *new) if new else prior
        kept = [i for i in prior if i not in self.edits]
        kept += [i for i, item in self.edits.items() if is_open(item)]
        return (*sorted(kept), *new)

    def tally(self) -> Mapping[Hashable, int]:
        """How many items of each kind (:class:`~dispatch_core.job.Marked`): the prior's,
        with this fold's edits and additions counted."""
        kind = self.kind
        prior = tally_of(self.base, kind)
        if not self.edits and not self.added:
            return prior
        tally = dict(prior)
        for i, item in self.edits.items():
            before, after = kind(self.base[i]), kind(item)
            if before != after:
                tally[before] -= 1
                tally[after] = tally.get(after, 0) + 1
        for item in self.added:
            k = kind(item)
            tally[k] = tally.get(k, 0) + 1
        return tally

    def freeze_marked(self) -> tuple[_T, ...]:
        if not self.edits and not self.added and isinstance(self.base, Marked):
            return self.base
        return Marked(self.freeze(), self.marks(), self.tally())


class _Keyed(_Vec[_T]):
    """A :class:`_Vec` whose items are found by key through the job's index
    (:class:`~dispatch_core.job.Indexed`).

    The prior job's index is shared and only ever added to: an entry, once in a shared
    index, is never changed (``dict.setdefault`` claims it in one step, so two folds of one
    prior, even in two threads, can't both think they put the same key in). A fold that
    finds its new key already placed elsewhere by another fold of the same prior takes a
    private copy of the index. So for every version of the job, each of its keys maps to
    its own position, and an entry that points elsewhere is another version's key.
    """

    __slots__ = ("at", "key", "owned")

    def __init__(
        self, base: tuple[_T, ...], key: Callable[[_T], Hashable], is_open: Callable[[_T], bool]
    ) -> None:
        super().__init__(base, is_open)
        self.key = key
        self.at: dict[Hashable, int] = index_of(base, key)
        self.owned = not isinstance(base, Indexed)  # index_of built a new one

    def find(self, k: Hashable) -> int | None:
        """The position of the item with key ``k``, or ``None``."""
        i = self.at.get(k)
        if i is not None and i < self.n + len(self.added) and self.key(self[i]) == k:
            return i
        return None  # absent, or another version's key

    def add(self, value: _T) -> None:
        """Append ``value``, whose key is new to this version of the job."""
        k, i = self.key(value), len(self)
        if self.owned:
            self.at[k] = i
        elif self.at.setdefault(k, i) != i:
            # Another fold of an earlier version put this key elsewhere: keep that entry
            # for that fold, and go on with a private copy.
            self.at = dict(self.at)
            self.at[k] = i
            self.owned = True
        self.added.append(value)

    def freeze_indexed(self) -> tuple[_T, ...]:
        base = self.base
        if not self.edits and not self.added and isinstance(base, Indexed) and base.at is self.at:
            return base
        return Indexed(self.freeze(), self.marks(), self.tally(), self.at)


class _Fresh(list[_T]):
    """The twin of :class:`_Vec` for a record folded from its beginning: a plain list
    (its lookups and appends run at C speed, the full fold's hot path) with the same
    freezing."""

    __slots__ = ("is_open", "kind")

    def __init__(
        self, is_open: Callable[[_T], bool] = _never, kind: Callable[[_T], Hashable] = _nothing
    ) -> None:
        super().__init__()
        self.is_open = is_open
        self.kind = kind

    def freeze(self) -> tuple[_T, ...]:
        return tuple(self)

    def freeze_marked(self) -> tuple[_T, ...]:
        return Marked(self, *self._derived())

    def _derived(self) -> tuple[tuple[int, ...], dict[Hashable, int]]:
        is_open, kind = self.is_open, self.kind
        tally: dict[Hashable, int] = {}
        for item in self:
            k = kind(item)
            tally[k] = tally.get(k, 0) + 1
        return tuple(i for i, item in enumerate(self) if is_open(item)), tally


class _FreshKeyed(_Fresh[_T]):
    """:class:`_Fresh` with the index :class:`_Keyed` keeps (this fold's own)."""

    __slots__ = ("at", "key")

    def __init__(
        self, key: Callable[[_T], Hashable], is_open: Callable[[_T], bool] = _never
    ) -> None:
        super().__init__(is_open)
        self.key = key
        self.at: dict[Hashable, int] = {}

    def find(self, k: Hashable) -> int | None:
        return self.at.get(k)

    def add(self, value: _T) -> None:
        self.at[self.key(value)] = len(self)
        self.append(value)

    def freeze_indexed(self) -> tuple[_T, ...]:
        return Indexed(self, *self._derived(), self.at)


class _Items(Protocol[_T]):
    """What ``_apply`` uses of a tuple being folded (:class:`_Vec` or :class:`_Fresh`)."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> _T: ...
    def __setitem__(self, i: int, value: _T, /) -> None: ...
    def append(self, value: _T, /) -> None: ...
    def freeze(self) -> tuple[_T, ...]: ...
    def freeze_marked(self) -> tuple[_T, ...]: ...


class _KeyedItems(_Items[_T], Protocol[_T]):
    """:class:`_Items` found by key (:class:`_Keyed` or :class:`_FreshKeyed`)."""

    def find(self, k: Hashable) -> int | None: ...
    def add(self, value: _T) -> None: ...
    def freeze_indexed(self) -> tuple[_T, ...]: ...


def _object_key(obj: ObjectRecord) -> Hashable:
    return obj.ref


def _escalation_key(esc: Escalation) -> Hashable:
    return esc.id


class _Acc:
    """The job being folded: the prior job's scalars, and its tuples as :class:`_Vec`s that
    share them. Building one from a Job and freezing it again costs O(fields), not O(job)."""

    __slots__ = (
        "abandoned",
        "cancel_requested_at",
        "cancelled_by",
        "created_at",
        "created_by",
        "declarations",
        "emergency_stop_at",
        "ended_cause",
        "escalations",
        "generation",
        "history",
        "holds",
        "job_id",
        "objects",
        "outcome",
        "outcome_at",
        "outcome_cause",
        "plan",
        "policy",
        "progress",
        "recoveries",
        "seq",
        "spec",
        "submissions",
        "superseded_by",
        "supersedes",
    )

    def __init__(self, job: Job, *, fresh: bool = False) -> None:
        self.job_id, self.seq = job.job_id, job.seq
        self.spec, self.policy, self.plan = job.spec, job.policy, job.plan
        self.declarations, self.generation = job.declarations, job.generation
        self.supersedes, self.superseded_by = job.supersedes, job.superseded_by
        self.created_at, self.created_by = job.created_at, job.created_by
        self.submissions: _Items[Submission]
        self.objects: _KeyedItems[ObjectRecord]
        self.recoveries: _Items[Recovery]
        self.holds: _Items[Hold]
        self.abandoned: _Items[AbandonTarget]
        self.escalations: _KeyedItems[Escalation]
        self.history: _Items[Transition]
        self.progress: _Items[ProgressObserved]
        if fresh:  # a record folded from its beginning: plain lists
            self.submissions = _Fresh(unknown_launch, submission_kind)
            self.objects = _FreshKeyed(_object_key, unconfirmed)
            self.recoveries = _Fresh(kind=recovery_kind)
            self.holds, self.abandoned, self.history = _Fresh(), _Fresh(), _Fresh()
            self.escalations = _FreshKeyed(_escalation_key, undelivered)
            self.progress = _Fresh()
        else:  # over a prior job: its tuples shared, changes kept beside them
            self.submissions = _Vec(job.submissions, unknown_launch, submission_kind)
            self.objects = _Keyed(job.objects, _object_key, unconfirmed)
            self.recoveries = _Vec(job.recoveries, kind=recovery_kind)
            self.holds, self.abandoned = _Vec(job.holds), _Vec(job.abandoned)
            self.history = _Vec(job.history)
            self.escalations = _Keyed(job.escalations, _escalation_key, undelivered)
            self.progress = _Vec(job.progress)
        self.outcome, self.outcome_cause, self.outcome_at = (
            job.outcome,
            job.outcome_cause,
            job.outcome_at,
        )
        self.cancel_requested_at, self.cancelled_by = job.cancel_requested_at, job.cancelled_by
        self.emergency_stop_at = job.emergency_stop_at
        self.ended_cause = job.ended_cause

    @classmethod
    def created(cls, seq: int, ev: JobCreated) -> _Acc:
        return cls(
            Job(
                job_id=ev.job_id,
                seq=seq,
                spec=ev.spec,
                policy=ev.policy,
                plan=ev.plan,
                declarations=ev.declarations,
                generation=ev.generation,
                supersedes=ev.supersedes,
                superseded_by=None,
                created_at=ev.at,
                created_by=ev.by,
            ),
            fresh=True,
        )

    def freeze(self) -> Job:
        return Job(
            job_id=self.job_id,
            seq=self.seq,
            spec=self.spec,
            policy=self.policy,
            plan=self.plan,
            declarations=self.declarations,
            generation=self.generation,
            supersedes=self.supersedes,
            superseded_by=self.superseded_by,
            created_at=self.created_at,
            created_by=self.created_by,
            submissions=self.submissions.freeze_marked(),
            objects=self.objects.freeze_indexed(),
            recoveries=self.recoveries.freeze_marked(),
            holds=self.holds.freeze(),
            outcome=self.outcome,
            outcome_cause=self.outcome_cause,
            outcome_at=self.outcome_at,
            cancel_requested_at=self.cancel_requested_at,
            cancelled_by=self.cancelled_by,
            emergency_stop_at=self.emergency_stop_at,
            abandoned=self.abandoned.freeze(),
            escalations=self.escalations.freeze_indexed(),
            history=self.history.freeze(),
            ended_cause=self.ended_cause,
            progress=self.progress.freeze(),
        )

    # -- lookups that refuse what does not exist ------------------------------------------

    def bad(self, seq: int, problem: str) -> MalformedRecord:
        return MalformedRecord(self.job_id, seq, problem)

    def check_rule(self, seq: int, rule: int, what: str) -> None:
        """Refuse a rule index the plan doesn't have, as ``what`` names it."""
        if not 0 <= rule < len(self.plan.rules):
            raise self.bad(
                seq, f"{what} names rule {rule}, but the plan has {len(self.plan.rules)} rules"
            )

    def submission(self, seq: int, number: int, what: str) -> Submission:
        subs = self.submissions
        if 0 < number <= len(subs):
            return subs[number - 1]
        raise self.bad(
            seq,
            f"{what} names submission {number}, which was never opened "
            f"(the record has {len(self.submissions)})",
        )

    def attempt(self, seq: int, number: int, attempt: int, what: str) -> Submission:
        sub = self.submission(seq, number, what)
        if 1 <= attempt <= len(sub.attempts):
            return sub
        raise self.bad(
            seq,
            f"{what} names attempt {number}/{attempt}, which was never intended "
            f"(submission {number} has {len(sub.attempts)} attempts)",
        )

    def unresolved(self, seq: int, number: int, attempt: int, what: str) -> Attempt:
        sub = self.attempt(seq, number, attempt, what)
        att = sub.attempts[attempt - 1]
        if att.outcome is not LaunchOutcome.UNKNOWN:
            raise self.bad(
                seq,
                f"{what} for attempt {number}/{attempt}, whose outcome is already {att.outcome}",
            )
        return att

    def set_attempt(self, att: Attempt) -> None:
        """Replace attempt ``att.submission/att.attempt`` (which exists) by ``att``."""
        i = att.submission - 1
        sub = self.submissions[i]
        a = att.attempt - 1
        self.submissions[i] = replace(
            sub, attempts=(*sub.attempts[:a], att, *sub.attempts[a + 1 :])
        )

    def known(self, ref: ObjectRef) -> ObjectRecord | None:
        i = self.objects.find(ref)
        return None if i is None else self.objects[i]

    def object(self, seq: int, ref: ObjectRef, what: str) -> tuple[int, ObjectRecord]:
        i = self.objects.find(ref)
        if i is None:
            raise self.bad(seq, f"{what} names object {ref}, which the record never launched")
        return i, self.objects[i]


def _held_cause(ev: HoldPlaced) -> Cause:
    return Cause(
        kind=CauseKind.HELD, provenance=Provenance.ACTOR, actor=ev.by, detail=ev.reason, at=ev.at
    )


def _apply(acc: _Acc, seq: int, ev: JobEvent) -> None:
    """Fold one event into ``acc`` (which already holds the record's creation).

    The cases go roughly by how often a long record holds each event: a match tries them
    in order.
    """
    match ev:
        case LaunchIntended():
            sub = acc.submission(seq, ev.submission, "launch.intended")
            expected = len(sub.attempts) + 1
            if ev.attempt != expected:
                raise acc.bad(
                    seq,
                    f"launch.intended names attempt {ev.submission}/{ev.attempt} where "
                    f"attempt {ev.submission}/{expected} was next",
                )
            att = Attempt(submission=ev.submission, attempt=ev.attempt, intended_at=ev.at)
            acc.submissions[ev.submission - 1] = replace(sub, attempts=(*sub.attempts, att))
        case LaunchRecorded():
            att = acc.unresolved(seq, ev.submission, ev.attempt, "launch.recorded")
            known = acc.known(ev.ref)
            if known is not None:
                raise acc.bad(
                    seq,
                    f"launch.recorded names object {ev.ref}, already recorded for attempt "
                    f"{known.submission}/{known.attempt}",
                )
            acc.set_attempt(replace(att, outcome=LaunchOutcome.LAUNCHED, ref=ev.ref))
            acc.objects.add(ObjectRecord(ref=ev.ref, submission=ev.submission, attempt=ev.attempt))
        case SubmissionOpened():
            expected = len(acc.submissions) + 1
            if ev.submission != expected:
                raise acc.bad(
                    seq,
                    f"submission {ev.submission} opened where submission {expected} was next",
                )
            acc.submissions.append(
                Submission(
                    number=ev.submission,
                    opened_at=ev.at,
                    why=ev.why,
                    cause=ev.cause,
                    cluster=ev.cluster,
                )
            )
        case GateOpened():
            i, obj = acc.object(seq, ev.ref, "gate.opened")
            acc.objects[i] = replace(obj, gate_opened_at=ev.at)
        case ExecutionEnded():
            found = acc.objects.find(ev.ref)
            if found is None:
                # An object the record never launched (a duplicate seen ended): its end is
                # recorded, and it never drives recovery (core-semantics, planner rule 1).
                acc.objects.add(
                    ObjectRecord(
                        ref=ev.ref,
                        submission=ev.submission,
                        attempt=0,
                        fenced=ev.fenced,
                        duplicate=True,
                        ended=(ev.restart,),
                    )
                )
                return
            known = acc.objects[found]
            if not known.duplicate and ev.submission != known.submission:
                raise acc.bad(
                    seq,
                    f"execution {ev.restart} of object {ev.ref} ended as submission "
                    f"{ev.submission}, but the object belongs to submission {known.submission}",
                )
            if ev.restart in known.ended:
                raise acc.bad(
                    seq, f"execution {ev.restart} of object {ev.ref} is already recorded ended"
                )
            acc.objects[found] = replace(
                known, ended=(*known.ended, ev.restart), fenced=known.fenced or ev.fenced
            )
            if not known.duplicate:
                acc.ended_cause = ev.cause
        case RecoveryCommitted():
            acc.check_rule(seq, ev.rule, "recovery.committed")
            acc.recoveries.append(
                Recovery(
                    at=ev.at,
                    rule=ev.rule,
                    action=ev.action,
                    cause=ev.cause,
                    native=ev.native,
                    free=ev.free,
                )
            )
            acc.history.append(Transition(at=ev.at, state=State.RECOVERING, cause=ev.cause))
        case EscalationCommitted():
            if acc.escalations.find(ev.id) is not None:
                raise acc.bad(seq, f"escalation {ev.id!r} committed a second time")
            acc.escalations.add(Escalation(id=ev.id, at=ev.at, detail=ev.detail))
        case EscalationDelivered():
            index = acc.escalations.find(ev.id)
            if index is None:
                raise acc.bad(seq, f"escalation {ev.id!r} delivered but never committed")
            esc = acc.escalations[index]
            if esc.delivered is None:
                acc.escalations[index] = replace(esc, delivered=ev.at)
        case StopRequested():
            found = acc.objects.find(ev.ref)
            known = None if found is None else acc.objects[found]
            if known is None:
                if ev.why != "duplicate":
                    raise acc.bad(
                        seq,
                        f"stop.requested (why {str(ev.why)!r}) names object {ev.ref}, which the "
                        "record never launched; only a duplicate may be stopped unlaunched",
                    )
                known = ObjectRecord(
                    ref=ev.ref,
                    submission=ev.submission or 0,
                    attempt=ev.attempt or 0,
                    duplicate=True,
                )
            stopped = replace(
                known,
                stop_requested_at=ev.at,
                stop_why=ev.why,
                first_stop_requested_at=known.first_stop_requested_at or ev.at,
                stop_cause=ev.cause if ev.cause is not None else known.stop_cause,
                emergency_stop_at=ev.at if ev.emergency else known.emergency_stop_at,
            )
            if found is None:
                acc.objects.add(stopped)
            else:
                acc.objects[found] = stopped
        case NodeLossObserved():
            i, obj = acc.object(seq, ev.ref, "node-loss.observed")
            acc.objects[i] = replace(obj, node_loss_since=ev.since, node_loss_restart=ev.restart)
        case NoCapacityObserved():
            i, obj = acc.object(seq, ev.ref, "no-capacity.observed")
            acc.objects[i] = replace(obj, no_capacity_since=ev.since)
        case LaunchRefused():
            att = acc.unresolved(seq, ev.submission, ev.attempt, "launch.refused")
            acc.set_attempt(replace(att, outcome=LaunchOutcome.REFUSED, detail=ev.detail))
        case LaunchUnknown():
            att = acc.unresolved(seq, ev.submission, ev.attempt, "launch.unknown")
            acc.set_attempt(replace(att, detail=ev.detail, unknown_at=ev.at))
        case HoldPlaced():
            expected = len(acc.holds) + 1
            if ev.instance != expected:
                raise acc.bad(
                    seq, f"hold {ev.instance} placed where hold instance {expected} was next"
                )
            if acc.holds and acc.holds[-1].active:
                raise acc.bad(
                    seq,
                    f"hold {ev.instance} placed while hold {acc.holds[-1].instance} is in force",
                )
            if ev.rule is not None:
                acc.check_rule(seq, ev.rule, f"hold {ev.instance}")
            acc.holds.append(
                Hold(
                    instance=ev.instance,
                    kind=ev.kind,
                    by=ev.by,
                    reason=ev.reason,
                    placed_at=ev.at,
                    deadline=ev.deadline,
                    cause=ev.cause,
                    rule=ev.rule,
                    substituted_for=ev.substituted_for,
                )
            )
            acc.history.append(Transition(at=ev.at, state=State.HELD, cause=_held_cause(ev)))
        case HoldReleased():
            hold = acc.holds[-1] if acc.holds else None
            if hold is None or hold.instance != ev.instance or not hold.active:
                raise acc.bad(
                    seq,
                    f"hold.released names hold {ev.instance}, which is not in force "
                    f"(hold in force: {hold.instance if hold and hold.active else 'none'})",
                )
            acc.holds[-1] = replace(
                hold,
                released_at=ev.at,
                released_by=ev.by,
                released_how=ev.how,
                override=ev.override,
            )
            state = State.PENDING if acc.ended_cause is None else State.RECOVERING
            cause = Cause(
                kind=CauseKind.RELEASED,
                provenance=Provenance.ACTOR,
                actor=ev.by,
                detail=ev.reason,
                at=ev.at,
            )
            acc.history.append(Transition(at=ev.at, state=state, cause=cause, detail=ev.how))
        case CessationObserved():
            i, obj = acc.object(seq, ev.ref, "cessation.observed")
            acc.objects[i] = replace(obj, cessation_asked_at=ev.at, ceased=ev.ceased)
        case ProgressObserved():
            acc.object(seq, ev.ref, "progress.observed")
            acc.progress.append(ev)
        case OutcomeCommitted():
            if acc.outcome is not None:
                raise acc.bad(
                    seq, f"a second outcome {ev.state} after the committed outcome {acc.outcome}"
                )
            if not ev.state.terminal:
                raise acc.bad(seq, f"outcome {ev.state} is not an outcome")
            acc.outcome, acc.outcome_cause, acc.outcome_at = ev.state, ev.cause, ev.at
            acc.history.append(Transition(at=ev.at, state=ev.state, cause=ev.cause))
        case CancelRequested():
            if acc.cancel_requested_at is None:
                acc.cancel_requested_at, acc.cancelled_by = ev.at, ev.by
        case GaveUp():
            pass  # a decision; its hold release and outcome are their own events
        case Abandoned():
            _abandon(acc, seq, ev)
        case EmergencyStopRequested():
            acc.emergency_stop_at = ev.at
        case Superseded():
            if acc.superseded_by is not None:
                raise acc.bad(
                    seq,
                    f"superseded by {ev.new_job!r}, but already superseded by "
                    f"{acc.superseded_by!r}",
                )
            acc.superseded_by = ev.new_job
        case JobCreated():
            raise acc.bad(seq, "a second job.created: a record begins exactly once")
        case _:
            assert_never(ev)


def _abandon(acc: _Acc, seq: int, ev: Abandoned) -> None:
    """Fold an abandonment: the attempts it closes become ``abandoned`` (seed 002)."""
    target = ev.target
    if target.foreign is not None:
        if target.submission is not None or target.attempt is not None:
            raise acc.bad(seq, f"abandon target {target} names both a foreign object and a launch")
        # A foreign object is never in the record (it isn't dispatch's); nothing to check.
    elif target.submission is None:
        raise acc.bad(seq, "abandon target names neither a submission nor a foreign object")
    elif target.attempt is not None:
        sub = acc.attempt(seq, target.submission, target.attempt, "abandoned")
        att = sub.attempts[target.attempt - 1]
        if att.outcome is LaunchOutcome.UNKNOWN:
            acc.set_attempt(replace(att, outcome=LaunchOutcome.ABANDONED))
    else:
        sub = acc.submission(seq, target.submission, "abandoned")
        acc.submissions[target.submission - 1] = replace(
            sub,
            attempts=tuple(
                replace(att, outcome=LaunchOutcome.ABANDONED)
                if att.outcome is LaunchOutcome.UNKNOWN
                else att
                for att in sub.attempts
            ),
        )
    acc.abandoned.append(target)


def fold(record: Iterable[RecordItem], now: datetime, *, prior: Job | None = None) -> Job:
    """Replay a job's record into a :class:`Job` (seed 000, ``Fold``).

    Args:
        record: ``(seq, event, writer)`` items in stream order; ``seq`` is the JetStream
            stream sequence (gaps are normal: the stream holds every job's events), ``writer``
            the kind of writer that appended the event (DESIGN.md section 5).
        now: the time of the read; accepted for symmetry with the seed's ``Fold(v, now)``;
            the result does not depend on it.
        prior: a Job folded from an earlier prefix of the same record; ``record`` then holds
            the events after it, and ``fold(b, now, prior=fold(a, now)) == fold(a + b, now)``.

    Returns:
        The folded job; ``seq`` is the last event's sequence.

    Raises:
        WriterRefused: an event was appended by a kind of writer that may not write its type
            (``dispatch_core.writers.WRITERS``; issue 10); the message names job, seq, event
            type and writer.
        OutOfOrderEvent: a sequence is not after the previous one (naming both).
        MalformedRecord: the record is empty, doesn't begin with ``job.created``, has a
            second one, holds another job's event, or an event references something that
            does not exist (an attempt never intended, a hold never placed, a second
            outcome, an escalation never committed...); the message names job, seq and
            problem.
    """
    del now  # documented as unused: fold records facts, whatever the time of the read
    events = iter(record)
    if prior is not None:
        acc = _Acc(prior)
    else:
        first = next(events, None)
        if first is None:
            raise MalformedRecord("", 0, "the record is empty; a record begins with job.created")
        seq, ev, writer = first
        if seq < 1:
            raise OutOfOrderEvent(ev.job_id, 0, seq)
        _check_writer(ev.job_id, seq, ev, writer)
        if not isinstance(ev, JobCreated):
            raise MalformedRecord(
                ev.job_id,
                seq,
                f"the record begins with {type(ev).__name__} ({event_tag(ev)}), not job.created",
            )
        acc = _Acc.created(seq, ev)
    # The hot loop: locals, and the sequence written back once at the end.
    job_id, last = acc.job_id, acc.seq
    fixed = _FIXED_WRITERS
    for seq, ev, writer in events:
        if seq <= last:
            raise OutOfOrderEvent(job_id, last, seq)
        if ev.job_id != job_id:
            raise acc.bad(seq, f"{event_tag(ev)} of job {ev.job_id!r} in the record of {job_id!r}")
        allowed = fixed.get(type(ev))
        if allowed is None or writer not in allowed:
            _check_writer(job_id, seq, ev, writer)
        _apply(acc, seq, ev)
        last = seq
    acc.seq = last
    return acc.freeze()


def fold_one(job: Job, seq: int, event: JobEvent, writer: WriterKind) -> Job:
    """Fold one more event into ``job``: ``fold(((seq, event, writer),), now, prior=job)``.

    It costs what the event changes, not what the job holds: the new Job shares every tuple
    of ``job`` the event leaves alone, and its object and escalation indexes
    (:class:`~dispatch_core.job.Indexed`); a tuple the event appends to or edits is copied
    once (pointers only). ``job`` itself is never changed, so it may be folded again
    (another replica's events after a conflict) or kept.

    Args:
        job: the job folded so far.
        seq: the event's stream sequence (after ``job.seq``).
        event: the event.
        writer: the kind of writer that appended it.

    Returns:
        The job with ``event`` folded in; its ``seq`` is ``seq``.

    Raises:
        WriterRefused, OutOfOrderEvent, MalformedRecord: as :func:`fold`.
    """
    return fold(((seq, event, writer),), event.at, prior=job)


_FIXED_WRITERS: Final[Mapping[type[JobEvent], frozenset[WriterKind]]] = {
    kind: rule for kind, rule in WRITERS.items() if isinstance(rule, frozenset)
}
"""The event types whose writers don't depend on the event's fields: checked inline."""


def _check_writer(job_id: str, seq: int, ev: JobEvent, writer: WriterKind) -> None:
    """Refuse an event its writer may not write (issue 10, "Writer kinds")."""
    allowed = writers_of(ev)
    if writer not in allowed:
        raise WriterRefused(
            job_id, seq, event_tag(ev), str(writer), tuple(sorted(str(w) for w in allowed))
        )

"""``fold``: replay a job's record into a :class:`~dispatch_core.job.Job` (seed 000, "Where the
state comes from"; docs/core-semantics.md, "fold").

Folding records facts: it never rejects a well-formed event because of what the event
decides (the planner and ``decide`` only commit legal events). It refuses a record dispatch
could not have written: a sequence that doesn't increase, a first event that isn't
``job.created``, a second ``job.created``, an event of another job, or an event that
references something that does not exist (an attempt never intended, a hold never placed, a
second outcome). Nothing is skipped.

The fold runs on a private mutable accumulator and freezes it into a ``Job`` once, at the
end, so a 1,000-event record folds in linear time.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import assert_never

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
    Job,
    LaunchOutcome,
    ObjectRecord,
    Recovery,
    Submission,
    Transition,
)
from dispatch_core.state import (
    Actor,
    Cause,
    CauseKind,
    Declarations,
    JobSpec,
    ObjectRef,
    Plan,
    Provenance,
    RecoveryPolicy,
    State,
)
from dispatch_core.writers import WriterKind, event_tag, writers_of

__all__ = ["RecordItem", "fold"]

RecordItem = tuple[int, JobEvent, WriterKind]
"""One event of a record as ``fold`` takes it: its stream seq, the event, and the kind of
writer that appended it (contract v2's record subject says which)."""


class _Sub:
    """A submission being folded: its attempts stay a list until the end."""

    __slots__ = ("attempts", "cause", "number", "opened_at", "why")

    def __init__(
        self,
        number: int,
        opened_at: datetime,
        why: str,
        cause: Cause | None,
        attempts: list[Attempt],
    ) -> None:
        self.number, self.opened_at, self.why, self.cause = number, opened_at, why, cause
        self.attempts = attempts

    def freeze(self) -> Submission:
        return Submission(
            number=self.number,
            opened_at=self.opened_at,
            why=self.why,
            cause=self.cause,
            attempts=tuple(self.attempts),
        )


class _Acc:
    """The mutable twin of :class:`Job` that ``fold`` works on."""

    __slots__ = (
        "abandoned",
        "cancel_requested_at",
        "cancelled_by",
        "created_at",
        "created_by",
        "declarations",
        "emergency_stop_at",
        "ended",
        "ended_cause",
        "esc_index",
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

    def __init__(
        self,
        *,
        job_id: str,
        seq: int,
        spec: JobSpec,
        policy: RecoveryPolicy,
        plan: Plan,
        declarations: Declarations,
        generation: int,
        supersedes: str | None,
        superseded_by: str | None,
        created_at: datetime,
        created_by: Actor,
    ) -> None:
        self.job_id, self.seq = job_id, seq
        self.spec, self.policy, self.plan, self.declarations = spec, policy, plan, declarations
        self.generation, self.supersedes, self.superseded_by = (
            generation,
            supersedes,
            superseded_by,
        )
        self.created_at, self.created_by = created_at, created_by
        self.submissions: list[_Sub] = []
        self.objects: dict[ObjectRef, ObjectRecord] = {}
        # Each object's ended executions, kept apart from ``objects`` so that an object
        # requeued natively a thousand times doesn't copy a growing tuple each time.
        self.ended: dict[ObjectRef, dict[int, None]] = {}  # an ordered set per object
        self.recoveries: list[Recovery] = []
        self.holds: list[Hold] = []
        self.outcome: State | None = None
        self.outcome_cause: Cause | None = None
        self.outcome_at: datetime | None = None
        self.cancel_requested_at: datetime | None = None
        self.cancelled_by: Actor | None = None
        self.emergency_stop_at: datetime | None = None
        self.abandoned: list[AbandonTarget] = []
        self.escalations: list[Escalation] = []
        self.esc_index: dict[str, int] = {}
        self.history: list[Transition] = []
        self.ended_cause: Cause | None = None
        self.progress: list[ProgressObserved] = []

    @classmethod
    def created(cls, seq: int, ev: JobCreated) -> _Acc:
        return cls(
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
        )

    @classmethod
    def thaw(cls, job: Job) -> _Acc:
        acc = cls(
            job_id=job.job_id,
            seq=job.seq,
            spec=job.spec,
            policy=job.policy,
            plan=job.plan,
            declarations=job.declarations,
            generation=job.generation,
            supersedes=job.supersedes,
            superseded_by=job.superseded_by,
            created_at=job.created_at,
            created_by=job.created_by,
        )
        acc.submissions = [
            _Sub(s.number, s.opened_at, s.why, s.cause, list(s.attempts)) for s in job.submissions
        ]
        acc.objects = {o.ref: o for o in job.objects}
        acc.ended = {o.ref: dict.fromkeys(o.ended) for o in job.objects if o.ended}
        acc.recoveries = list(job.recoveries)
        acc.holds = list(job.holds)
        acc.outcome, acc.outcome_cause, acc.outcome_at = (
            job.outcome,
            job.outcome_cause,
            job.outcome_at,
        )
        acc.cancel_requested_at, acc.cancelled_by = job.cancel_requested_at, job.cancelled_by
        acc.emergency_stop_at = job.emergency_stop_at
        acc.abandoned = list(job.abandoned)
        acc.escalations = list(job.escalations)
        acc.esc_index = {e.id: i for i, e in enumerate(job.escalations)}
        acc.history = list(job.history)
        acc.ended_cause = job.ended_cause
        acc.progress = list(job.progress)
        return acc

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
            submissions=tuple(s.freeze() for s in self.submissions),
            objects=tuple(
                replace(o, ended=tuple(self.ended[o.ref])) if o.ref in self.ended else o
                for o in self.objects.values()
            ),
            recoveries=tuple(self.recoveries),
            holds=tuple(self.holds),
            outcome=self.outcome,
            outcome_cause=self.outcome_cause,
            outcome_at=self.outcome_at,
            cancel_requested_at=self.cancel_requested_at,
            cancelled_by=self.cancelled_by,
            emergency_stop_at=self.emergency_stop_at,
            abandoned=tuple(self.abandoned),
            escalations=tuple(self.escalations),
            history=tuple(self.history),
            ended_cause=self.ended_cause,
            progress=tuple(self.progress),
        )

    # -- lookups that refuse what does not exist ------------------------------------------

    def bad(self, seq: int, problem: str) -> MalformedRecord:
        return MalformedRecord(self.job_id, seq, problem)

    def submission(self, seq: int, number: int, what: str) -> _Sub:
        if 1 <= number <= len(self.submissions):
            return self.submissions[number - 1]
        raise self.bad(
            seq,
            f"{what} names submission {number}, which was never opened "
            f"(the record has {len(self.submissions)})",
        )

    def attempt(self, seq: int, number: int, attempt: int, what: str) -> tuple[_Sub, int]:
        sub = self.submission(seq, number, what)
        if 1 <= attempt <= len(sub.attempts):
            return sub, attempt - 1
        raise self.bad(
            seq,
            f"{what} names attempt {number}/{attempt}, which was never intended "
            f"(submission {number} has {len(sub.attempts)} attempts)",
        )

    def unresolved(self, seq: int, number: int, attempt: int, what: str) -> tuple[_Sub, int]:
        sub, i = self.attempt(seq, number, attempt, what)
        outcome = sub.attempts[i].outcome
        if outcome is not LaunchOutcome.UNKNOWN:
            raise self.bad(
                seq, f"{what} for attempt {number}/{attempt}, whose outcome is already {outcome}"
            )
        return sub, i

    def object(self, seq: int, ref: ObjectRef, what: str) -> ObjectRecord:
        obj = self.objects.get(ref)
        if obj is None:
            raise self.bad(seq, f"{what} names object {ref}, which the record never launched")
        return obj


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
            sub.attempts.append(
                Attempt(submission=ev.submission, attempt=ev.attempt, intended_at=ev.at)
            )
        case LaunchRecorded():
            sub, i = acc.unresolved(seq, ev.submission, ev.attempt, "launch.recorded")
            known = acc.objects.get(ev.ref)
            if known is not None:
                raise acc.bad(
                    seq,
                    f"launch.recorded names object {ev.ref}, already recorded for attempt "
                    f"{known.submission}/{known.attempt}",
                )
            sub.attempts[i] = replace(sub.attempts[i], outcome=LaunchOutcome.LAUNCHED, ref=ev.ref)
            acc.objects[ev.ref] = ObjectRecord(
                ref=ev.ref, submission=ev.submission, attempt=ev.attempt
            )
        case SubmissionOpened():
            expected = len(acc.submissions) + 1
            if ev.submission != expected:
                raise acc.bad(
                    seq,
                    f"submission {ev.submission} opened where submission {expected} was next",
                )
            acc.submissions.append(_Sub(ev.submission, ev.at, ev.why, ev.cause, []))
        case GateOpened():
            obj = acc.object(seq, ev.ref, "gate.opened")
            acc.objects[ev.ref] = replace(obj, gate_opened_at=ev.at)
        case ExecutionEnded():
            known = acc.objects.get(ev.ref)
            if known is None:
                # An object the record never launched (a duplicate seen ended): its end is
                # recorded, and it never drives recovery (core-semantics, planner rule 1).
                acc.objects[ev.ref] = ObjectRecord(
                    ref=ev.ref,
                    submission=ev.submission,
                    attempt=0,
                    fenced=ev.fenced,
                    duplicate=True,
                )
                acc.ended[ev.ref] = {ev.restart: None}
                return
            if not known.duplicate and ev.submission != known.submission:
                raise acc.bad(
                    seq,
                    f"execution {ev.restart} of object {ev.ref} ended as submission "
                    f"{ev.submission}, but the object belongs to submission {known.submission}",
                )
            ended = acc.ended.setdefault(ev.ref, {})
            if ev.restart in ended:
                raise acc.bad(
                    seq, f"execution {ev.restart} of object {ev.ref} is already recorded ended"
                )
            ended[ev.restart] = None
            if ev.fenced and not known.fenced:
                acc.objects[ev.ref] = replace(known, fenced=True)
            if not known.duplicate:
                acc.ended_cause = ev.cause
        case RecoveryCommitted():
            if not 0 <= ev.rule < len(acc.plan.rules):
                raise acc.bad(
                    seq,
                    f"recovery.committed names rule {ev.rule}, but the plan has "
                    f"{len(acc.plan.rules)} rules",
                )
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
            if ev.id in acc.esc_index:
                raise acc.bad(seq, f"escalation {ev.id!r} committed a second time")
            acc.esc_index[ev.id] = len(acc.escalations)
            acc.escalations.append(Escalation(id=ev.id, at=ev.at, detail=ev.detail))
        case EscalationDelivered():
            index = acc.esc_index.get(ev.id)
            if index is None:
                raise acc.bad(seq, f"escalation {ev.id!r} delivered but never committed")
            esc = acc.escalations[index]
            if esc.delivered is None:
                acc.escalations[index] = replace(esc, delivered=ev.at)
        case StopRequested():
            known = acc.objects.get(ev.ref)
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
            acc.objects[ev.ref] = replace(
                known,
                stop_requested_at=ev.at,
                stop_why=ev.why,
                first_stop_requested_at=known.first_stop_requested_at or ev.at,
                emergency_stop_at=ev.at if ev.emergency else known.emergency_stop_at,
            )
        case NodeLossObserved():
            obj = acc.object(seq, ev.ref, "node-loss.observed")
            acc.objects[ev.ref] = replace(
                obj, node_loss_since=ev.since, node_loss_restart=ev.restart
            )
        case LaunchRefused():
            sub, i = acc.unresolved(seq, ev.submission, ev.attempt, "launch.refused")
            sub.attempts[i] = replace(
                sub.attempts[i], outcome=LaunchOutcome.REFUSED, detail=ev.detail
            )
        case LaunchUnknown():
            sub, i = acc.unresolved(seq, ev.submission, ev.attempt, "launch.unknown")
            sub.attempts[i] = replace(sub.attempts[i], detail=ev.detail, unknown_at=ev.at)
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
            if ev.rule is not None and not 0 <= ev.rule < len(acc.plan.rules):
                raise acc.bad(
                    seq,
                    f"hold {ev.instance} names rule {ev.rule}, but the plan has "
                    f"{len(acc.plan.rules)} rules",
                )
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
            obj = acc.object(seq, ev.ref, "cessation.observed")
            acc.objects[ev.ref] = replace(obj, cessation_asked_at=ev.at, ceased=ev.ceased)
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
        sub, i = acc.attempt(seq, target.submission, target.attempt, "abandoned")
        if sub.attempts[i].outcome is LaunchOutcome.UNKNOWN:
            sub.attempts[i] = replace(sub.attempts[i], outcome=LaunchOutcome.ABANDONED)
    else:
        sub = acc.submission(seq, target.submission, "abandoned")
        for i, att in enumerate(sub.attempts):
            if att.outcome is LaunchOutcome.UNKNOWN:
                sub.attempts[i] = replace(att, outcome=LaunchOutcome.ABANDONED)
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
        acc = _Acc.thaw(prior)
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
    for seq, ev, writer in events:
        if seq <= last:
            raise OutOfOrderEvent(job_id, last, seq)
        if ev.job_id != job_id:
            raise acc.bad(seq, f"{event_tag(ev)} of job {ev.job_id!r} in the record of {job_id!r}")
        _check_writer(job_id, seq, ev, writer)
        _apply(acc, seq, ev)
        last = seq
    acc.seq = last
    return acc.freeze()


def _check_writer(job_id: str, seq: int, ev: JobEvent, writer: WriterKind) -> None:
    """Refuse an event its writer may not write (issue 10, "Writer kinds")."""
    allowed = writers_of(ev)
    if writer not in allowed:
        raise WriterRefused(
            job_id, seq, event_tag(ev), str(writer), tuple(sorted(str(w) for w in allowed))
        )

"""The folded job and the status a caller reads (DESIGN.md section 3).

``fold`` replays a record into a :class:`Job`; ``project`` combines a Job with a
:class:`~dispatch_core.state.Discovery` into a :class:`Status`. Both types are frozen and
hold tuples, so a Job can be shared between passes and processes.
"""

from __future__ import annotations

import enum

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
    "Attempt",
    "Escalation",
    "Hold",
    "HoldView",
    "Job",
    "LaunchOutcome",
    "ObjectRecord",
    "Recovery",
    "Status",
    "Submission",
    "Transition",
]


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
    """One submission of the job: N, why it was opened, and its launch attempts."""

    number: int
    opened_at: UtcDatetime
    why: str
    cause: Cause | None = None
    attempts: tuple[Attempt, ...] = ()


class ObjectRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the record holds about one of dispatch's objects.

    Attributes:
        ref: the object.
        submission, attempt: the launch that made it.
        gate_opened_at: when dispatch opened its gate.
        stop_requested_at: the last time dispatch asked for it to stop, and ``stop_why``.
        emergency_stop_at: the last emergency stop of it.
        node_loss_since: when it was first seen running with cause node-lost, with
            ``node_loss_restart`` the execution that was on the lost node.
        ended: the restart counts R of its executions recorded as ended.
        fenced: whether an execution was ended by the node-loss fence.
        cessation_asked_at: the last cessation answer's time; ``ceased`` the answer.
        duplicate: whether the object is a duplicate the record never launched (stopped
            with why ``duplicate``, or seen ended): its ends are recorded but never drive
            recovery; ``submission``/``attempt`` are then as read from it (0 when unknown).
        first_stop_requested_at: the first time dispatch asked for it to stop (re-asks keep
            it); ``stop-overdue:<object id>`` counts ``JobSpec.stop_overdue_s`` from it.
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


class Job(msgspec.Struct, frozen=True, kw_only=True):
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
        """Return the record's entry for ``ref``, or ``None``."""
        for obj in self.objects:
            if obj.ref == ref:
                return obj
        return None

    def escalation(self, escalation_id: str) -> Escalation | None:
        """Return the escalation with ``escalation_id``, or ``None``."""
        for esc in self.escalations:
            if esc.id == escalation_id:
                return esc
        return None

    def spent(self, rule: int) -> int:
        """How much of rule ``rule``'s budget its recoveries spent (a ``free`` one spends
        nothing, issue 14)."""
        return sum(1 for r in self.recoveries if r.rule == rule and not r.free)


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
        history: committed transitions (recoveries, holds, outcomes), oldest first.
        supersedes: the job this one supersedes; ``superseded_by`` the one superseding it.
        submission: N of the current submission.
        epoch: ``DISPATCH_EPOCH`` of the current execution, when one is known.
        objects: the refs of the job's live objects.
        settled: whether the job has an outcome and nothing of it can still act.
        published_step: the latest published step a progress fact recorded (issue 14), and
            ``published_at`` when its ``pub/`` listing was read; ``None`` when none did.
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
    published_step: int | None = None
    published_at: UtcDatetime | None = None

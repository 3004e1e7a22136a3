"""The record: append-only events of one job's life (DESIGN.md section 3).

Each event is a frozen msgspec Struct tagged with an explicit dotted name; the tag and the
field types never change once released (new fields go last, with a default). The stream
sequence of an event is never part of its payload: ``fold`` takes it beside the event.

Every event carries ``job_id`` (the record it belongs to) and ``at`` (when it was decided).
"""

from __future__ import annotations

import enum

import msgspec

from dispatch_core.state import (
    Action,
    Actor,
    Cause,
    Declarations,
    HoldKind,
    JobSpec,
    ObjectRef,
    Plan,
    RecoveryPolicy,
    State,
    UtcDatetime,
)

__all__ = [
    "AbandonTarget",
    "Abandoned",
    "CancelRequested",
    "CessationObserved",
    "EmergencyStopRequested",
    "EscalationCommitted",
    "EscalationDelivered",
    "Event",
    "ExecutionEnded",
    "GateOpened",
    "GaveUp",
    "HoldHow",
    "HoldPlaced",
    "HoldReleased",
    "JobCreated",
    "JobEvent",
    "LaunchIntended",
    "LaunchRecorded",
    "LaunchRefused",
    "LaunchUnknown",
    "NoCapacityObserved",
    "NodeLossObserved",
    "OutcomeCommitted",
    "ProgressObserved",
    "RecoveryCommitted",
    "StopRequested",
    "StopWhy",
    "SubmissionOpened",
    "SubmissionWhy",
    "Superseded",
]


class SubmissionWhy(enum.StrEnum):
    """Why a submission was opened (``SubmissionOpened.why``); the values are the strings
    records already hold."""

    INITIAL = "initial"
    """The job's first submission."""
    RECOVERY = "recovery"
    """A recovery rule resubmits after an execution ended."""
    RESUBMIT = "resubmit"
    """A person resubmitted a held job (seed 002)."""
    ABANDONED = "abandoned"
    """The next submission after an all-unknown one was abandoned (seed 002)."""
    CEASED = "ceased"
    """A cessation fact lifted a shared-checkpoint hold and its resubmit rule applies (seed
    004)."""


class StopWhy(enum.StrEnum):
    """Why dispatch asked the scheduler to stop an object (``StopRequested.why``); the values
    are the strings records already hold."""

    CANCEL = "cancel"
    """The job was cancelled."""
    FENCE = "fence"
    """The node-loss window passed (seed 000, "The node-loss fence")."""
    DUPLICATE = "duplicate"
    """An object the record never launched, or a second one of one submission."""
    OUTCOME = "outcome"
    """The job has an outcome and the object still lives."""
    RECOVERY = "recovery"
    """A native requeue or restart the policy doesn't want, or a failed job's live object."""
    NO_CAPACITY = "no-capacity"
    """The current submission's object waited, gate open, for the capacity the scheduler
    said it lacks, for the ``wait_s`` of the rule covering ``no-capacity``
    (docs/core-semantics.md, "No capacity"); its end is recorded as ``no-capacity``."""


class HoldHow(enum.StrEnum):
    """How a hold ended (``HoldReleased.how``); the values are the strings records already
    hold."""

    RELEASE = "release"
    """A person released an actor hold."""
    RESUBMIT = "resubmit"
    """A person resubmitted the held job."""
    CANCEL = "cancel"
    """The job was cancelled."""
    GIVE_UP = "give-up"
    """A person gave up on the held job."""
    CEASED = "ceased"
    """The backend's cessation signal said the object's processes are gone (seed 004)."""
    OUTCOME = "outcome"
    """The job got an outcome while held."""
    REPLACED = "replaced"
    """A recovery hold replaced the actor hold in force."""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every record event.

    Attributes:
        job_id: the job whose record this is.
        at: when it was decided (the ``now`` of the pass or command that committed it).
    """

    job_id: str
    at: UtcDatetime


class JobCreated(Event, frozen=True, kw_only=True, tag="job.created"):
    """The first event of every record.

    Attributes:
        spec: what to run.
        policy: the recovery policy as submitted.
        plan: the plan made from it (uncovered causes, substitutions).
        declarations: the backend's declarations the plan was made against.
        generation: G of the epoch: 0, or one more than the superseded job's.
        supersedes: the job this one supersedes (seed 002, ``Supersede``).
        by: who submitted it.
    """

    spec: JobSpec
    policy: RecoveryPolicy
    plan: Plan
    declarations: Declarations
    generation: int = 0
    supersedes: str | None = None
    by: Actor


class SubmissionOpened(Event, frozen=True, kw_only=True, tag="submission.opened"):
    """Submission N begins: the supervisor will launch it.

    Attributes:
        submission: N, 1 for the first.
        why: a :class:`SubmissionWhy`: ``initial``, ``recovery``, ``resubmit``,
            ``abandoned`` (after an all-unknown submission was abandoned) or ``ceased`` (a
            cessation fact lifted a hold).
        cause: the cause that ended the previous execution, when there was one.
        by: the actor who asked for it (resubmit), when there was one.
        cluster: the cluster the submission runs on, when it is not ``spec.cluster`` (a
            failover rule moved the job, issue 14 part 2; later submissions carry it on);
            ``None``: ``spec.cluster`` (every record written before failover existed).
    """

    submission: int
    why: SubmissionWhy
    cause: Cause | None = None
    by: Actor | None = None
    cluster: str | None = None


class LaunchIntended(Event, frozen=True, kw_only=True, tag="launch.intended"):
    """A launch is about to be made; committed before the scheduler is called, so a crash
    between intent and launch surfaces as an unknown launch, never a silent duplicate
    (DESIGN.md section 5)."""

    submission: int
    attempt: int


class LaunchRecorded(Event, frozen=True, kw_only=True, tag="launch.recorded"):
    """A launch made an object: returned by the scheduler, or found later in a Discovery
    (``found`` is then true) for a launch whose outcome was unknown."""

    submission: int
    attempt: int
    ref: ObjectRef
    found: bool = False


class LaunchRefused(Event, frozen=True, kw_only=True, tag="launch.refused"):
    """The scheduler refused a launch; ``detail`` holds its words verbatim."""

    submission: int
    attempt: int
    detail: str


class LaunchUnknown(Event, frozen=True, kw_only=True, tag="launch.unknown"):
    """The launch call ended without saying whether it made an object (a timeout, a lost
    connection); ``detail`` holds the error. The attempt stays unknown until an object turns
    up for it or a person abandons it."""

    submission: int
    attempt: int
    detail: str


class GateOpened(Event, frozen=True, kw_only=True, tag="gate.opened"):
    """dispatch opened the start gate of one of its objects."""

    ref: ObjectRef


class StopRequested(Event, frozen=True, kw_only=True, tag="stop.requested"):
    """dispatch asked the scheduler to stop an object.

    Attributes:
        ref: the object.
        why: a :class:`StopWhy`: ``cancel``, ``fence`` (node-loss window passed),
            ``duplicate``, ``outcome`` (the job has an outcome and the object still lives),
            ``recovery`` (a native requeue the policy doesn't want), ``no-capacity`` (a
            no-capacity wait passed the rule's ``wait_s``).
        emergency: whether it was an emergency stop.
        submission, attempt: for a ``duplicate`` (an object the record never launched), the
            N and a read from it, so the record keeps the object; ``None`` otherwise.
        cause: for a ``no-capacity`` stop, the ``no-capacity`` cause the scheduler showed
            (its words in ``detail``): the object's end, once the scheduler confirms it
            cancelled, is recorded with it. ``None`` otherwise (and on a re-ask).
    """

    ref: ObjectRef
    why: StopWhy
    emergency: bool = False
    submission: int | None = None
    attempt: int | None = None
    cause: Cause | None = None


class NodeLossObserved(Event, frozen=True, kw_only=True, tag="node-loss.observed"):
    """An object's node-loss window began or ended (seed 000, "The node-loss fence": "how
    long an object may report running with cause node-lost").

    Committed only when the window changes, never per poll: a node that flaps costs two
    facts per loss.

    Attributes:
        ref: the object.
        restart: the execution (restart count R) on the lost node; the window is per
            execution.
        since: set: the window began, the object first seen running with cause node-lost
            (the scheduler's ``cause.at``, else the Discovery's ``seen_at``); the fence
            comes ``node_loss_window_s`` after it. ``None``: the window ended, the object
            seen running without node-lost (its node came back); a later node-lost sighting
            begins a new window with a new fact. Records written before the ending fact
            existed always carry a time.
        cause: the node-lost cause the scheduler showed when the window began; ``None``
            when it ended.
    """

    ref: ObjectRef
    restart: int
    since: UtcDatetime | None
    cause: Cause | None = None


class NoCapacityObserved(Event, frozen=True, kw_only=True, tag="no-capacity.observed"):
    """An object's no-capacity wait began or ended (docs/core-semantics.md, "No capacity").

    Committed only when the wait changes, never per poll: a flicker costs two facts.

    Attributes:
        ref: the object (the current submission's, its gate open, no execution ended).
        since: set: the wait began, the object first seen pending, gate open, with cause
            ``no-capacity`` in the Discovery read at ``since`` (its ``seen_at``); the rule's
            ``wait_s`` runs from it. ``None``: the wait ended, the object seen without that
            cause (queued for another reason such as Slurm's ``Resources``, running, held);
            a later no-capacity sighting begins a new wait with a new fact.
        cause: the no-capacity cause the scheduler showed when the wait began (its words in
            ``detail``); ``None`` when the wait ended.
    """

    ref: ObjectRef
    since: UtcDatetime | None
    cause: Cause | None = None


class ExecutionEnded(Event, frozen=True, kw_only=True, tag="execution.ended"):
    """An execution of an object ended.

    Attributes:
        ref: the object.
        restart: R of the execution.
        cause: why, as the scheduler or the fence said.
        fenced: whether dispatch treated it as ended after the node-loss window, before the
            scheduler said so.
        submission: N of the object.
    """

    ref: ObjectRef
    restart: int
    cause: Cause
    fenced: bool = False
    submission: int


class RecoveryCommitted(Event, frozen=True, kw_only=True, tag="recovery.committed"):
    """A rule recovers the job from an ended execution (its budget is spent by one).

    Attributes:
        rule: index of the rule in the plan.
        action: the action carried out.
        cause: the cause that ended the execution.
        native: whether the backend carried it out itself (a native requeue or restart).
        free: whether it spends nothing of the rule's budget: the rule says
            ``free_if_progress`` and the ended execution advanced the published step
            (issue 14; the execution's ``progress.observed`` says so).
    """

    rule: int
    action: Action
    cause: Cause
    native: bool = False
    free: bool = False


class HoldPlaced(Event, frozen=True, kw_only=True, tag="hold.placed"):
    """A hold is placed (seed 002, ``overdue:<instance>``).

    Attributes:
        instance: 1 for the job's first hold, and so on.
        kind: ``actor`` or ``recovery``.
        by: who placed it (for a recovery hold, the supervisor).
        reason: why.
        deadline: when it becomes overdue.
        cause: for a recovery hold, the cause that ended the execution.
        rule: for a recovery hold, the rule that placed it.
        substituted_for: for a shared-checkpoint hold, the action of the rule it stands in
            for (seed 004).
    """

    instance: int
    kind: HoldKind
    by: Actor
    reason: str
    deadline: UtcDatetime
    cause: Cause | None = None
    rule: int | None = None
    substituted_for: Action | None = None


class HoldReleased(Event, frozen=True, kw_only=True, tag="hold.released"):
    """A hold ends.

    Attributes:
        instance: the hold.
        by: who ended it.
        how: a :class:`HoldHow` (``release``, ``resubmit``, ``cancel``, ``give-up``,
            ``ceased``, ``outcome`` or ``replaced``).
        override: whether ``by`` released a hold someone else placed (seed 002).
        reason: the actor's words.
    """

    instance: int
    by: Actor
    how: HoldHow
    override: bool = False
    reason: str = ""


class CessationObserved(Event, frozen=True, kw_only=True, tag="cessation.observed"):
    """The backend's cessation signal answered about an ended object (seed 004)."""

    ref: ObjectRef
    ceased: bool
    detail: str = ""


class ProgressObserved(Event, frozen=True, kw_only=True, tag="progress.observed"):
    """The job's publications when one of its executions ended (issue 14, part 1): the
    latest published epoch and step (seed 004's ``pub/`` listing, never the checkpoint), and
    whether the execution advanced the published step past the one before it.

    Attributes:
        ref: the object whose execution ended; ``restart`` its R; ``submission`` its N.
        epoch: the latest publication's epoch, ``None`` when nothing is published.
        step: the latest publication's step, ``None`` when nothing is published.
        read_at: when the ``pub/`` listing was read; ``None`` when the Discovery that showed
            the end had no listing (then nothing is taken to have advanced).
        advanced: whether ``step`` is greater than the last step a previous fact recorded
            (any step, when none did).
        rule: the plan's rule that covers the ending's cause, ``None`` when none does.
        without_progress: consecutive executions, ending with this one, that the same rule
            covered and that did not advance (0 when this one advanced); counting starts
            again after a ``no-progress`` hold.
    """

    ref: ObjectRef
    restart: int
    submission: int
    epoch: int | None = None
    step: int | None = None
    read_at: UtcDatetime | None = None
    advanced: bool = False
    rule: int | None = None
    without_progress: int = 0


class CancelRequested(Event, frozen=True, kw_only=True, tag="cancel.requested"):
    """A person or service cancelled the job."""

    by: Actor
    reason: str


class GaveUp(Event, frozen=True, kw_only=True, tag="give-up"):
    """Someone gave up on a held job: it fails with the cause that ended it (seed 002)."""

    by: Actor
    reason: str


class AbandonTarget(msgspec.Struct, frozen=True, kw_only=True):
    """What ``abandon`` closes (seed 002).

    Exactly one of: ``submission`` alone (an all-unknown submission), ``submission`` and
    ``attempt`` (an unmatched attempt), or ``foreign`` (a foreign object).
    """

    submission: int | None = None
    attempt: int | None = None
    foreign: ObjectRef | None = None

    def __str__(self) -> str:
        if self.foreign is not None:
            return f"foreign {self.foreign}"
        if self.attempt is not None:
            return f"attempt {self.submission}/{self.attempt}"
        return f"submission {self.submission}"


class Abandoned(Event, frozen=True, kw_only=True, tag="abandoned"):
    """A human closed an unknown launch or disposed of a foreign object (seed 002)."""

    target: AbandonTarget
    by: Actor
    reason: str


class EmergencyStopRequested(Event, frozen=True, kw_only=True, tag="emergency-stop.requested"):
    """A person asked for every live object of the job to be killed at once (seed 002)."""

    by: Actor
    reason: str


class OutcomeCommitted(Event, frozen=True, kw_only=True, tag="outcome.committed"):
    """The job's outcome: ``succeeded``, ``failed`` or ``cancelled``; final."""

    state: State
    cause: Cause


class EscalationCommitted(Event, frozen=True, kw_only=True, tag="escalation.committed"):
    """dispatch asks a person to decide something (seed 002). Committed once per ``id``."""

    id: str
    detail: str


class EscalationDelivered(Event, frozen=True, kw_only=True, tag="escalation.delivered"):
    """An escalation reached a person's channel."""

    id: str
    channel: str = ""


class Superseded(Event, frozen=True, kw_only=True, tag="superseded"):
    """A new job was created from this one (seed 002, ``Supersede``)."""

    new_job: str
    by: Actor
    reason: str


JobEvent = (
    JobCreated
    | SubmissionOpened
    | LaunchIntended
    | LaunchRecorded
    | LaunchRefused
    | LaunchUnknown
    | GateOpened
    | StopRequested
    | NodeLossObserved
    | NoCapacityObserved
    | ExecutionEnded
    | RecoveryCommitted
    | HoldPlaced
    | HoldReleased
    | CessationObserved
    | ProgressObserved
    | CancelRequested
    | GaveUp
    | Abandoned
    | EmergencyStopRequested
    | OutcomeCommitted
    | EscalationCommitted
    | EscalationDelivered
    | Superseded
)
"""Every event a record may hold."""

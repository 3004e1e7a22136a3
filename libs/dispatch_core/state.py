"""Domain types: states, causes, actors, objects, what a backend shows, specs and policies.

Every type here is a frozen msgspec Struct or a ``StrEnum`` whose value is the seed's own
spelling of the name, so the name is what goes on the wire. Decoding a name an enum doesn't
know raises (seed 000, "Refusing what it doesn't understand"): see :mod:`dispatch_core.codec`.

Times are timezone-aware ``datetime`` values (``UtcDatetime``); durations are ``float``
seconds, with an ``_s`` suffix on the field name.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Final

import msgspec

__all__ = [
    "COVERABLE_CAUSES",
    "JOB_ID_PATTERN",
    "Action",
    "Actor",
    "ActorKind",
    "Cause",
    "CauseKind",
    "Declarations",
    "Discovery",
    "Enforcer",
    "Execution",
    "Extension",
    "GateState",
    "HoldKind",
    "JobSpec",
    "Level",
    "ObjectPhase",
    "ObjectRef",
    "ObservedObject",
    "Plan",
    "PlannedRule",
    "Provenance",
    "Publications",
    "RecoveryPolicy",
    "RecoveryRule",
    "SharedCheckpoint",
    "State",
    "Substitution",
    "UnknownLaunchPolicy",
    "UtcDatetime",
    "is_job_id",
]

UtcDatetime = Annotated[datetime, msgspec.Meta(tz=True)]
"""A timezone-aware datetime; naive datetimes are refused when decoding."""

JOB_ID_PATTERN: Final = r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
"""Job ids are subject-safe tokens: lower-case letters, digits and ``-``, no dots, at most 63
characters so ``dj-<job>`` stays a valid Slurm job name and Kubernetes label value
(DESIGN.md section 2)."""

_JOB_ID_RE: Final = re.compile(JOB_ID_PATTERN)


def is_job_id(value: str) -> bool:
    """Return whether ``value`` is a valid job id (see ``JOB_ID_PATTERN``)."""
    return bool(_JOB_ID_RE.match(value))


class State(enum.StrEnum):
    """The coarse state of a training job (seed 000, "State and cause").

    It answers "is it doing anything, and is it finished?"; the :class:`Cause` says why.
    ``succeeded``, ``failed`` and ``cancelled`` are committed outcomes and never change.
    ``recovering`` never goes back to ``pending``.
    """

    PENDING = "pending"
    HELD = "held"
    RUNNING = "running"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        """Whether this state is a committed outcome."""
        return self in _TERMINAL


_TERMINAL: Final = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})


class CauseKind(enum.StrEnum):
    """Why a job is in its state: the closed list of seed 000 ("State and cause").

    The list is never stretched: a scheduler answer an adapter can't map is ``unknown``, with
    the scheduler's words in :attr:`Cause.detail`. ``unknown`` is something the scheduler
    said; a scheduler that can't be reached is an error, never a cause.
    """

    NONE = "none"
    PREEMPTED = "preempted"
    NODE_LOST = "node-lost"
    OUT_OF_MEMORY = "out-of-memory"
    TIME_LIMIT = "time-limit"
    NON_ZERO_EXIT = "non-zero-exit"
    LAUNCH_FAILED = "launch-failed"
    NO_CAPACITY = "no-capacity"
    HELD = "held"
    RELEASED = "released"
    REQUEUED = "requeued"
    CANCELLED = "cancelled"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"


COVERABLE_CAUSES: Final = frozenset(
    {
        CauseKind.PREEMPTED,
        CauseKind.NODE_LOST,
        CauseKind.OUT_OF_MEMORY,
        CauseKind.TIME_LIMIT,
        CauseKind.NON_ZERO_EXIT,
        CauseKind.LAUNCH_FAILED,
        CauseKind.NO_CAPACITY,
        CauseKind.REQUEUED,
        CauseKind.DUPLICATE,
        CauseKind.UNKNOWN,
    }
)
"""Causes that end an execution and that a recovery rule may name (seed 000, "Recovery
rules"). ``none`` is success and ``cancelled`` is final, so no rule covers them; ``held`` and
``released`` are decisions, not endings. ``Plan.uncovered`` is drawn from this set."""


class Provenance(enum.StrEnum):
    """Who said a cause: the scheduler, the application (an exit code), or an actor."""

    SCHEDULER = "scheduler"
    APPLICATION = "application"
    ACTOR = "actor"


class ActorKind(enum.StrEnum):
    """Whether an actor is a person or a service (seed 002: only a human may abandon)."""

    HUMAN = "human"
    SERVICE = "service"


class Actor(msgspec.Struct, frozen=True, kw_only=True):
    """Who did something: a person cancelling, a supervisor holding, a uid in Slurm's words."""

    name: str
    kind: ActorKind


class Cause(msgspec.Struct, frozen=True, kw_only=True):
    """Why a job or an object is in its state (seed 000, "State and cause").

    Attributes:
        kind: from the closed list.
        provenance: who said so.
        actor: the actor, when there was one.
        detail: the scheduler's own words, verbatim (e.g. Slurm's ``NODE_FAIL``), or the
            actor's reason.
        exit_code: the exit code, when there was one.
        at: when it happened, when known.
    """

    kind: CauseKind
    provenance: Provenance
    actor: Actor | None = None
    detail: str = ""
    exit_code: int | None = None
    at: UtcDatetime | None = None


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True):
    """A scheduler object: a Slurm job, a Kubeflow TrainJob, a local process group.

    Attributes:
        cluster: the cluster the object lives on (its backend instance).
        id: the scheduler's id for it (Slurm job id, ``namespace/name``, local id).
    """

    cluster: str
    id: str

    def __str__(self) -> str:
        return f"{self.cluster}/{self.id}"


class ObjectPhase(enum.StrEnum):
    """What the scheduler shows of one object now.

    ``stopping`` is an object the scheduler is ending (Slurm ``COMPLETING``, pods
    terminating); it is still alive. ``unknown`` is a state the adapter can't map.
    """

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    ENDED = "ended"
    UNKNOWN = "unknown"


class GateState(enum.StrEnum):
    """The start gate of an object (DESIGN.md section 7).

    ``closed``: dispatch's own gate holds it (``sbatch --hold``, Kueue's admission gate).
    ``open``: nothing holds it. ``admin-held``: someone other than dispatch holds it
    (Slurm ``JobHeldAdmin``, another gate in ``kueue.x-k8s.io/admission-gated-by``);
    dispatch never opens that one (seed 002, ``admin-held:<object id>``).
    """

    CLOSED = "closed"
    OPEN = "open"
    ADMIN_HELD = "admin-held"


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """One earlier execution of an object that lives on (a native requeue or restart).

    Attributes:
        restart: the backend's restart count R of that execution (0 for the first).
        cause: why it ended.
        nodes: the nodes it ran on, when known.
    """

    restart: int
    cause: Cause
    nodes: tuple[str, ...] = ()


class ObservedObject(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend shows of one of dispatch's objects (seed 000, "Where the state comes from").

    Adapters report this and never compute a job's state.

    Attributes:
        ref: the object.
        name: its name on the scheduler (``dj-<job id>`` or a variant).
        submission: the submission number N read from the object, or ``None`` when it can't
            be read (then the object is *foreign*: seed 002, ``foreign:<object id>``).
        attempt: the launch attempt read from the object, or ``None`` (foreign).
        phase: its phase now.
        cause: why it is in that phase: the ending cause of an ended object, ``node-lost``
            for a running object on a lost node, ``held`` for an admin-held one; ``None``
            when there is nothing to say.
        gate: its start gate.
        restarts: the backend's restart count R of the current execution.
        executions: earlier executions that ended while the object lived on, oldest first.
        nodes: the nodes the current execution runs or ran on.
    """

    ref: ObjectRef
    name: str
    submission: int | None
    attempt: int | None
    phase: ObjectPhase
    cause: Cause | None = None
    gate: GateState = GateState.OPEN
    restarts: int = 0
    executions: tuple[Execution, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def foreign(self) -> bool:
        """Whether submission and attempt can't be read from the object."""
        return self.submission is None or self.attempt is None

    @property
    def alive(self) -> bool:
        """Whether the scheduler still has the object in a non-ended phase."""
        return self.phase is not ObjectPhase.ENDED


class Discovery(msgspec.Struct, frozen=True, kw_only=True):
    """What one backend shows now of one job's objects (DESIGN.md section 3).

    Gone is not ended (issue 15): an object the scheduler stops listing is looked up where
    the scheduler keeps ends (Slurm's accounting, the local archive, the TrainJob's last
    terminal condition) and shown ended with its real cause; the observer keeps showing an
    object it last saw ended after the scheduler forgets it, so a reader of only the latest
    Discovery still sees the end. Only an object the scheduler has no word for at all, after
    a full reachable poll since it was last seen alive, is listed in ``vanished``; the core
    records an ``unknown`` end for it. An object merely absent from a Discovery (one taken
    before the object could show, or one the observer never saw) proves nothing and is never
    ended for that. A scheduler that couldn't be reached produces no Discovery at all.

    Attributes:
        cluster: the cluster that was asked.
        job_id: the job the objects are named for.
        seen_at: when the backend was asked.
        objects: every object named for the job, dispatch's own and foreign ones, including
            those shown ended (by the scheduler, its accounting, or the observer's memory).
        vanished: objects of the job the observer saw alive and the scheduler no longer has
            any record of (neither listed live nor found where it keeps ends).
        publications: what the job's ``pub/`` listing showed, when the observer read it in
            this poll (issue 14); ``None`` when it didn't (no checkpoint root, or not due).
        merged: the other clusters whose Discoveries of the job this one merges, beside
            ``cluster`` (``dispatch_core.failover.merge_discoveries``: a job that failed over
            has objects on more than one cluster); empty in what an observer publishes.
    """

    cluster: str
    job_id: str
    seen_at: UtcDatetime
    objects: tuple[ObservedObject, ...] = ()
    vanished: tuple[ObjectRef, ...] = ()
    publications: Publications | None = None
    merged: tuple[str, ...] = ()

    def covers(self, cluster: str) -> bool:
        """Whether this Discovery says what ``cluster``'s scheduler shows: its own
        ``cluster``, or one of the ``merged`` ones (issue 14, failover). An object on a
        cluster it doesn't cover is neither shown nor proven absent by it."""
        return cluster == self.cluster or cluster in self.merged


class Publications(msgspec.Struct, frozen=True, kw_only=True):
    """What a job's ``pub/`` listing showed (seed 004: "The latest checkpoint is the entry with
    the greatest epoch, then step, found by listing pub/"). Only the listing is read, never
    the checkpoint itself.

    Attributes:
        read_at: when the listing was read.
        epoch: the latest publication's epoch, ``None`` when nothing is published.
        step: the latest publication's step (training steps, as the job numbers them),
            ``None`` when nothing is published.
    """

    read_at: UtcDatetime
    epoch: int | None = None
    step: int | None = None


class Action(enum.StrEnum):
    """What a recovery rule does when an execution ends with a cause it covers (seed 000)."""

    RESUBMIT = "resubmit"
    HOLD = "hold"
    ESCALATE = "escalate"
    RESTART = "restart"
    REQUEUE = "requeue"


class Enforcer(enum.StrEnum):
    """Who carries out a rule: the supervisor, or the backend natively."""

    SUPERVISOR = "supervisor"
    BACKEND = "backend"


class Declarations(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend declares about itself (seed 000, "The node-loss fence").

    Attributes:
        node_loss_window_s: seconds an object may report running with cause ``node-lost``
            before dispatch treats its execution as ended.
        native_actions: recovery actions the backend enforces natively (``restart``,
            ``requeue``).
        cessation_signal: whether the backend has the optional cessation signal (seed 004).
        emergency_stop: whether the backend has the optional emergency stop (seed 002).
        idempotent_start: whether a start is idempotent per attempt: starting the same
            launch (job, N, a) again makes no second object but returns the one the first
            start made, whether it is pending, running or ended (local and Kubeflow, by the
            object's deterministic name). The planner then completes a launch whose outcome
            a crash lost, instead of leaving it to a person (docs/core-semantics.md,
            "Launches that survive the launcher").
    """

    node_loss_window_s: float
    native_actions: frozenset[Action] = frozenset()
    cessation_signal: bool = False
    emergency_stop: bool = False
    idempotent_start: bool = False


class SharedCheckpoint(msgspec.Struct, frozen=True, kw_only=True, tag="shared-checkpoint"):
    """The job shares a mutable checkpoint and can't write per execution (seed 004, "When a
    job can't isolate"): every recovery rule becomes a 24 h hold, shown in the plan."""


Extension = SharedCheckpoint
"""The union of job extensions; an unknown extension tag is refused when decoding."""


class UnknownLaunchPolicy(enum.StrEnum):
    """What the supervisor does after a launch whose outcome is unknown (seed 002, "Choose an
    unmatched policy").

    ``wait``: launch nothing more for that submission; if no object turns up within the
    unresolved age, escalate ``all-unknown:<N>`` and wait for a person to abandon it.
    ``relaunch``: launch the next attempt at once; an attempt whose object never turns up
    is escalated ``unmatched:<N>/<a>`` and one that turns up late is stopped as a duplicate.
    """

    WAIT = "wait"
    RELAUNCH = "relaunch"


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to run, where, and the job's own limits.

    Attributes:
        cluster: the cluster (backend instance) to run on.
        command: the program and its arguments (local and Kubeflow backends), or empty.
        script: a batch script (Slurm: its ``#SBATCH`` lines are kept), or empty.
        options: backend options, by name (e.g. Slurm ``partition``, ``time``).
        env: environment variables for the job.
        checkpoint: the checkpoint root passed through to the job as
            ``DISPATCH_CHECKPOINT``; dispatch never reads it (seed 004, "Limits"). Each
            ``{job}`` in it stands for the job's id and is replaced once, when the job is
            created (like Slurm's ``%j``): ``/ckpt/{job}`` gives every job submitted from one
            file a root of its own, and the record holds the concrete root. No other brace
            is special. A superseding job keeps the old job's concrete root, so it continues
            from the old job's checkpoints.
        extensions: job extensions (:class:`SharedCheckpoint`).
        unresolved_age_s: seconds a launch may stay unknown before it is escalated
            (seed 002, default 10 minutes).
        cleanup_deadline_s: seconds after a cancel (or the outcome) before an unsettled job
            escalates ``cleanup-deadline`` (seed 002, default 30 minutes).
        max_launch_attempts: launch attempts per submission before ``refused:<N>``.
        on_unknown_launch: see :class:`UnknownLaunchPolicy`.
        stop_overdue_s: seconds after dispatch first asked an object to stop before, if the
            scheduler still doesn't show it ended, ``stop-overdue:<object id>`` is escalated
            (issue 15; default 30 minutes). The stop is asked again meanwhile, and a
            replacement's gate stays closed whatever this says.
        owner: the Unix user the job runs as, on a backend that runs jobs as their owners
            (Slurm with ``users`` set: sbatch, scontrol release and scancel run as this
            user); empty: the backend's own user. Set by the API from the submitting
            actor's mapping (``unix_user`` in the tokens file, issue 16), never taken from a
            client that may not act for that user.
    """

    cluster: str
    command: tuple[str, ...] = ()
    script: str = ""
    options: dict[str, str] = msgspec.field(default_factory=dict)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    checkpoint: str | None = None
    extensions: tuple[Extension, ...] = ()
    unresolved_age_s: float = 600.0
    cleanup_deadline_s: float = 1800.0
    max_launch_attempts: int = 3
    on_unknown_launch: UnknownLaunchPolicy = UnknownLaunchPolicy.WAIT
    stop_overdue_s: float = 1800.0
    owner: str = ""

    @property
    def shared_checkpoint(self) -> bool:
        """Whether the job declared :class:`SharedCheckpoint`."""
        return any(isinstance(e, SharedCheckpoint) for e in self.extensions)


class RecoveryRule(msgspec.Struct, frozen=True, kw_only=True):
    """One recovery rule: which causes it covers and what it does (seed 000).

    Attributes:
        on: the cause kinds it covers.
        action: what it does.
        budget: how many recoveries it may make over the job's life (resubmit, restart,
            requeue); unused by hold and escalate.
        enforcer: who carries it out. ``restart`` and ``requeue`` are only carried out by a
            backend that enforces them natively.
        hold_for_s: for a hold rule, seconds until the hold is overdue (escalated, never
            lifted on its own).
        free_if_progress: a recovery whose ended execution advanced the job's published
            step (seed 004's ``pub/`` listing) does not spend the budget (issue 14, part 1).
        max_without_progress: after this many consecutive executions ended by a cause the
            rule covers without advancing the published step, the job is held under a
            recovery hold with escalation ``no-progress:<N>``; ``None``: never.
        clusters: for a resubmit rule, the clusters to fail over to, in order (issue 14,
            part 2): the submission a recovery by this rule opens goes to the cluster after
            the current one in this list (the first when the current one isn't listed; the
            last stays on the last). Empty: the next submission stays on the current
            cluster. See ``dispatch_core.failover``.
        wait_s: for a rule covering ``no-capacity``, seconds a no-capacity wait is tolerated:
            once every pass for that long has seen the current submission's object pending,
            gate open, for want of capacity (counted from the first such sighting; one
            showing it otherwise, e.g. queued on ``Resources``, ends the wait), the
            supervisor stops it and applies this rule to the ending ``no-capacity``.
            ``None``: ``NO_CAPACITY_WAIT_S`` (600 s). Only legal on a rule covering
            ``no-capacity``. See docs/core-semantics.md, "No capacity".
    """

    on: tuple[CauseKind, ...]
    action: Action
    budget: int = 0
    enforcer: Enforcer = Enforcer.SUPERVISOR
    hold_for_s: float = 86400.0
    free_if_progress: bool = False
    max_without_progress: int | None = None
    clusters: tuple[str, ...] = ()
    wait_s: float | None = None


class RecoveryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The job's recovery rules; ``validate`` refuses an illegal one."""

    rules: tuple[RecoveryRule, ...] = ()


class Substitution(msgspec.Struct, frozen=True, kw_only=True):
    """A rule the plan changed before the job starts, and why (seed 004, shared checkpoints).

    Attributes:
        rule: index of the rule in the policy.
        original: the rule's own action.
        substitute: the action the plan carries out instead.
        reason: the sentence shown to the user.
    """

    rule: int
    original: Action
    substitute: Action
    reason: str


class PlannedRule(msgspec.Struct, frozen=True, kw_only=True):
    """A rule as the plan applies it.

    Attributes:
        rule: index of the rule in the policy.
        on: the causes it covers.
        action: the action applied (after any substitution).
        budget: its budget.
        enforcer: who carries it out.
        hold_for_s: seconds until a hold it places is overdue.
        substituted_for: the rule's own action when a substitution replaced it.
        unenforced: why nobody enforces it, when nobody does (the job then fails with an
            escalation saying so, seed 000 "An object ending is not the job ending").
        free_if_progress, max_without_progress: the rule's progress settings (issue 14).
        clusters: the rule's failover clusters, in order (issue 14, part 2; empty: none).
        wait_s: for a rule covering ``no-capacity``, the seconds a no-capacity wait is
            tolerated (the rule's own, else ``NO_CAPACITY_WAIT_S``); ``None`` for a rule
            that doesn't cover it (and in plans recorded before the setting existed: the
            planner then takes ``NO_CAPACITY_WAIT_S``).
    """

    rule: int
    on: tuple[CauseKind, ...]
    action: Action
    budget: int
    enforcer: Enforcer
    hold_for_s: float
    substituted_for: Action | None = None
    unenforced: str | None = None
    free_if_progress: bool = False
    max_without_progress: int | None = None
    clusters: tuple[str, ...] = ()
    wait_s: float | None = None

    @property
    def progress_aware(self) -> bool:
        """Whether the rule reads the job's publications (either progress setting)."""
        return self.free_if_progress or self.max_without_progress is not None


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """How a job will be recovered, shown before it starts (seed 000, "Recovery rules").

    Attributes:
        rules: the rules as applied, in policy order.
        uncovered: every coverable cause no rule covers; an execution ending with one fails
            the job.
        substitutions: the rules the plan changed, with the reason.
    """

    rules: tuple[PlannedRule, ...]
    uncovered: tuple[CauseKind, ...]
    substitutions: tuple[Substitution, ...] = ()

    def rule_for(self, kind: CauseKind) -> PlannedRule | None:
        """Return the rule that covers ``kind``, or ``None``."""
        for rule in self.rules:
            if kind in rule.on:
                return rule
        return None


class HoldKind(enum.StrEnum):
    """Who placed a hold (seed 002): an actor (releasable) or a recovery rule (not)."""

    ACTOR = "actor"
    RECOVERY = "recovery"


class Level(enum.StrEnum):
    """How much a Status knows: ``full`` from the record, ``object-only`` from the
    scheduler alone (seed 000, "Without a record")."""

    FULL = "full"
    OBJECT_ONLY = "object-only"

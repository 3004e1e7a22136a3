"""Hypothesis strategies for every core type, and for records a real dispatch could write.

Two kinds:

* **arbitrary values** (``ROUND_TRIP`` maps each decodable type to one): any value the type
  holds, for codec round-trips. Floats are finite (JSON has no NaN), ints fit in 64 bits,
  datetimes are timezone-aware.
* **valid records** (:func:`records`): ``(seq, event)`` sequences built step by step against
  the folded job, the way the supervisor and ``decide`` would write them: launches and their
  outcomes, executions ending with every cause, the plan's rule applied (recovery, hold,
  failure), the node-loss fence, native requeues, duplicates, cessation facts, escalations
  and their delivery, and every operator command through ``decide`` itself. Sequences
  increase with gaps (a stream holds many jobs), times never go back.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final

from hypothesis import strategies as st

from dispatch_core import (
    JOB_ID_PATTERN,
    SUPERVISOR,
    Abandon,
    Abandoned,
    AbandonTarget,
    Action,
    Actor,
    ActorKind,
    AnyStep,
    AskCessation,
    Attempt,
    Cancel,
    CancelRequested,
    Cause,
    CauseKind,
    CessationObserved,
    Commit,
    Declarations,
    Deliver,
    Discovery,
    EmergencyStop,
    EmergencyStopRequested,
    Enforcer,
    Escalation,
    EscalationCommitted,
    EscalationDelivered,
    Execution,
    ExecutionEnded,
    GateOpened,
    GateState,
    GaveUp,
    GiveUp,
    Hold,
    HoldCommand,
    HoldHow,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    HoldView,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    Launch,
    LaunchIntended,
    LaunchOutcome,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
    Level,
    NoCapacityObserved,
    NodeLossObserved,
    ObjectPhase,
    ObjectRecord,
    ObjectRef,
    ObservedObject,
    OpenGate,
    OperatorCommand,
    OutcomeCommitted,
    Plan,
    PlannedRule,
    Provenance,
    Recovery,
    RecoveryCommitted,
    RecoveryPolicy,
    RecoveryRule,
    Refused,
    Release,
    Resubmit,
    SharedCheckpoint,
    State,
    Status,
    Stop,
    StopRequested,
    StopWhy,
    Submission,
    SubmissionOpened,
    SubmissionWhy,
    Submit,
    Substitution,
    Supersede,
    Superseded,
    Transition,
    UnknownLaunchPolicy,
    decide,
    fold,
    make_plan,
)
from tests.util import written

Record = list[tuple[int, JobEvent]]

# --------------------------------------------------------------------------------------
# Primitives
# --------------------------------------------------------------------------------------

T0: Final = datetime(2026, 1, 1, tzinfo=UTC)

times = st.datetimes(
    min_value=datetime(2000, 1, 1),  # noqa: DTZ001 - hypothesis wants naive bounds
    max_value=datetime(2100, 1, 1),  # noqa: DTZ001
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5))]),
)
"""Timezone-aware datetimes (UTC and fixed offsets)."""

words = st.text(max_size=24)
"""Any text (no surrogates: JSON is UTF-8)."""

ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.integers(min_value=0, max_value=50)
counts = st.integers(min_value=1, max_value=999_999)
seconds = st.floats(allow_nan=False, allow_infinity=False)
job_ids = st.from_regex(JOB_ID_PATTERN, fullmatch=True)

actor_kinds = st.sampled_from(ActorKind)
actors = st.builds(Actor, name=words, kind=actor_kinds)
humans = st.builds(
    Actor, name=st.sampled_from(["alice", "bob", "carol"]), kind=st.just(ActorKind.HUMAN)
)
cause_kinds = st.sampled_from(CauseKind)
causes = st.builds(
    Cause,
    kind=cause_kinds,
    provenance=st.sampled_from(Provenance),
    actor=st.none() | actors,
    detail=words,
    exit_code=st.none() | ints64,
    at=st.none() | times,
)
refs = st.builds(ObjectRef, cluster=words, id=words)
actions = st.sampled_from(Action)
enforcers = st.sampled_from(Enforcer)

# --------------------------------------------------------------------------------------
# State types
# --------------------------------------------------------------------------------------

executions = st.builds(
    Execution, restart=small, cause=causes, nodes=st.tuples() | st.tuples(words, words)
)
observed_objects = st.builds(
    ObservedObject,
    ref=refs,
    name=words,
    submission=st.none() | counts,
    attempt=st.none() | counts,
    phase=st.sampled_from(ObjectPhase),
    cause=st.none() | causes,
    gate=st.sampled_from(GateState),
    restarts=st.integers(min_value=0, max_value=999_999),
    executions=st.lists(executions, max_size=3).map(tuple),
    nodes=st.lists(words, max_size=3).map(tuple),
)
discoveries = st.builds(
    Discovery,
    cluster=words,
    job_id=job_ids,
    seen_at=times,
    objects=st.lists(observed_objects, max_size=4).map(tuple),
)
declarations = st.builds(
    Declarations,
    node_loss_window_s=seconds,
    native_actions=st.frozensets(actions),
    cessation_signal=st.booleans(),
    emergency_stop=st.booleans(),
    idempotent_start=st.booleans(),
)
specs = st.builds(
    JobSpec,
    cluster=words,
    command=st.lists(words, max_size=3).map(tuple),
    script=words,
    options=st.dictionaries(words, words, max_size=3),
    env=st.dictionaries(words, words, max_size=3),
    checkpoint=st.none() | words,
    extensions=st.sampled_from([(), (SharedCheckpoint(),)]),
    unresolved_age_s=seconds,
    cleanup_deadline_s=seconds,
    max_launch_attempts=ints64,
    on_unknown_launch=st.sampled_from(UnknownLaunchPolicy),
)
rules = st.builds(
    RecoveryRule,
    on=st.lists(cause_kinds, max_size=4).map(tuple),
    action=actions,
    budget=ints64,
    enforcer=enforcers,
    hold_for_s=seconds,
)
"""Any rule, legal or not (for round-trips and the ``validate`` oracle)."""
policies = st.builds(RecoveryPolicy, rules=st.lists(rules, max_size=4).map(tuple))
planned_rules = st.builds(
    PlannedRule,
    rule=small,
    on=st.lists(cause_kinds, max_size=4).map(tuple),
    action=actions,
    budget=ints64,
    enforcer=enforcers,
    hold_for_s=seconds,
    substituted_for=st.none() | actions,
    unenforced=st.none() | words,
)
substitutions = st.builds(
    Substitution, rule=small, original=actions, substitute=actions, reason=words
)
plans = st.builds(
    Plan,
    rules=st.lists(planned_rules, max_size=3).map(tuple),
    uncovered=st.lists(cause_kinds, max_size=4).map(tuple),
    substitutions=st.lists(substitutions, max_size=2).map(tuple),
)
abandon_targets = st.one_of(
    st.builds(AbandonTarget, submission=counts),
    st.builds(AbandonTarget, submission=counts, attempt=counts),
    st.builds(AbandonTarget, foreign=refs),
)

# --------------------------------------------------------------------------------------
# Events (arbitrary values)
# --------------------------------------------------------------------------------------


def _event(cls: type[Any], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(cls, job_id=job_ids, at=times, **fields)


_EVENT_STRATEGIES: Final[dict[type[Any], st.SearchStrategy[Any]]] = {
    JobCreated: _event(
        JobCreated,
        spec=specs,
        policy=policies,
        plan=plans,
        declarations=declarations,
        generation=small,
        supersedes=st.none() | job_ids,
        by=actors,
    ),
    SubmissionOpened: _event(
        SubmissionOpened,
        submission=counts,
        why=st.sampled_from(SubmissionWhy),
        cause=st.none() | causes,
        by=st.none() | actors,
    ),
    LaunchIntended: _event(LaunchIntended, submission=counts, attempt=counts),
    LaunchRecorded: _event(
        LaunchRecorded, submission=counts, attempt=counts, ref=refs, found=st.booleans()
    ),
    LaunchRefused: _event(LaunchRefused, submission=counts, attempt=counts, detail=words),
    LaunchUnknown: _event(LaunchUnknown, submission=counts, attempt=counts, detail=words),
    GateOpened: _event(GateOpened, ref=refs),
    StopRequested: _event(
        StopRequested,
        ref=refs,
        why=st.sampled_from(StopWhy),
        emergency=st.booleans(),
        submission=st.none() | counts,
        attempt=st.none() | counts,
    ),
    NodeLossObserved: _event(
        NodeLossObserved, ref=refs, restart=small, since=st.none() | times, cause=st.none() | causes
    ),
    NoCapacityObserved: _event(
        NoCapacityObserved, ref=refs, since=st.none() | times, cause=st.none() | causes
    ),
    ExecutionEnded: _event(
        ExecutionEnded,
        ref=refs,
        restart=small,
        cause=causes,
        fenced=st.booleans(),
        submission=counts,
    ),
    RecoveryCommitted: _event(
        RecoveryCommitted, rule=small, action=actions, cause=causes, native=st.booleans()
    ),
    HoldPlaced: _event(
        HoldPlaced,
        instance=counts,
        kind=st.sampled_from(HoldKind),
        by=actors,
        reason=words,
        deadline=times,
        cause=st.none() | causes,
        rule=st.none() | small,
        substituted_for=st.none() | actions,
    ),
    HoldReleased: _event(
        HoldReleased,
        instance=counts,
        by=actors,
        how=st.sampled_from(HoldHow),
        override=st.booleans(),
        reason=words,
    ),
    CessationObserved: _event(CessationObserved, ref=refs, ceased=st.booleans(), detail=words),
    CancelRequested: _event(CancelRequested, by=actors, reason=words),
    GaveUp: _event(GaveUp, by=actors, reason=words),
    Abandoned: _event(Abandoned, target=abandon_targets, by=actors, reason=words),
    EmergencyStopRequested: _event(EmergencyStopRequested, by=actors, reason=words),
    OutcomeCommitted: _event(
        OutcomeCommitted,
        state=st.sampled_from([State.SUCCEEDED, State.FAILED, State.CANCELLED]),
        cause=causes,
    ),
    EscalationCommitted: _event(EscalationCommitted, id=words, detail=words),
    EscalationDelivered: _event(EscalationDelivered, id=words, channel=words),
    Superseded: _event(Superseded, new_job=job_ids, by=actors, reason=words),
}

any_events: st.SearchStrategy[JobEvent] = st.one_of(*_EVENT_STRATEGIES.values())
"""Any single event, of any type, with arbitrary (not necessarily legal) fields."""


def events_of(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Arbitrary events of one type."""
    return _EVENT_STRATEGIES[cls]


# --------------------------------------------------------------------------------------
# Job and Status (arbitrary values)
# --------------------------------------------------------------------------------------

attempts = st.builds(
    Attempt,
    submission=counts,
    attempt=counts,
    intended_at=times,
    outcome=st.sampled_from(LaunchOutcome),
    ref=st.none() | refs,
    detail=words,
)
submissions = st.builds(
    Submission,
    number=counts,
    opened_at=times,
    why=words,
    cause=st.none() | causes,
    attempts=st.lists(attempts, max_size=3).map(tuple),
)
object_records = st.builds(
    ObjectRecord,
    ref=refs,
    submission=counts,
    attempt=counts,
    gate_opened_at=st.none() | times,
    stop_requested_at=st.none() | times,
    stop_why=words,
    emergency_stop_at=st.none() | times,
    node_loss_since=st.none() | times,
    node_loss_restart=st.none() | small,
    ended=st.lists(small, max_size=3).map(tuple),
    fenced=st.booleans(),
    cessation_asked_at=st.none() | times,
    ceased=st.none() | st.booleans(),
    duplicate=st.booleans(),
)
recoveries = st.builds(
    Recovery, at=times, rule=small, action=actions, cause=causes, native=st.booleans()
)
holds = st.builds(
    Hold,
    instance=counts,
    kind=st.sampled_from(HoldKind),
    by=actors,
    reason=words,
    placed_at=times,
    deadline=times,
    cause=st.none() | causes,
    rule=st.none() | small,
    substituted_for=st.none() | actions,
    released_at=st.none() | times,
    released_by=st.none() | actors,
    released_how=words,
    override=st.booleans(),
)
escalations = st.builds(Escalation, id=words, at=times, detail=words, delivered=st.none() | times)
transitions = st.builds(
    Transition, at=times, state=st.sampled_from(State), cause=causes, detail=words
)
jobs = st.builds(
    Job,
    job_id=job_ids,
    seq=st.integers(min_value=0, max_value=2**63 - 1),
    spec=specs,
    policy=policies,
    plan=plans,
    declarations=declarations,
    generation=small,
    supersedes=st.none() | job_ids,
    superseded_by=st.none() | job_ids,
    created_at=times,
    created_by=actors,
    submissions=st.lists(submissions, max_size=3).map(tuple),
    objects=st.lists(object_records, max_size=3).map(tuple),
    recoveries=st.lists(recoveries, max_size=3).map(tuple),
    holds=st.lists(holds, max_size=2).map(tuple),
    outcome=st.none() | st.sampled_from([State.SUCCEEDED, State.FAILED, State.CANCELLED]),
    outcome_cause=st.none() | causes,
    outcome_at=st.none() | times,
    cancel_requested_at=st.none() | times,
    cancelled_by=st.none() | actors,
    emergency_stop_at=st.none() | times,
    abandoned=st.lists(abandon_targets, max_size=2).map(tuple),
    escalations=st.lists(escalations, max_size=3).map(tuple),
    history=st.lists(transitions, max_size=3).map(tuple),
    ended_cause=st.none() | causes,
)
hold_views = st.builds(
    HoldView,
    instance=counts,
    kind=st.sampled_from(HoldKind),
    by=actors,
    reason=words,
    since=times,
    deadline=times,
    overdue=st.booleans(),
    cause=st.none() | causes,
    substituted_for=st.none() | actions,
)
statuses = st.builds(
    Status,
    job_id=job_ids,
    level=st.sampled_from(Level),
    state=st.sampled_from(State),
    cause=causes,
    at=times,
    seq=st.integers(min_value=0, max_value=2**63 - 1),
    hold=st.none() | hold_views,
    history=st.lists(transitions, max_size=3).map(tuple),
    supersedes=st.none() | job_ids,
    superseded_by=st.none() | job_ids,
    submission=st.none() | counts,
    epoch=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
    objects=st.lists(refs, max_size=3).map(tuple),
    settled=st.booleans(),
)

# --------------------------------------------------------------------------------------
# Steps and commands (arbitrary values)
# --------------------------------------------------------------------------------------

_keys = st.text(max_size=30)
steps: st.SearchStrategy[AnyStep] = st.one_of(
    st.builds(Commit, key=_keys, event=any_events),
    st.builds(
        Launch,
        key=_keys,
        intent=events_of(LaunchIntended),
        name=words,
        spec=specs,
        generation=small,
        submission=counts,
        attempt=counts,
        exclude_nodes=st.lists(words, max_size=2).map(tuple),
    ),
    st.builds(OpenGate, key=_keys, ref=refs),
    st.builds(Stop, key=_keys, intent=events_of(StopRequested)),
    st.builds(AskCessation, key=_keys, ref=refs, nodes=st.lists(words, max_size=2).map(tuple)),
    st.builds(Deliver, key=_keys, escalations=st.lists(escalations, max_size=2).map(tuple)),
)

commands: st.SearchStrategy[OperatorCommand] = st.one_of(
    st.builds(
        Submit,
        by=actors,
        reason=words,
        job_id=words,
        spec=specs,
        policy=policies,
        declarations=declarations,
    ),
    st.builds(HoldCommand, by=actors, reason=words, for_s=seconds),
    st.builds(Release, by=actors, reason=words),
    st.builds(Resubmit, by=actors, reason=words),
    st.builds(Cancel, by=actors, reason=words),
    st.builds(GiveUp, by=actors, reason=words),
    st.builds(Abandon, by=actors, reason=words, target=abandon_targets),
    st.builds(Supersede, by=actors, reason=words, new_job_id=words),
    st.builds(EmergencyStop, by=actors, reason=words),
)

ROUND_TRIP: Final[dict[str, tuple[Any, st.SearchStrategy[Any]]]] = {
    "event": (JobEvent, any_events),
    "discovery": (Discovery, discoveries),
    "status": (Status, statuses),
    "job": (Job, jobs),
    "step": (AnyStep, steps),
    "command": (OperatorCommand, commands),
    "plan": (Plan, plans),
    "policy": (RecoveryPolicy, policies),
    "spec": (JobSpec, specs),
    "declarations": (Declarations, declarations),
    "observed-object": (ObservedObject, observed_objects),
}
"""For each decodable type: ``(type, strategy of arbitrary values)``."""

# --------------------------------------------------------------------------------------
# Valid records
# --------------------------------------------------------------------------------------

_ENDING_CAUSES: Final = (
    CauseKind.NONE,
    CauseKind.PREEMPTED,
    CauseKind.NODE_LOST,
    CauseKind.OUT_OF_MEMORY,
    CauseKind.TIME_LIMIT,
    CauseKind.NON_ZERO_EXIT,
    CauseKind.NO_CAPACITY,
    CauseKind.REQUEUED,
    CauseKind.CANCELLED,
    CauseKind.UNKNOWN,
)

legal_rules = st.builds(
    RecoveryRule,
    on=st.lists(
        st.sampled_from((*_ENDING_CAUSES[1:-2], CauseKind.LAUNCH_FAILED)),
        min_size=1,
        max_size=3,
        unique=True,
    ).map(tuple),
    action=st.sampled_from(
        [
            Action.RESUBMIT,
            Action.RESUBMIT,
            Action.RESUBMIT,
            Action.HOLD,
            Action.ESCALATE,
            Action.REQUEUE,
        ]
    ),
    budget=st.integers(min_value=0, max_value=3),
    enforcer=enforcers,
    hold_for_s=st.sampled_from([60.0, 3600.0, 86400.0]),
)


@st.composite
def legal_policies(draw: st.DrawFn) -> RecoveryPolicy:
    """Policies ``validate`` accepts: disjoint rules, ``unknown`` only by hold or escalate."""
    chosen: list[RecoveryRule] = []
    covered: set[CauseKind] = set()
    for rule in draw(st.lists(legal_rules, max_size=4)):
        on = tuple(k for k in rule.on if k not in covered)
        if on:
            covered.update(on)
            chosen.append(
                RecoveryRule(
                    on=on,
                    action=rule.action,
                    budget=rule.budget,
                    enforcer=rule.enforcer,
                    hold_for_s=rule.hold_for_s,
                )
            )
    if CauseKind.UNKNOWN not in covered and draw(st.booleans()):
        chosen.append(
            RecoveryRule(
                on=(CauseKind.UNKNOWN,),
                action=draw(st.sampled_from([Action.HOLD, Action.ESCALATE])),
            )
        )
    return RecoveryPolicy(rules=tuple(chosen))


@st.composite
def submits(draw: st.DrawFn, job_id: str = "job-1") -> Submit:
    """A ``Submit`` with a legal policy, as an operator would send it."""
    return Submit(
        by=draw(humans),
        job_id=job_id,
        spec=JobSpec(
            cluster="c1",
            extensions=draw(st.sampled_from([(), (SharedCheckpoint(),)])),
            max_launch_attempts=draw(st.integers(min_value=1, max_value=3)),
            on_unknown_launch=draw(st.sampled_from(UnknownLaunchPolicy)),
        ),
        policy=draw(legal_policies()),
        declarations=Declarations(
            node_loss_window_s=120.0,
            native_actions=draw(st.frozensets(st.sampled_from([Action.REQUEUE, Action.RESTART]))),
            cessation_signal=draw(st.booleans()),
            emergency_stop=draw(st.booleans()),
        ),
    )


class _Writer:
    """Appends events the way the supervisor would: seq with gaps, time moving on."""

    def __init__(self, draw: st.DrawFn, created: JobCreated) -> None:
        self.draw = draw
        self.record: Record = []
        self.seq = 0
        self.now = created.at
        self.job: Job | None = None
        self.next_ref = 100
        self.append(created)

    def tick(self) -> datetime:
        self.now += timedelta(seconds=self.draw(st.sampled_from([0, 1, 30, 600, 90000])))
        return self.now

    def append(self, *events: JobEvent) -> None:
        batch: Record = []
        for ev in events:
            self.seq += self.draw(st.integers(min_value=1, max_value=3))
            batch.append((self.seq, ev))
        self.record.extend(batch)
        self.job = fold(written(batch), self.now, prior=self.job)

    def new_ref(self) -> ObjectRef:
        self.next_ref += 1
        return ObjectRef(cluster="c1", id=str(self.next_ref))


def _fail(w: _Writer, job: Job, cause: Cause, esc: str, detail: str) -> list[JobEvent]:
    out: list[JobEvent] = [
        OutcomeCommitted(job_id=job.job_id, at=w.now, state=State.FAILED, cause=cause)
    ]
    if job.escalation(esc) is None:
        out.append(EscalationCommitted(job_id=job.job_id, at=w.now, id=esc, detail=detail))
    return out


def _apply_rule(w: _Writer, job: Job, cause: Cause, *, lives_on: bool) -> list[JobEvent]:
    """The planner's step 3 for an ended execution of the current submission."""
    j, now = job.job_id, w.now
    if cause.kind is CauseKind.NONE:
        return [OutcomeCommitted(job_id=j, at=now, state=State.SUCCEEDED, cause=cause)]
    if cause.kind is CauseKind.CANCELLED:
        return [OutcomeCommitted(job_id=j, at=now, state=State.CANCELLED, cause=cause)]
    rule = job.plan.rule_for(cause.kind)
    esc = f"failed:{cause.kind}"
    if rule is None or rule.action is Action.ESCALATE or rule.unenforced:
        return _fail(w, job, cause, esc, f"no rule recovers {cause.kind}")
    if rule.action is Action.HOLD:
        return [
            HoldPlaced(
                job_id=j,
                at=now,
                instance=len(job.holds) + 1,
                kind=HoldKind.RECOVERY,
                by=SUPERVISOR,
                reason=f"rule {rule.rule} holds on {cause.kind}",
                deadline=now + timedelta(seconds=rule.hold_for_s),
                cause=cause,
                rule=rule.rule,
                substituted_for=rule.substituted_for,
            )
        ]
    if job.spent(rule.rule) >= rule.budget:
        return _fail(w, job, cause, esc, f"budget of rule {rule.rule} spent")
    if rule.action is Action.RESUBMIT:
        return [
            RecoveryCommitted(job_id=j, at=now, rule=rule.rule, action=rule.action, cause=cause),
            SubmissionOpened(
                job_id=j,
                at=now,
                submission=len(job.submissions) + 1,
                why=SubmissionWhy.RECOVERY,
                cause=cause,
            ),
        ]
    # restart/requeue enforced natively: the backend runs it again if the object lives on.
    if lives_on:
        return [
            RecoveryCommitted(
                job_id=j, at=now, rule=rule.rule, action=rule.action, cause=cause, native=True
            )
        ]
    return _fail(w, job, cause, esc, "the backend did not requeue")


def _ending_cause(draw: st.DrawFn, at: datetime, plan: Plan) -> Cause:
    """A cause an execution ends with: half the time one the plan covers."""
    covered: list[CauseKind] = [kind for rule in plan.rules for kind in rule.on]
    pick_covered: bool = draw(st.booleans())
    kind: CauseKind = draw(st.sampled_from(covered if covered and pick_covered else _ENDING_CAUSES))
    return Cause(
        kind=kind,
        provenance=Provenance.APPLICATION
        if kind is CauseKind.NON_ZERO_EXIT
        else Provenance.SCHEDULER,
        detail=draw(st.sampled_from(["", "NODE_FAIL", "PREEMPTED", "TIMEOUT", "OOMKilled", "??"])),
        exit_code=1 if kind is CauseKind.NON_ZERO_EXIT else None,
        at=at,
    )


_STOPPED: Final = Cause(kind=CauseKind.CANCELLED, provenance=Provenance.ACTOR, detail="stopped")

Move = Callable[[], list[JobEvent]]


def _commands(w: _Writer, job: Job) -> list[Move]:
    """Every operator command, through ``decide`` (a refused one adds nothing)."""
    draw, j = w.draw, job.job_id

    def cmd(make: Callable[[], OperatorCommand]) -> Move:
        def run() -> list[JobEvent]:
            try:
                events = decide(job, make(), w.now)
            except Refused:
                return []
            # A supersede also makes the new job's JobCreated: not this record's.
            return [e for e in events if e.job_id == j]

        return run

    return [
        cmd(lambda: HoldCommand(by=draw(humans), reason="look", for_s=3600.0)),
        cmd(lambda: Release(by=draw(humans), reason="go on")),
        cmd(lambda: Resubmit(by=draw(humans), reason="try again")),
        cmd(lambda: GiveUp(by=draw(humans), reason="enough")),
        cmd(lambda: Supersede(by=draw(humans), reason="again", new_job_id="job-2")),
        cmd(lambda: Cancel(by=draw(humans), reason="stop it")),
        cmd(lambda: EmergencyStop(by=draw(humans), reason="kill")),
    ]


def _stop_for_outcome(w: _Writer, obj: ObjectRecord) -> Move:
    return lambda: [StopRequested(job_id=obj_job(w), at=w.now, ref=obj.ref, why=StopWhy.OUTCOME)]


def _stopped(w: _Writer, obj: ObjectRecord) -> Move:
    return lambda: [
        ExecutionEnded(
            job_id=obj_job(w),
            at=w.now,
            ref=obj.ref,
            restart=0,
            cause=_STOPPED,
            submission=obj.submission,
        )
    ]


def obj_job(w: _Writer) -> str:
    """The job id of the record being written."""
    assert w.job is not None
    return w.job.job_id


def _moves(w: _Writer, job: Job) -> list[Move]:
    """Every move the supervisor could make now, each producing events."""
    draw, j = w.draw, job.job_id
    moves: list[Move] = []
    sub = job.submission
    hold = job.hold

    undelivered = [e for e in job.escalations if e.delivered is None]
    if undelivered:
        esc = draw(st.sampled_from(undelivered))
        moves.append(lambda: [EscalationDelivered(job_id=j, at=w.now, id=esc.id, channel="page")])

    if hold is not None and w.now >= hold.deadline:
        esc_id = f"overdue:{hold.instance}"
        if job.escalation(esc_id) is None:
            moves.append(
                lambda: [EscalationCommitted(job_id=j, at=w.now, id=esc_id, detail="hold overdue")]
            )

    live = [o for o in job.objects if not o.ended]
    if job.outcome is not None:
        for record in live:
            if record.stop_requested_at is None:
                moves.append(_stop_for_outcome(w, record))
            moves.append(_stopped(w, record))
        if job.escalation("cleanup-deadline") is None and live:
            moves.append(
                lambda: [
                    EscalationCommitted(
                        job_id=j, at=w.now, id="cleanup-deadline", detail="still alive"
                    )
                ]
            )
        return moves

    if sub is None:
        if hold is None:
            moves.append(
                lambda: [
                    SubmissionOpened(job_id=j, at=w.now, submission=1, why=SubmissionWhy.INITIAL)
                ]
            )
        return moves

    # Recovery hold with a cessation signal (seed 004).
    if hold is not None and hold.substituted_for is not None and job.objects:
        ended_ref = job.objects[-1].ref

        def cessation() -> list[JobEvent]:
            ceased = draw(st.booleans())
            out: list[JobEvent] = [
                CessationObserved(job_id=j, at=w.now, ref=ended_ref, ceased=ceased)
            ]
            if not ceased:
                return out
            out.append(
                HoldReleased(
                    job_id=j, at=w.now, instance=hold.instance, by=SUPERVISOR, how=HoldHow.CEASED
                )
            )
            assert hold.rule is not None
            assert hold.cause is not None
            rule = job.plan.rules[hold.rule]
            if hold.substituted_for is Action.RESUBMIT and job.spent(rule.rule) < rule.budget:
                out += [
                    RecoveryCommitted(
                        job_id=j, at=w.now, rule=rule.rule, action=Action.RESUBMIT, cause=hold.cause
                    ),
                    SubmissionOpened(
                        job_id=j,
                        at=w.now,
                        submission=len(job.submissions) + 1,
                        why=SubmissionWhy.CEASED,
                        cause=hold.cause,
                    ),
                ]
            else:
                out += _fail(w, job, hold.cause, f"failed:{hold.cause.kind}", "budget spent")
            return out

        moves.append(cessation)

    # A duplicate: an object for an attempt that already has one, stopped once.
    launched = [a for a in sub.attempts if a.outcome is LaunchOutcome.LAUNCHED]
    if launched and draw(st.integers(0, 9)) == 0:
        att = launched[-1]
        moves.append(
            lambda: [
                StopRequested(
                    job_id=j,
                    at=w.now,
                    ref=w.new_ref(),
                    why=StopWhy.DUPLICATE,
                    submission=att.submission,
                    attempt=att.attempt,
                )
            ]
        )

    if hold is not None:
        return moves

    last = sub.attempts[-1] if sub.attempts else None
    max_attempts = job.spec.max_launch_attempts
    if last is None or (last.outcome is LaunchOutcome.REFUSED and last.attempt < max_attempts):
        a = 1 if last is None else last.attempt + 1
        moves.append(lambda: [LaunchIntended(job_id=j, at=w.now, submission=sub.number, attempt=a)])
    elif last.outcome is LaunchOutcome.REFUSED:
        cause = Cause(
            kind=CauseKind.LAUNCH_FAILED, provenance=Provenance.SCHEDULER, detail=last.detail
        )
        moves.append(lambda: _fail(w, job, cause, f"refused:{sub.number}", "every launch refused"))
    elif last.outcome is LaunchOutcome.UNKNOWN:
        n, a = last.submission, last.attempt
        # An object is made far more often than not: recorded is offered three times.
        found = bool(last.detail)

        def recorded() -> list[JobEvent]:
            return [
                LaunchRecorded(
                    job_id=j, at=w.now, submission=n, attempt=a, ref=w.new_ref(), found=found
                )
            ]

        moves += [recorded, recorded, recorded]
        moves.append(
            lambda: [
                LaunchRefused(job_id=j, at=w.now, submission=n, attempt=a, detail="sbatch: error")
            ]
        )
        if not last.detail:
            moves.append(
                lambda: [
                    LaunchUnknown(job_id=j, at=w.now, submission=n, attempt=a, detail="timeout")
                ]
            )
        else:
            esc_id = f"all-unknown:{n}"
            if job.escalation(esc_id) is None:
                moves.append(
                    lambda: [EscalationCommitted(job_id=j, at=w.now, id=esc_id, detail="unknown")]
                )

            def abandon() -> list[JobEvent]:
                try:
                    events = list(
                        decide(
                            job,
                            Abandon(
                                by=draw(humans),
                                reason="no such job",
                                target=AbandonTarget(submission=n),
                            ),
                            w.now,
                        )
                    )
                except Refused:
                    return []
                if events:
                    events.append(
                        SubmissionOpened(
                            job_id=j, at=w.now, submission=n + 1, why=SubmissionWhy.ABANDONED
                        )
                    )
                return events

            moves.append(abandon)
    elif last.outcome is LaunchOutcome.LAUNCHED and last.ref is not None:
        current = job.object(last.ref)
        assert current is not None
        obj = current
        restart = len(obj.ended)
        ref = obj.ref
        if obj.gate_opened_at is None:
            moves.append(lambda: [GateOpened(job_id=j, at=w.now, ref=ref)])
        else:
            if obj.node_loss_since is None or obj.node_loss_restart != restart:
                lost = Cause(
                    kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail="NODE_FAIL"
                )
                moves.append(
                    lambda: [
                        NodeLossObserved(
                            job_id=j, at=w.now, ref=ref, restart=restart, since=w.now, cause=lost
                        )
                    ]
                )
            else:
                lost = Cause(
                    kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail="NODE_FAIL"
                )

                def fence() -> list[JobEvent]:
                    ended = ExecutionEnded(
                        job_id=j,
                        at=w.now,
                        ref=ref,
                        restart=restart,
                        cause=lost,
                        fenced=True,
                        submission=obj.submission,
                    )
                    stop = StopRequested(job_id=j, at=w.now, ref=ref, why=StopWhy.FENCE)
                    after = fold(written([(w.seq + 1, stop), (w.seq + 2, ended)]), w.now, prior=job)
                    return [stop, ended, *_apply_rule(w, after, lost, lives_on=False)]

                moves.append(fence)

            def ends() -> list[JobEvent]:
                cause = _ending_cause(draw, w.now, job.plan)
                lives_on = draw(st.booleans())
                ended = ExecutionEnded(
                    job_id=j,
                    at=w.now,
                    ref=ref,
                    restart=restart,
                    cause=cause,
                    submission=obj.submission,
                )
                after = fold(written([(w.seq + 1, ended)]), w.now, prior=job)
                return [ended, *_apply_rule(w, after, cause, lives_on=lives_on)]

            moves.append(ends)
    return moves


@st.composite
def records(draw: st.DrawFn, max_steps: int = 40) -> Record:
    """A record a real dispatch could write: creation, then ``max_steps`` moves or fewer.

    Each move is chosen among those legal now (see :func:`_moves`); a move that ``decide``
    refuses adds nothing. The record may or may not reach an outcome.
    """
    submit = draw(submits())
    created = decide(None, submit, T0)[0]
    assert isinstance(created, JobCreated)
    w = _Writer(draw, created)
    for _ in range(draw(st.integers(min_value=min(5, max_steps), max_value=max_steps))):
        assert w.job is not None
        w.tick()
        moves = _moves(w, w.job)
        # Mostly the supervisor's moves; an operator's command one time in eight, the
        # terminal ones (cancel, emergency stop: the last two) rarer still.
        commands = _commands(w, w.job)
        if not moves or draw(st.integers(min_value=0, max_value=7)) == 0:
            moves = commands if draw(st.integers(0, 3)) == 0 else commands[:-2]
        events = draw(st.sampled_from(moves))()
        if events:
            w.append(*events)
    return w.record


def plan_of(submit: Submit) -> Plan:
    """The plan ``decide`` makes for ``submit``."""
    return make_plan(submit.spec, submit.policy, submit.declarations)

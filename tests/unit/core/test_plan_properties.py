"""Properties of the planner, over random walks of a simulated scheduler and operator
(hypothesis): ``next_steps`` is idempotent, a settled job gets nothing but delivery and
clean-up, no rule's budget is ever exceeded, a committed outcome never changes, recovering
never returns to pending, each escalation id is committed once, and a gate opens only when
nothing else of the job lives.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from dispatch_core.commands import (
    Abandon,
    Cancel,
    EmergencyStop,
    GiveUp,
    HoldCommand,
    Release,
    Resubmit,
)
from dispatch_core.errors import Refused
from dispatch_core.events import (
    AbandonTarget,
    EscalationCommitted,
    ExecutionEnded,
    OutcomeCommitted,
    StopWhy,
)
from dispatch_core.fold import fold
from dispatch_core.job import Job, LaunchOutcome, Status
from dispatch_core.plan import VANISHED_DETAIL, next_steps
from dispatch_core.project import settled
from dispatch_core.state import (
    Action,
    CauseKind,
    Declarations,
    Discovery,
    Enforcer,
    Execution,
    GateState,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    RecoveryRule,
    SharedCheckpoint,
    State,
    UnknownLaunchPolicy,
)
from dispatch_core.steps import Commit, Deliver, OpenGate, Pass, Stop
from dispatch_core.supervision import conclude, plan_pass
from tests.unit.core.helpers import ALICE, CLUSTER, Record, Sim, cause, decisions, facts
from tests.unit.core.strategies import records
from tests.util import written

ENDINGS = [
    CauseKind.NONE,
    CauseKind.PREEMPTED,
    CauseKind.NODE_LOST,
    CauseKind.OUT_OF_MEMORY,
    CauseKind.TIME_LIMIT,
    CauseKind.NON_ZERO_EXIT,
    CauseKind.NO_CAPACITY,
    CauseKind.CANCELLED,
    CauseKind.UNKNOWN,
]
COVERABLE = [k for k in ENDINGS if k not in (CauseKind.NONE, CauseKind.CANCELLED)]


@st.composite
def _rules(draw: st.DrawFn) -> tuple[RecoveryRule, ...]:
    """A legal policy's rules: disjoint causes, unknown only by hold or escalate; preemption
    always has a recovering rule, so walks recover often."""
    rules = [
        RecoveryRule(
            on=(CauseKind.PREEMPTED,),
            action=draw(st.sampled_from([Action.RESUBMIT, Action.RESUBMIT, Action.REQUEUE])),
            budget=draw(st.integers(1, 3)),
            enforcer=draw(
                st.sampled_from([Enforcer.BACKEND, Enforcer.BACKEND, Enforcer.SUPERVISOR])
            ),
        )
    ]
    others = [k for k in COVERABLE if k is not CauseKind.PREEMPTED]
    kinds = draw(st.permutations(others))
    for kind in kinds[: draw(st.integers(1, len(kinds)))]:
        actions = [Action.HOLD, Action.ESCALATE]
        if kind is not CauseKind.UNKNOWN:
            actions += [Action.RESUBMIT, Action.RESUBMIT, Action.REQUEUE, Action.RESTART]
        rules.append(
            RecoveryRule(
                on=(kind,),
                action=draw(st.sampled_from(actions)),
                budget=draw(st.integers(0, 3)),
                enforcer=draw(st.sampled_from(Enforcer)),
                hold_for_s=draw(st.sampled_from([60.0, 3600.0])),
                wait_s=(
                    draw(st.sampled_from([None, 60.0])) if kind is CauseKind.NO_CAPACITY else None
                ),
            )
        )
    return tuple(draw(st.permutations(rules)))


@dataclass(frozen=True)
class _Setup:
    rules: tuple[RecoveryRule, ...]
    spec: JobSpec
    declarations: Declarations


_setups = st.builds(
    _Setup,
    rules=_rules(),
    spec=st.builds(
        JobSpec,
        cluster=st.just(CLUSTER),
        extensions=st.sampled_from([(), (SharedCheckpoint(),)]),
        max_launch_attempts=st.integers(1, 3),
        on_unknown_launch=st.sampled_from(UnknownLaunchPolicy),
        unresolved_age_s=st.just(600.0),
        cleanup_deadline_s=st.just(1800.0),
    ),
    declarations=st.builds(
        Declarations,
        node_loss_window_s=st.sampled_from([60.0, 300.0]),
        native_actions=st.frozensets(st.sampled_from([Action.REQUEUE, Action.RESTART])),
        cessation_signal=st.booleans(),
        emergency_stop=st.booleans(),
        idempotent_start=st.booleans(),
    ),
)

_ENDS = [CauseKind.PREEMPTED] * 4 + COVERABLE + [CauseKind.NONE, CauseKind.CANCELLED]
_COMMANDS = [
    "cancel",
    "hold",
    "release",
    "release",
    "resubmit",
    "resubmit",
    "give-up",
    "abandon-submission",
    "abandon-attempt",
    "abandon-foreign",
    "emergency-stop",
]
_moves = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.sampled_from([1, 30, 61, 301, 601, 1801, 3601, 86401])),
        st.tuples(st.just("tick"), st.sampled_from([1, 61, 301])),
        st.tuples(st.just("end"), st.sampled_from(_ENDS)),
        st.tuples(st.just("end"), st.sampled_from(_ENDS)),
        st.tuples(st.just("requeue"), st.sampled_from([CauseKind.PREEMPTED, *COVERABLE])),
        st.tuples(st.just("node-lost"), st.just(None)),
        st.tuples(st.just("no-capacity"), st.just(None)),
        st.tuples(st.just("vanish"), st.just(None)),
        st.tuples(st.just("foreign"), st.booleans()),
        st.tuples(st.just("admin-hold"), st.just(None)),
        st.tuples(st.just("duplicate"), st.integers(1, 4)),
        st.tuples(st.just("answer"), st.sampled_from(["recorded", "refused", "unknown", "lost"])),
        st.tuples(st.just("answer"), st.just("recorded")),
        st.tuples(st.just("settle-stops"), st.just(None)),
        st.tuples(st.just("settle-stops"), st.just(None)),
        st.tuples(st.just("command"), st.sampled_from(_COMMANDS)),
    ),
    min_size=8,
    max_size=30,
)


def _apply_move(sim: Sim, move: tuple[str, Any]) -> None:
    name, arg = move
    live = [o for o in sim.objects.values() if o.alive and not o.foreign]
    # Act on the current submission's object when there is one (the interesting one).
    sub = sim.job.submission
    live.sort(key=lambda o: (sub is not None and o.submission == sub.number, o.ref.id))
    if name == "tick":
        sim.tick(arg)
    elif name == "end" and live:
        sim.end(live[-1].ref, cause(arg, f"scheduler says {arg}"))
    elif name == "requeue" and live:
        sim.requeue(live[-1].ref, cause(arg), phase=ObjectPhase.RUNNING)
    elif name == "node-lost" and live:
        sim.update(live[-1].ref, phase=ObjectPhase.RUNNING, cause=cause(CauseKind.NODE_LOST))
    elif name == "no-capacity" and live:
        # waiting, gate open, for capacity the scheduler says it lacks (core-semantics "No
        # capacity"): past the rule's wait_s the pass stops it
        sim.update(
            live[-1].ref,
            phase=ObjectPhase.PENDING,
            cause=cause(CauseKind.NO_CAPACITY, "ReqNodeNotAvail"),
        )
    elif name == "node-back" and live:
        # the lost node came back: running, no cause (ends a node-loss window)
        sim.update(live[-1].ref, phase=ObjectPhase.RUNNING, cause=None)
    elif name == "queued" and live:
        # pending for an ordinary reason (Slurm's Resources, Priority): breaks a wait
        sim.update(live[-1].ref, phase=ObjectPhase.PENDING, cause=None)
    elif name == "vanish" and live:
        sim.vanish(live[0].ref)
    elif name == "foreign":
        if arg:
            sim.foreign(f"f{sim.next_id}")
            sim.next_id += 1
        else:
            for obj in [o for o in sim.objects.values() if o.foreign and o.alive]:
                sim.end(obj.ref, cause(CauseKind.CANCELLED))
    elif name == "admin-hold" and live:
        sim.update(live[-1].ref, gate=GateState.ADMIN_HELD)
    elif name == "duplicate":
        sub = sim.job.submission
        sim.own(sub.number if sub else 1, arg, phase=ObjectPhase.RUNNING, gate=GateState.OPEN)
    elif name == "answer":
        sim.launch_answer = arg
    elif name == "settle-stops":
        sim.settle_stops()
    elif name == "command":
        _command(sim, arg)


def _command(sim: Sim, which: str) -> None:
    job = sim.job
    foreign = [o.ref for o in sim.objects.values() if o.foreign]
    unknown = [a for s in job.submissions for a in s.attempts if a.outcome is LaunchOutcome.UNKNOWN]
    command: Any
    match which:
        case "cancel":
            command = Cancel(by=ALICE, reason="r")
        case "hold":
            command = HoldCommand(by=ALICE, reason="r", for_s=600.0)
        case "release":
            command = Release(by=ALICE, reason="r")
        case "resubmit":
            command = Resubmit(by=ALICE, reason="r")
        case "give-up":
            command = GiveUp(by=ALICE, reason="r")
        case "emergency-stop":
            command = EmergencyStop(by=ALICE, reason="r")
        case "abandon-submission" if unknown:
            command = Abandon(
                by=ALICE, reason="r", target=AbandonTarget(submission=unknown[0].submission)
            )
        case "abandon-attempt" if unknown:
            target = AbandonTarget(submission=unknown[0].submission, attempt=unknown[0].attempt)
            command = Abandon(by=ALICE, reason="r", target=target)
        case "abandon-foreign" if foreign:
            command = Abandon(by=ALICE, reason="r", target=AbandonTarget(foreign=foreign[0]))
        case _:
            return
    with contextlib.suppress(Refused):  # the operator asked for something not allowed now
        sim.command(command)


Check = Callable[[Sim, Pass], None]
"""An invariant of one pass, planned (not yet carried out) from the sim's record and
discovery at its clock."""

_WALK = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_answers = st.lists(st.booleans(), min_size=32, max_size=32)


def _walk(setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool], check: Check) -> Sim:
    """Drive the sim through ``moves``; before carrying out each pass, ``check`` it."""
    sim = Sim(*setup.rules, spec=setup.spec, declarations=setup.declarations)
    for i, move in enumerate([("tick", 1), *moves]):
        _apply_move(sim, move)
        check(sim, sim.plan())
        sim.step(ceased=answers[i % len(answers)], delivered=bool(i % 2))
    return sim


def _carried_out(sim: Sim, p: Pass) -> Job:
    """The job once ``p`` is carried out: its decisions, gates opened, a cessation answer of
    "not yet" (a "ceased" answer is a new fact); launches still in flight."""
    record = Record(sim.record.events[0][1])  # type: ignore[arg-type]
    record.events = list(sim.record.events)
    record.append(decisions(p))
    record.append(facts(p, sim.now, ceased=False))
    return record.job(sim.now)


def _idempotent(sim: Sim, p: Pass) -> None:
    assert next_steps(sim.job, sim.discovery(), sim.declarations, sim.now) == p  # deterministic
    again = next_steps(_carried_out(sim, p), sim.discovery(), sim.declarations, sim.now)
    assert [s for s in again.steps if not isinstance(s, Deliver)] == []


def _settled_gets_only_delivery_and_cleanup(sim: Sim, p: Pass) -> None:
    if settled(sim.job, sim.discovery()):
        for step in p.steps:
            assert isinstance(step, Deliver) or (
                isinstance(step, Commit) and isinstance(step.event, ExecutionEnded)
            ), step


def _budgets_kept(sim: Sim, p: Pass) -> None:
    after = _carried_out(sim, p)
    for rule in after.plan.rules:
        assert after.spent(rule.rule) <= rule.budget


def _outcome_kept(sim: Sim, p: Pass) -> None:
    job = sim.job
    if job.outcome is not None:
        assert not any(
            isinstance(s, Commit) and isinstance(s.event, OutcomeCommitted) for s in p.steps
        )
        after = _carried_out(sim, p)
        assert (after.outcome, after.outcome_cause) == (job.outcome, job.outcome_cause)


def _escalations_once(sim: Sim, p: Pass) -> None:
    ids = [
        s.event.id
        for s in p.steps
        if isinstance(s, Commit) and isinstance(s.event, EscalationCommitted)
    ]
    assert len(ids) == len(set(ids))
    assert not any(sim.job.escalation(i) is not None for i in ids)


def _gate_opens_alone(sim: Sim, p: Pass) -> None:
    for step in p.steps:
        if isinstance(step, OpenGate):
            others = [
                o for o in sim.objects.values() if not o.foreign and o.alive and o.ref != step.ref
            ]
            assert others == [], (step, others)


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_next_steps_is_idempotent(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """docs/core-semantics.md: "once its Commit steps and action intents are committed,
    planning again with the same discovery and now gives no step except Deliver"; the same
    inputs always give the same pass (STYLE.md)."""
    _walk(setup, moves, answers, _idempotent)


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_settled_job_gets_nothing_but_delivery_and_cleanup(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 002: a settled job's "last look ... delivers" what is left; nothing of it can
    still act, so a pass gives only ``Deliver`` and the record catching up with ends."""
    _walk(setup, moves, answers, _settled_gets_only_delivery_and_cleanup)


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_no_rule_budget_is_ever_exceeded(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 000: a rule recovers while it has "budget left"; with "a spent budget" the job
    fails. Whatever the scheduler does, no rule spends more than its budget."""
    _walk(setup, moves, answers, _budgets_kept)


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_committed_outcome_never_changes_whatever_happens(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 000: "succeeded, failed and cancelled never change once committed"."""
    _walk(setup, moves, answers, _outcome_kept)


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_each_escalation_id_is_committed_once(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 002: "Each escalation is committed once, keyed by its ID"."""
    sim = _walk(setup, moves, answers, _escalations_once)
    ids = [e.id for e in sim.job.escalations]
    assert len(ids) == len(set(ids))


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_gate_opens_only_when_nothing_else_of_the_job_lives(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 000: "A replacement may be started, but its gate isn't opened until the
    scheduler shows the old object ended"."""
    _walk(setup, moves, answers, _gate_opens_alone)


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_recovering_never_returns_to_pending_whatever_happens(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 000: "recovering never goes back to pending"."""
    seen: list[State] = []

    def check(sim: Sim, p: Pass) -> None:
        status = sim.status()
        assert isinstance(status, Status)
        seen.append(status.state)
        if State.RECOVERING in seen:
            assert status.state is not State.PENDING, seen

    _walk(setup, moves, answers, check)


_NO_CAPACITY_RULE = RecoveryRule(
    on=(CauseKind.NO_CAPACITY,), action=Action.RESUBMIT, budget=2, wait_s=60.0
)
_capacity_setups = _setups.map(
    lambda s: dataclasses.replace(
        s,
        rules=(
            *(r for r in s.rules if CauseKind.NO_CAPACITY not in r.on),
            _NO_CAPACITY_RULE,
        ),
    )
)
_capacity_moves = st.lists(
    st.one_of(
        st.tuples(st.just("no-capacity"), st.just(None)),
        st.tuples(st.just("queued"), st.just(None)),
        st.tuples(st.just("tick"), st.sampled_from([1, 30, 59, 61, 601])),
        st.tuples(st.just("settle-stops"), st.just(None)),
        st.tuples(st.just("end"), st.sampled_from(_ENDS)),
        st.tuples(st.just("node-lost"), st.just(None)),
        st.tuples(st.just("vanish"), st.just(None)),
        st.tuples(st.just("admin-hold"), st.just(None)),
        st.tuples(st.just("command"), st.sampled_from(_COMMANDS)),
    ),
    min_size=8,
    max_size=30,
)


def _waits_for_capacity(obj: ObservedObject) -> bool:
    return (
        obj.phase is ObjectPhase.PENDING
        and obj.gate is GateState.OPEN
        and obj.cause is not None
        and obj.cause.kind is CauseKind.NO_CAPACITY
    )


@_WALK
@given(setup=_capacity_setups, moves=_capacity_moves, answers=_answers)
def test_a_no_capacity_stop_is_never_asked_before_wait_s_of_unbroken_no_capacity_sightings(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """docs/core-semantics.md, "No capacity": the pass stops an object for want of capacity
    only when it is pending, gate open, with cause no-capacity, and every pass for at least
    ``wait_s`` has seen it so (a pass that saw it queued on another reason, running or held
    breaks the run; one that didn't see it says nothing); the end it records for it is
    ``no-capacity``. The runs are counted here from the discoveries alone, not the record."""
    run_since: dict[ObjectRef, datetime] = {}  # first sighting of each unbroken run

    def check(sim: Sim, p: Pass) -> None:
        discovery = sim.discovery()
        for obj in discovery.objects:
            if not _waits_for_capacity(obj):
                run_since.pop(obj.ref, None)
            else:
                run_since.setdefault(obj.ref, discovery.seen_at)
        job = sim.job
        for step in p.steps:
            if isinstance(step, Stop) and step.intent.why is StopWhy.NO_CAPACITY:
                record = job.object(step.ref)
                if record is not None and record.stop_why == StopWhy.NO_CAPACITY:
                    continue  # asked again
                assert record is not None
                assert record.gate_opened_at is not None
                rule = job.plan.rule_for(CauseKind.NO_CAPACITY)
                assert rule is not None
                wait = rule.wait_s if rule.wait_s is not None else 600.0
                assert step.ref in run_since, "stopped without a no-capacity sighting"
                assert sim.now >= run_since[step.ref] + timedelta(seconds=wait)
                assert _waits_for_capacity(sim.objects[step.ref])
            if isinstance(step, Commit) and isinstance(step.event, ExecutionEnded):
                record = job.object(step.event.ref)
                if (
                    record is not None
                    and record.stop_why == StopWhy.NO_CAPACITY
                    and step.event.cause.kind is CauseKind.CANCELLED
                ):
                    raise AssertionError(f"a no-capacity stop's end recorded cancelled: {step}")

    _walk(setup, moves, answers, check)


_fence_moves = st.lists(
    st.one_of(
        st.tuples(st.just("node-lost"), st.just(None)),
        st.tuples(st.just("node-back"), st.just(None)),
        st.tuples(st.just("tick"), st.sampled_from([1, 10, 59, 61, 299, 301, 601])),
        st.tuples(st.just("requeue"), st.sampled_from([CauseKind.PREEMPTED, *COVERABLE])),
        st.tuples(st.just("end"), st.sampled_from(_ENDS)),
        st.tuples(st.just("settle-stops"), st.just(None)),
        st.tuples(st.just("vanish"), st.just(None)),
        st.tuples(st.just("command"), st.sampled_from(_COMMANDS)),
    ),
    min_size=8,
    max_size=40,
)


def _on_lost_node(obj: ObservedObject) -> bool:
    return (
        obj.phase in (ObjectPhase.RUNNING, ObjectPhase.STOPPING)
        and obj.cause is not None
        and obj.cause.kind is CauseKind.NODE_LOST
    )


@_WALK
@given(setup=_setups, moves=_fence_moves, answers=_answers)
def test_a_fence_never_comes_before_the_window_of_unbroken_node_lost_sightings(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Seed 000, "The node-loss fence": the window is "how long an object may report running
    with cause node-lost". An execution is fenced only when every pass for at least
    ``node_loss_window_s`` has seen it running with cause node-lost (a pass that saw it
    otherwise, e.g. its node back, or another execution of it, breaks the run; one that didn't
    see it says nothing). The runs are counted here from the discoveries alone (the causes
    carry no time, so a run starts at the Discovery's ``seen_at``), not from the record."""
    run_since: dict[ObjectRef, tuple[int, datetime]] = {}  # (restart, first sighting)

    def check(sim: Sim, p: Pass) -> None:
        discovery = sim.discovery()
        for obj in discovery.objects:
            run = run_since.get(obj.ref)
            if not _on_lost_node(obj):
                run_since.pop(obj.ref, None)
            elif run is None or run[0] != obj.restarts:
                run_since[obj.ref] = (obj.restarts, discovery.seen_at)
        window = timedelta(seconds=sim.declarations.node_loss_window_s)
        for step in p.steps:
            if isinstance(step, Commit) and isinstance(step.event, ExecutionEnded):
                if not step.event.fenced:
                    continue
                run = run_since.get(step.event.ref)
                assert run is not None, "fenced without a node-lost sighting"
                assert run[0] == step.event.restart
                assert sim.now >= run[1] + window, (sim.now, run)

    _walk(setup, moves, answers, check)


_PHASES = ["absent", "vanished", "running", "ended", "requeued", "node-lost", "pending"]


@st.composite
def _situations(draw: st.DrawFn) -> tuple[Job, Discovery, datetime]:
    """A record a real dispatch could write (strategies.records, written independently of
    the planner), and a scheduler view of it: each object absent, vanished (the scheduler
    has no record of it), running, ended, requeued, on a lost node or pending, perhaps a
    foreign object, at some time after the record."""
    record = draw(records(max_steps=25))
    last = max(ev.at for _, ev in record)
    now = last + timedelta(seconds=draw(st.sampled_from([0, 1, 61, 601, 1801, 90000])))
    job = fold(written(record), now)
    objects: list[ObservedObject] = []
    vanished: list[ObjectRef] = []
    for obj in job.objects:
        phase = draw(st.sampled_from(_PHASES))
        restarts = max(obj.ended, default=0) + draw(st.integers(0, 1))
        base = ObservedObject(
            ref=obj.ref,
            name=f"dj-{job.job_id}",
            submission=obj.submission or 1,
            attempt=obj.attempt or 1,
            phase=ObjectPhase.RUNNING,
            restarts=restarts,
            gate=draw(st.sampled_from(GateState)),
        )
        kind = draw(st.sampled_from(ENDINGS))
        match phase:
            case "absent":
                continue
            case "vanished":
                vanished.append(obj.ref)
                continue
            case "ended":
                base = replace(base, phase=ObjectPhase.ENDED, cause=cause(kind))
            case "requeued":
                earlier = Execution(restart=restarts, cause=cause(kind))
                base = replace(base, executions=(earlier,), restarts=restarts + 1)
            case "node-lost":
                base = replace(base, cause=cause(CauseKind.NODE_LOST, at=last))
            case "pending":
                base = replace(base, phase=ObjectPhase.PENDING)
            case _:
                pass
        objects.append(base)
    if draw(st.booleans()):
        objects.append(
            ObservedObject(
                ref=ObjectRef(cluster=CLUSTER, id="alien"),
                name=f"dj-{job.job_id}",
                submission=None,
                attempt=None,
                phase=ObjectPhase.RUNNING,
            )
        )
    discovery = Discovery(
        cluster=CLUSTER,
        job_id=job.job_id,
        seen_at=now,
        objects=tuple(objects),
        vanished=tuple(vanished),
    )
    return job, discovery, now


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(situation=_situations())
def test_next_steps_on_records_a_real_dispatch_could_write(
    situation: tuple[Job, Discovery, datetime],
) -> None:
    """On any record dispatch could write (strategies.records) and any view of its objects:
    the planner is total and idempotent, keeps every budget and a committed outcome, and
    gives a settled job nothing but delivery and clean-up."""
    job, discovery, now = situation
    declarations = job.declarations

    p = next_steps(job, discovery, declarations, now)

    events = decisions(p) + facts(p, now, ceased=False)
    after = fold(written(((job.seq + 1 + i, ev) for i, ev in enumerate(events))), now, prior=job)
    again = next_steps(after, discovery, declarations, now)
    assert [s for s in again.steps if not isinstance(s, Deliver)] == []
    for rule in after.plan.rules:
        assert after.spent(rule.rule) <= rule.budget
    if job.outcome is not None:
        assert (after.outcome, after.outcome_cause) == (job.outcome, job.outcome_cause)
    if settled(job, discovery):
        for step in p.steps:
            assert isinstance(step, Deliver) or (
                isinstance(step, Commit) and isinstance(step.event, ExecutionEnded)
            ), step


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(situation=_situations())
def test_gone_is_not_ended_no_end_is_recorded_for_an_object_merely_absent(
    situation: tuple[Job, Discovery, datetime],
) -> None:
    """Issue 15, "gone is not ended": on any record and view, every end a pass records is of
    an object the view shows, or lists as vanished (the scheduler has no record of it); an
    object merely absent from the view is never ended, and ``unknown`` from the scheduler's
    silence is said only of a vanished one."""
    job, discovery, now = situation
    p = next_steps(job, discovery, job.declarations, now)
    shown = {o.ref for o in discovery.objects}
    for step in p.steps:
        if isinstance(step, Commit) and isinstance(step.event, ExecutionEnded):
            ref = step.event.ref
            assert ref in shown or ref in discovery.vanished, step
            if step.event.cause.detail.startswith(VANISHED_DETAIL):
                assert ref in discovery.vanished, step


def _plan_pass_agrees(
    job: Job, discovery: Discovery, declarations: Declarations, now: datetime
) -> None:
    """The invariants of ``plan_pass`` (dispatch_core.supervision) on one situation."""
    for delivers in (True, False):
        plan = plan_pass(job, discovery, declarations, now, delivers=delivers)
        events = [d.event for d in plan.decisions]
        assert events == decisions(next_steps(job, discovery, declarations, now))
        # The job after the commits is the fold of the commits, as the shell appends them.
        folded = fold(
            written(((job.seq + 1 + i, ev) for i, ev in enumerate(events))), now, prior=job
        )
        assert plan.after == folded
        # The follow-up decision is what planning the committed job again says, and when
        # there is none, the next pass (same view, same time) has nothing to carry out.
        end = conclude(plan, plan.after, discovery, declarations, now, appended=len(events))
        if events:
            again = next_steps(plan.after, discovery, declarations, now)
            acts = [s for s in again.steps if delivers or not isinstance(s, Deliver)]
            expected = bool(acts) and not (
                settled(plan.after, discovery) and all(isinstance(s, Deliver) for s in again.steps)
            )
            assert end.follow_up == expected
            assert (end.settled, end.wake_at) == (again.settled, again.wake_at)
            assert end.covered_seq == (job.seq if end.follow_up else plan.after.seq)
            if not end.follow_up:
                assert (
                    plan_pass(plan.after, discovery, declarations, now, delivers=delivers).steps
                    == ()
                )
        else:
            assert (end.follow_up, end.covered_seq) == (False, job.seq)
            assert (end.settled, end.wake_at) == (plan.settled, plan.wake_at)
        # Seed 002: a job settled when the pass began gets no deliveries but alongside
        # other steps; a shell that does not deliver gets none.
        if not delivers or (
            settled(job, discovery)
            and all(
                isinstance(s, Deliver) for s in next_steps(job, discovery, declarations, now).steps
            )
        ):
            assert not any(isinstance(s, Deliver) for s in plan.steps)
        assert plan.last_look == (delivers and plan.settled and not settled(job, discovery))


@_WALK
@given(setup=_setups, moves=_moves, answers=_answers)
def test_plan_pass_after_is_the_fold_of_its_commits_and_predicts_the_follow_up(
    setup: _Setup, moves: list[tuple[str, Any]], answers: list[bool]
) -> None:
    """Issue 11 item 1: the job after a pass's commits equals the fold of the commits, and
    the pass's follow-up decision equals what planning the committed job again says."""

    def check(sim: Sim, p: Pass) -> None:
        _plan_pass_agrees(sim.job, sim.discovery(), sim.declarations, sim.now)

    _walk(setup, moves, answers, check)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(situation=_situations())
def test_plan_pass_on_records_a_real_dispatch_could_write(
    situation: tuple[Job, Discovery, datetime],
) -> None:
    """The same invariants of ``plan_pass`` on any record dispatch could write and any
    view of its objects."""
    job, discovery, now = situation
    _plan_pass_agrees(job, discovery, job.declarations, now)

"""The planner: an object ending is not the job ending (seed 000, "Recovery rules are written
against causes", "An object ending is not the job ending").

One test per rule of the seed, named after it; each docstring quotes the sentence.
"""

from __future__ import annotations

from dispatch_core.commands import Resubmit
from dispatch_core.constants import SUPERVISOR
from dispatch_core.events import (
    EscalationCommitted,
    ExecutionEnded,
    HoldPlaced,
    HoldReleased,
    OutcomeCommitted,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.job import Status
from dispatch_core.plan import VANISHED_DETAIL
from dispatch_core.state import (
    Action,
    CauseKind,
    Declarations,
    Enforcer,
    HoldKind,
    ObjectPhase,
    Provenance,
    State,
)
from dispatch_core.steps import Launch, Stop
from tests.unit.core.helpers import (
    ALICE,
    Sim,
    actions,
    cause,
    committed,
    escalation_ids,
    rule,
    start,
)

PREEMPTED = cause(CauseKind.PREEMPTED, "PREEMPTED")
EXIT_1 = cause(
    CauseKind.NON_ZERO_EXIT, "FAILED 1:0", provenance=Provenance.APPLICATION, exit_code=1
)
OOM = cause(CauseKind.OUT_OF_MEMORY, "OUT_OF_MEMORY")


def _status(sim: Sim) -> Status:
    status = sim.status()
    assert isinstance(status, Status)
    return status


def test_object_ending_with_budget_left_recovers_and_starts_next_submission() -> None:
    """Seed 000: "a rule with budget left: the job is recovering, and the supervisor starts
    the next submission"."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=2))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)

    p = sim.step()

    ended = committed(p, ExecutionEnded)
    assert [(e.ref, e.restart, e.cause) for e in ended] == [(obj.ref, 0, PREEMPTED)]
    (recovery,) = committed(p, RecoveryCommitted)
    assert isinstance(recovery, RecoveryCommitted)
    assert (recovery.rule, recovery.action, recovery.cause, recovery.native) == (
        0,
        Action.RESUBMIT,
        PREEMPTED,
        False,
    )
    (opened,) = committed(p, SubmissionOpened)
    assert isinstance(opened, SubmissionOpened)
    assert (opened.submission, opened.why, opened.cause) == (2, "recovery", PREEMPTED)
    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert (launch.submission, launch.attempt) == (2, 1)
    assert _status(sim).state is State.RECOVERING
    assert sim.job.spent(0) == 1


def test_replacement_starts_as_soon_as_the_scheduler_reports_the_old_object_ended() -> None:
    """Seed 004: "That's what lets dispatch start a replacement as soon as the scheduler
    reports the old object ended, without waiting for proof that its processes stopped."
    The replacement is launched in the very pass that sees the end."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    p = sim.step()
    assert len(actions(p, Launch)) == 1
    sim.tick(1)
    p = sim.step()  # the new object shows, its gate closed; nothing else of the job lives
    assert _status(sim).state is State.RUNNING


def test_recovering_never_returns_to_pending() -> None:
    """Seed 000: "recovering never goes back to pending. A job whose second submission is
    waiting to start is recovering, because it's been taken back to run again"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    sim.launch_answer = "lost"  # the second submission's launch hangs
    sim.step()
    seen = []
    for _ in range(5):
        sim.tick(120)
        sim.step()
        seen.append(_status(sim).state)
    assert set(seen) == {State.RECOVERING}
    assert State.PENDING not in [t.state for t in sim.job.history]


def test_hold_rule_places_recovery_hold_until_a_person_decides() -> None:
    """Seed 000: "a hold rule: the job is held under a recovery hold, until a person
    resubmits, cancels or gives up"."""
    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD, hold_for_s=3600.0))
    obj = start(sim)
    sim.end(obj.ref, OOM)

    p = sim.step()

    (placed,) = committed(p, HoldPlaced)
    assert isinstance(placed, HoldPlaced)
    assert placed.kind is HoldKind.RECOVERY
    assert placed.by == SUPERVISOR
    assert placed.cause == OOM
    assert placed.rule == 0
    assert placed.deadline == sim.now.replace() + (placed.deadline - placed.at)
    assert (placed.deadline - placed.at).total_seconds() == 3600.0
    assert not actions(p, Launch)
    assert committed(p, OutcomeCommitted) == []
    for _ in range(3):
        sim.tick(60)
        p = sim.step()
        assert not actions(p, Launch)
    assert _status(sim).state is State.HELD


def test_resubmit_of_recovery_hold_starts_next_submission_without_spending_budget() -> None:
    """Seed 002: "for a recovery hold ... Use Resubmit(ctx, job, by, reason) to run a new
    submission"."""
    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD))
    obj = start(sim)
    sim.end(obj.ref, OOM)
    sim.step()
    sim.tick(60)
    sim.command(Resubmit(by=ALICE, reason="fixed the batch size"))

    p = sim.step()

    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert launch.submission == 2
    assert sim.job.recoveries == ()


def test_no_rule_fails_with_failed_cause() -> None:
    """Seed 000: "no rule ...: the job is failed, with the cause that ended the execution,
    and an escalation"; seed 002: failed:<cause> "no rule covers the cause"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, OOM)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.FAILED, OOM)
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == "failed:out-of-memory"
    assert "no rule covers out-of-memory" in esc.detail
    assert "OUT_OF_MEMORY" in esc.detail
    assert not actions(p, Launch)


def test_spent_budget_fails_with_failed_cause() -> None:
    """Seed 000: "a spent budget ...: the job is failed, with the cause that ended the
    execution, and an escalation"; seed 002: "the rule's budget is spent"."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=1))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    sim.step()
    sim.tick(1)
    sim.step()
    sim.tick(1)
    second = sim.current()
    sim.end(second.ref, PREEMPTED)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.FAILED, PREEMPTED)
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == "failed:preempted"
    assert "budget" in esc.detail
    assert "spent" in esc.detail
    assert sim.job.spent(0) == 1


def test_escalate_rule_fails_with_escalation() -> None:
    """Seed 000: "an escalate rule ...: the job is failed, with the cause that ended the
    execution, and an escalation"."""
    sim = Sim(rule(CauseKind.NON_ZERO_EXIT, action=Action.ESCALATE))
    obj = start(sim)
    sim.end(obj.ref, EXIT_1)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.FAILED, EXIT_1)
    assert outcome.cause.exit_code == 1
    assert escalation_ids(p) == ["failed:non-zero-exit"]


def test_restart_rule_without_native_support_fails_with_escalation() -> None:
    """Seed 000: "restart and requeue are carried out only by a backend that enforces them
    natively; a rule with one of those actions assigned to the supervisor fails the job,
    with an escalation saying supervisor recovery for that action isn't implemented"."""
    sim = Sim(rule(CauseKind.PREEMPTED, action=Action.RESTART, enforcer=Enforcer.SUPERVISOR))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert outcome.state is State.FAILED
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == "failed:preempted"
    assert "supervisor recovery for restart isn't implemented" in esc.detail


def test_requeue_rule_the_backend_does_not_enforce_fails_with_escalation() -> None:
    """Seed 000: "a rule nobody enforces: the job is failed ... and an escalation"."""
    sim = Sim(
        rule(CauseKind.PREEMPTED, action=Action.REQUEUE, enforcer=Enforcer.BACKEND),
        declarations=Declarations(node_loss_window_s=300.0),  # no native actions
    )
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)

    p = sim.step()

    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert "doesn't enforce requeue natively" in esc.detail
    assert sim.job.outcome is State.FAILED


def test_preemption_does_not_spend_a_budget_meant_for_failures() -> None:
    """Seed 000: "Preemption doesn't spend a budget meant for real failures, because a rule
    for one doesn't cover the other."."""
    sim = Sim(
        rule(CauseKind.PREEMPTED, budget=5),
        rule(CauseKind.NON_ZERO_EXIT, budget=1),
    )
    obj = start(sim)
    for _ in range(3):
        sim.end(obj.ref, PREEMPTED)
        sim.step()
        sim.tick(1)
        sim.step()
        sim.tick(1)
        obj = sim.current()
    sim.end(obj.ref, EXIT_1)
    p = sim.step()

    assert sim.job.spent(0) == 3
    assert sim.job.spent(1) == 1
    assert committed(p, OutcomeCommitted) == []
    assert len(actions(p, Launch)) == 1


def test_scheduler_cancelled_is_final() -> None:
    """Seed 000: "cancelled from the scheduler is final: a cancel that reached the scheduler
    is never undone by recovery, even if the record missed it."."""
    sim = Sim(rule(CauseKind.PREEMPTED), rule(CauseKind.UNKNOWN, action=Action.HOLD))
    obj = start(sim)
    scancel = cause(CauseKind.CANCELLED, "CANCELLED by 1001")
    sim.end(obj.ref, scancel)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.CANCELLED, scancel)
    assert committed(p, RecoveryCommitted) == []
    assert committed(p, HoldPlaced) == []
    assert not actions(p, Launch)


def test_execution_ending_with_none_succeeds() -> None:
    """Seed 000: "none is success"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    done = cause(CauseKind.NONE, "COMPLETED 0:0", provenance=Provenance.APPLICATION, exit_code=0)
    sim.end(obj.ref, done)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.SUCCEEDED, done)
    assert escalation_ids(p) == []
    assert p.settled


def test_committed_outcome_never_changes() -> None:
    """Seed 000: "Only a committed outcome is terminal. succeeded, failed and cancelled
    never change once committed."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, OOM)
    sim.step()
    assert sim.job.outcome is State.FAILED
    # The scheduler later shows the object running again, then ending every way there is.
    for kind in (CauseKind.NONE, CauseKind.PREEMPTED, CauseKind.CANCELLED):
        sim.update(obj.ref, phase=ObjectPhase.RUNNING, restarts=sim.objects[obj.ref].restarts + 1)
        sim.tick(1)
        sim.step()
        sim.end(obj.ref, cause(kind))
        sim.tick(1)
        p = sim.step()
        assert committed(p, OutcomeCommitted) == []
        assert not actions(p, Launch)
        assert sim.job.outcome is State.FAILED
        assert sim.job.outcome_cause == OOM


def test_object_the_scheduler_no_longer_shows_ends_with_cause_unknown() -> None:
    """Seed 000: "unknown is a thing the scheduler said": an object the scheduler stopped
    showing ended, and nobody knows why; "unknown may only be covered by a hold or escalate
    rule", so with none the job fails with unknown."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.vanish(obj.ref)
    sim.tick(5)

    p = sim.step()

    (ended,) = committed(p, ExecutionEnded)
    assert isinstance(ended, ExecutionEnded)
    assert ended.cause.kind is CauseKind.UNKNOWN
    assert ended.cause.provenance is Provenance.SCHEDULER
    assert ended.cause.detail == VANISHED_DETAIL
    assert escalation_ids(p) == ["failed:unknown"]


def test_unknown_ending_may_be_covered_by_a_hold_rule() -> None:
    """Seed 000: "unknown may only be covered by a hold or escalate rule, because
    resubmitting on a cause nobody understands is a guess"."""
    sim = Sim(rule(CauseKind.UNKNOWN, action=Action.HOLD))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.UNKNOWN, "BOOT_FAIL"))

    p = sim.step()

    (placed,) = committed(p, HoldPlaced)
    assert isinstance(placed, HoldPlaced)
    assert placed.cause is not None
    assert placed.cause.detail == "BOOT_FAIL"
    assert not actions(p, Launch)


def test_hold_rule_under_an_actor_hold_replaces_it_with_a_recovery_hold() -> None:
    """Seed 002: "for a recovery hold, which a hold rule placed after an execution ended,
    Release is refused": an execution that ends under a person's hold still gets its
    rule's recovery hold (which replaces the actor hold: the job stays held)."""
    from dispatch_core.commands import HoldCommand

    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD))
    obj = start(sim)
    sim.command(HoldCommand(by=ALICE, reason="maintenance"))
    sim.end(obj.ref, OOM)

    p = sim.step()

    (released,) = committed(p, HoldReleased)
    assert isinstance(released, HoldReleased)
    assert (released.instance, released.how) == (1, "replaced")
    (placed,) = committed(p, HoldPlaced)
    assert isinstance(placed, HoldPlaced)
    assert (placed.instance, placed.kind) == (2, HoldKind.RECOVERY)


def test_native_requeue_within_budget_is_accepted_as_recovery() -> None:
    """Seed 000: "restart and requeue are carried out only by a backend that enforces them
    natively": the backend ran the object again; the record spends the rule's budget and
    no new submission is opened; seed 004: "a requeue raises R"."""
    sim = Sim(
        rule(CauseKind.PREEMPTED, action=Action.REQUEUE, enforcer=Enforcer.BACKEND, budget=2),
        declarations=Declarations(
            node_loss_window_s=300.0, native_actions=frozenset({Action.REQUEUE})
        ),
    )
    obj = start(sim)
    before = _status(sim).epoch
    sim.requeue(obj.ref, PREEMPTED, phase=ObjectPhase.RUNNING)

    p = sim.step()

    (recovery,) = committed(p, RecoveryCommitted)
    assert isinstance(recovery, RecoveryCommitted)
    assert (recovery.action, recovery.native) == (Action.REQUEUE, True)
    assert committed(p, SubmissionOpened) == []
    assert not actions(p, Launch)
    assert not actions(p, Stop)
    after = _status(sim).epoch
    assert before is not None
    assert after == before + 1


def test_native_requeue_past_budget_stops_object_and_fails() -> None:
    """Seed 000: "a spent budget ...: the job is failed": a backend that requeues past the
    rule's budget has its object stopped."""
    sim = Sim(
        rule(CauseKind.PREEMPTED, action=Action.REQUEUE, enforcer=Enforcer.BACKEND, budget=1),
        declarations=Declarations(
            node_loss_window_s=300.0, native_actions=frozenset({Action.REQUEUE})
        ),
    )
    obj = start(sim)
    sim.requeue(obj.ref, PREEMPTED, phase=ObjectPhase.RUNNING)
    sim.step()
    sim.tick(1)
    sim.requeue(obj.ref, PREEMPTED, phase=ObjectPhase.RUNNING)

    p = sim.step()

    (stop,) = actions(p, Stop)
    assert isinstance(stop, Stop)
    assert (stop.ref, stop.intent.why) == (obj.ref, "recovery")
    assert sim.job.outcome is State.FAILED
    assert escalation_ids(p) == ["failed:preempted"]
    assert sim.job.spent(0) == 1


def test_native_requeue_rule_whose_backend_did_not_requeue_fails() -> None:
    """Seed 000: requeue is "carried out only by a backend that enforces them natively": an
    object that ended for good under such a rule was not requeued, and the job fails."""
    sim = Sim(
        rule(CauseKind.PREEMPTED, action=Action.REQUEUE, enforcer=Enforcer.BACKEND),
        declarations=Declarations(
            node_loss_window_s=300.0, native_actions=frozenset({Action.REQUEUE})
        ),
    )
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)

    p = sim.step()

    assert sim.job.outcome is State.FAILED
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert "did not requeue" in esc.detail


def test_native_requeue_under_resubmit_rule_is_accepted_as_its_recovery() -> None:
    """Seed 000: "a rule with budget left: the job is recovering": when the scheduler already
    ran the object again (Slurm's own requeue), that is the resubmit rule's recovery; no
    second object is started."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=2))
    obj = start(sim)
    sim.requeue(obj.ref, PREEMPTED)

    p = sim.step()

    (recovery,) = committed(p, RecoveryCommitted)
    assert isinstance(recovery, RecoveryCommitted)
    assert (recovery.action, recovery.native) == (Action.RESUBMIT, True)
    assert not actions(p, Launch)
    assert not actions(p, Stop)


def test_native_requeue_under_hold_rule_is_stopped_and_held() -> None:
    """Seed 000: "a hold rule: the job is held under a recovery hold": a backend that ran the
    object again on its own has it stopped, and the job is held."""
    sim = Sim(rule(CauseKind.PREEMPTED, action=Action.HOLD))
    obj = start(sim)
    sim.requeue(obj.ref, PREEMPTED, phase=ObjectPhase.RUNNING)

    p = sim.step()

    (stop,) = actions(p, Stop)
    assert isinstance(stop, Stop)
    assert stop.intent.why == "recovery"
    assert len(committed(p, HoldPlaced)) == 1

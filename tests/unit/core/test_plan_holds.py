"""The planner: holds, their deadlines, shared checkpoints and the cessation signal
(seed 002, ``overdue:<instance>``; seed 004, "When a job can't isolate").

One test per rule of the seeds, named after it; each docstring quotes the sentence.
"""

from __future__ import annotations

from datetime import timedelta

from dispatch_core.commands import HoldCommand, Release
from dispatch_core.constants import CESSATION_INTERVAL_S, SHARED_HOLD_FOR_S, SUPERVISOR
from dispatch_core.events import (
    EscalationCommitted,
    HoldPlaced,
    HoldReleased,
    OutcomeCommitted,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.state import (
    Action,
    CauseKind,
    Declarations,
    JobSpec,
    SharedCheckpoint,
    State,
)
from dispatch_core.steps import AskCessation, Launch, OpenGate
from tests.unit.core.helpers import ALICE, CLUSTER, Sim, actions, cause, committed, rule, start

PREEMPTED = cause(CauseKind.PREEMPTED, "PREEMPTED")
SHARED = JobSpec(cluster=CLUSTER, extensions=(SharedCheckpoint(),))


def _shared(*, signal: bool, budget: int = 2) -> Sim:
    return Sim(
        rule(CauseKind.PREEMPTED, budget=budget),
        spec=SHARED,
        declarations=Declarations(node_loss_window_s=300.0, cessation_signal=signal),
    )


def test_overdue_hold_escalates_and_stays() -> None:
    """Seed 002: "overdue:<instance>, a hold past its deadline. The hold stays in force;
    dispatch never releases or fails a job on its own."."""
    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD, hold_for_s=3600.0))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.OUT_OF_MEMORY))
    placed = sim.step()
    assert placed.wake_at == sim.now + timedelta(seconds=3600.0)

    sim.tick(3600)
    p = sim.step()

    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == "overdue:1"
    assert committed(p, HoldReleased) == []
    assert committed(p, OutcomeCommitted) == []
    assert not actions(p, Launch)
    for _ in range(3):
        sim.tick(3600)
        p = sim.step()
        assert committed(p) == []
    hold = sim.job.hold
    assert hold is not None
    assert hold.instance == 1
    assert sim.job.outcome is None


def test_overdue_actor_hold_escalates_and_stays() -> None:
    """Seed 002: "overdue:<instance> ... The hold stays in force" (a hold an actor placed)."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    start(sim)
    sim.command(HoldCommand(by=ALICE, reason="maintenance", for_s=600.0))
    sim.tick(600)

    p = sim.step()

    assert [e.id for e in committed(p, EscalationCommitted)] == ["overdue:1"]
    assert sim.job.hold is not None


def test_released_actor_hold_lets_the_job_run_again() -> None:
    """Seed 002: "for a hold an actor placed, Release(ctx, job, by) lets the job run again":
    while it stands nothing is launched and no gate opens."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.command(HoldCommand(by=ALICE, reason="wait for the dataset"))
    for _ in range(2):
        p = sim.step()
        assert not actions(p, Launch)
        sim.tick(60)
    sim.command(Release(by=ALICE, reason="dataset is there"))

    p = sim.step()
    assert len(actions(p, Launch)) == 1
    sim.tick(1)
    assert len(actions(sim.step(), OpenGate)) == 1


def test_shared_checkpoint_recovery_becomes_24h_hold() -> None:
    """Seed 004: "So every recovery rule becomes a hold for a person, for 24 hours
    (dispatch.SharedHoldFor)"."""
    sim = _shared(signal=False)
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)

    p = sim.step()

    (placed,) = committed(p, HoldPlaced)
    assert isinstance(placed, HoldPlaced)
    assert placed.substituted_for is Action.RESUBMIT
    assert placed.by == SUPERVISOR
    assert (placed.deadline - placed.at).total_seconds() == SHARED_HOLD_FOR_S
    assert committed(p, RecoveryCommitted) == []
    assert not actions(p, Launch)


def test_shared_checkpoint_hold_without_cessation_signal_waits_for_a_person() -> None:
    """Seed 004: "Without the interface, or while the answer is no, the job waits for a
    person."."""
    sim = _shared(signal=False)
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    sim.step()
    for _ in range(5):
        sim.tick(3600)
        p = sim.step()
        assert not actions(p, AskCessation)
        assert not actions(p, Launch)
    assert sim.job.hold is not None


def test_cessation_signal_asked_every_minute_while_hold_stands() -> None:
    """Seed 004: "While such a hold stands, the supervisor asks it about the ended object
    every dispatch.CessationInterval, a minute, and records each answer in the record as a
    cessation fact."."""
    sim = _shared(signal=True)
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)

    p = sim.step(ceased=False)
    (ask,) = actions(p, AskCessation)
    assert isinstance(ask, AskCessation)
    assert ask.ref == obj.ref
    record = sim.job.object(obj.ref)
    assert record is not None
    assert record.ceased is False

    sim.tick(CESSATION_INTERVAL_S - 1)
    p = sim.step(ceased=False)
    assert not actions(p, AskCessation)
    assert p.wake_at == sim.now + timedelta(seconds=1)
    sim.tick(1)
    p = sim.step(ceased=False)
    assert len(actions(p, AskCessation)) == 1
    assert not actions(p, Launch)


def test_shared_checkpoint_hold_lifted_by_ceased_cessation() -> None:
    """Seed 004: "A ceased answer lifts the hold, and the rule it stood in for applies
    again: a resubmit rule with budget left starts the next submission."."""
    sim = _shared(signal=True)
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    sim.step(ceased=False)
    sim.tick(CESSATION_INTERVAL_S)
    sim.step(ceased=True)

    p = sim.step()

    (released,) = committed(p, HoldReleased)
    assert isinstance(released, HoldReleased)
    assert (released.how, released.by) == ("ceased", SUPERVISOR)
    (recovery,) = committed(p, RecoveryCommitted)
    assert isinstance(recovery, RecoveryCommitted)
    assert (recovery.action, recovery.cause) == (Action.RESUBMIT, PREEMPTED)
    (opened,) = committed(p, SubmissionOpened)
    assert isinstance(opened, SubmissionOpened)
    assert (opened.submission, opened.why) == (2, "ceased")
    assert len(actions(p, Launch)) == 1
    assert sim.job.spent(0) == 1


def test_ceased_answer_with_budget_spent_fails_the_job() -> None:
    """Seed 004: "the rule it stood in for applies again"; seed 000: with "a spent budget
    ... the job is failed"."""
    sim = _shared(signal=True, budget=0)
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    sim.step(ceased=True)

    p = sim.step()

    assert sim.job.outcome is State.FAILED
    assert sim.job.escalation("failed:preempted") is not None
    assert not actions(p, Launch)

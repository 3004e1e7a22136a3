"""The planner: outcomes stop what still runs, clean-up deadline, emergency stop, delivery
(seed 002, "Receive and answer escalations", ``cleanup-deadline``).

One test per rule of the seed, named after it; each docstring quotes the sentence.
"""

from __future__ import annotations

from datetime import timedelta

from dispatch_core.commands import Cancel, EmergencyStop, GiveUp, HoldCommand
from dispatch_core.events import EscalationCommitted, OutcomeCommitted
from dispatch_core.plan import STOP_INTERVAL_S
from dispatch_core.state import Action, CauseKind, Declarations, ObjectPhase, State
from dispatch_core.steps import Commit, Deliver, Launch, Stop
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

CLEANUP_S = 1800.0


def _delivered(sim: Sim) -> set[str]:
    return {e.id for e in sim.job.escalations if e.delivered is not None}


def test_cancelled_job_stops_its_live_objects() -> None:
    """Seed 002, ``cleanup-deadline``: "a cancelled job still stopping": a cancel stops every
    live object of the job."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.command(Cancel(by=ALICE, reason="wrong dataset"))

    p = sim.step()

    (stop,) = actions(p, Stop)
    assert isinstance(stop, Stop)
    assert (stop.ref, stop.intent.why, stop.intent.emergency) == (obj.ref, "cancel", False)
    assert committed(p, OutcomeCommitted) == []
    sim.settle_stops()
    sim.tick(1)
    p = sim.step()
    assert p.settled
    assert committed(p, OutcomeCommitted) == []
    assert sim.job.outcome is State.CANCELLED


def test_cleanup_deadline_escalates_once() -> None:
    """Seed 002: "cleanup-deadline, a cancelled job still stopping. The job has an outcome,
    and its record still hasn't settled more than the job's clean-up deadline after the
    cancel ... The deadline is 30 minutes unless WithCleanupDeadline set it. The detail names
    the objects still alive. ... This escalation is committed once per job."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.command(Cancel(by=ALICE, reason="wrong dataset"))
    cancelled_at = sim.now
    p = sim.step()
    assert p.wake_at is not None

    sim.tick(CLEANUP_S - 1)
    p = sim.step()  # the object won't stop: asked again, not escalated yet
    assert [s.ref for s in actions(p, Stop)] == [obj.ref]
    assert escalation_ids(p) == []
    sim.tick(1)
    p = sim.step()

    # The object asked to stop at the cancel is overdue too (stop_overdue_s, also 30 min
    # by default): one escalation per object, beside the job's one.
    assert escalation_ids(p) == [f"stop-overdue:{obj.ref.id}", "cleanup-deadline"]
    (esc,) = [e for e in committed(p, EscalationCommitted) if e.id == "cleanup-deadline"]
    assert isinstance(esc, EscalationCommitted)
    assert str(obj.ref) in esc.detail
    assert sim.now == cancelled_at + timedelta(seconds=CLEANUP_S)
    for _ in range(3):
        sim.tick(CLEANUP_S)
        assert escalation_ids(sim.step()) == []


def test_cleanup_deadline_runs_from_outcome_when_nobody_cancelled() -> None:
    """Seed 002: "... after the cancel, or after the outcome if nobody cancelled"."""
    sim = Sim(
        rule(CauseKind.PREEMPTED, action=Action.REQUEUE, enforcer="backend", budget=0),
        declarations=Declarations(
            node_loss_window_s=300.0, native_actions=frozenset({Action.REQUEUE})
        ),
    )
    obj = start(sim)
    sim.requeue(obj.ref, cause(CauseKind.PREEMPTED), phase=ObjectPhase.RUNNING)
    sim.step()  # budget 0: stopped, failed; the object keeps running
    assert sim.job.outcome is State.FAILED
    failed_at = sim.now

    sim.tick(CLEANUP_S)
    p = sim.step()

    assert "cleanup-deadline" in escalation_ids(p)
    assert sim.job.outcome_at == failed_at


def test_emergency_stop_kills_every_live_object_once() -> None:
    """Seed 002: "For objects that won't stop, stop them on the scheduler or with
    cluster.Stopper().EmergencyStop(ctx, job, by, reason)."."""
    sim = Sim(
        rule(CauseKind.PREEMPTED),
        declarations=Declarations(node_loss_window_s=300.0, emergency_stop=True),
    )
    obj = start(sim)
    dup = sim.own(1, 9, phase=ObjectPhase.RUNNING)
    sim.step()  # the duplicate is asked to stop
    sim.command(EmergencyStop(by=ALICE, reason="runaway"))

    p = sim.step()

    stops = [s for s in actions(p, Stop)]
    assert {s.ref for s in stops} == {obj.ref, dup.ref}
    assert all(s.intent.emergency for s in stops)
    sim.tick(1)
    assert not actions(sim.step(), Stop)


def test_give_up_fails_the_job_and_nothing_more_is_launched() -> None:
    """Seed 002: "give-up: Someone called GiveUp. It records the decision; there's nothing
    to answer.": the job failed and the planner launches nothing more."""
    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.OUT_OF_MEMORY))
    sim.step()
    sim.command(GiveUp(by=ALICE, reason="model too big"))

    p = sim.step()

    assert sim.job.outcome is State.FAILED
    assert not actions(p, Launch)
    assert [s for s in p.steps if isinstance(s, Commit)] == []
    assert p.settled


def test_escalation_committed_in_pass_is_delivered_after_next_pass() -> None:
    """Seed 002: "An escalation the pass itself committed is delivered after the next
    pass"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    start(sim)
    sim.foreign("999")

    p = sim.step(delivered=True)
    assert escalation_ids(p) == ["foreign:999"]
    assert not actions(p, Deliver)
    assert _delivered(sim) == set()

    sim.tick(1)
    p = sim.step(delivered=True)
    (deliver,) = actions(p, Deliver)
    assert isinstance(deliver, Deliver)
    assert [e.id for e in deliver.escalations] == ["foreign:999"]
    assert p.steps[-1] is deliver
    assert _delivered(sim) == {"foreign:999"}
    sim.tick(1)
    assert not actions(sim.step(delivered=True), Deliver)


def test_deliver_offers_each_escalation_the_record_held_undelivered() -> None:
    """Seed 002: "After each pass's steps, the supervisor calls your Deliver function for
    each escalation the record held, undelivered, when the pass began"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.foreign("998")
    sim.step(delivered=True)
    sim.tick(1)
    sim.step(delivered=True)  # foreign:998 delivered
    sim.foreign("999")
    sim.command(HoldCommand(by=ALICE, reason="look", for_s=1.0))
    sim.tick(1)
    sim.step()  # foreign:999 and overdue:1 committed
    sim.tick(1)
    del obj

    p = sim.step()

    (deliver,) = actions(p, Deliver)
    assert isinstance(deliver, Deliver)
    assert sorted(e.id for e in deliver.escalations) == ["foreign:999", "overdue:1"]


def test_failed_delivery_is_offered_again_after_the_next_pass() -> None:
    """Seed 002: "Return an error and it's offered again after the next pass"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    start(sim)
    sim.foreign("999")
    sim.step()
    for _ in range(3):
        sim.tick(1)
        p = sim.step(delivered=False)
        assert [e.id for s in actions(p, Deliver) for e in s.escalations] == ["foreign:999"]


def test_last_look_at_a_settled_job_delivers_what_is_left() -> None:
    """Seed 002: "when that pass settled the job, the supervisor's last look, which finds the
    record settled, delivers it before Run returns"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.OUT_OF_MEMORY))
    p = sim.step()
    assert p.settled
    assert escalation_ids(p) == ["failed:out-of-memory"]

    last = sim.plan()

    assert last.settled
    (deliver,) = last.steps
    assert isinstance(deliver, Deliver)
    assert [e.id for e in deliver.escalations] == ["failed:out-of-memory"]


def test_stop_is_asked_again_every_interval_while_the_object_lives() -> None:
    """Seed 002, ``cleanup-deadline``: "For objects that won't stop": a stop is asked again
    every ``STOP_INTERVAL_S`` while the scheduler still shows the object alive, so a stop
    lost on the way does not leave the job unsettled."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.command(Cancel(by=ALICE, reason="stop"))
    first = sim.step()
    assert first.wake_at == sim.now + timedelta(seconds=STOP_INTERVAL_S)
    sim.tick(STOP_INTERVAL_S - 1)
    assert not actions(sim.step(), Stop)
    sim.tick(1)
    (again,) = actions(sim.step(), Stop)
    assert isinstance(again, Stop)
    assert again.ref == obj.ref


def test_cleanup_deadline_names_what_holds_the_record_open() -> None:
    """Seed 002, ``cleanup-deadline``: "Either something of the job is still alive on the
    scheduler, or something else holds the record open: a launch whose outcome is unknown,
    or a foreign object, each of which has its own escalation above."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "lost"
    sim.step()
    alien = sim.foreign("999")
    sim.command(Cancel(by=ALICE, reason="not needed"))
    sim.tick(CLEANUP_S)

    p = sim.step()

    assert set(escalation_ids(p)) == {"cleanup-deadline", "all-unknown:1", "foreign:999"}
    esc = sim.job.escalation("cleanup-deadline")
    assert esc is not None
    assert "1/1" in esc.detail
    assert str(alien.ref) in esc.detail

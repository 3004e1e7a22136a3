"""The planner: the node-loss fence (seed 000, "The node-loss fence").

One test per rule of the seed, named after it; each docstring quotes the sentence.
"""

from __future__ import annotations

from datetime import timedelta

from dispatch_core.events import (
    ExecutionEnded,
    NodeLossObserved,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.job import Status
from dispatch_core.state import CauseKind, Declarations, GateState, ObjectPhase, State
from dispatch_core.steps import Launch, OpenGate, Stop
from tests.unit.core.helpers import Sim, actions, cause, committed, rule, start

WINDOW_S = 300.0


def _sim() -> Sim:
    return Sim(
        rule(CauseKind.NODE_LOST, budget=2),
        declarations=Declarations(node_loss_window_s=WINDOW_S),
    )


def _status(sim: Sim) -> Status:
    status = sim.status()
    assert isinstance(status, Status)
    return status


def test_node_loss_inside_window_is_running_with_cause_node_lost() -> None:
    """Seed 000: "Inside the window the job is running with cause node-lost: the one case
    where a running job carries a cause."; the window is ``Declarations.NodeLossWindow``,
    "how long an object may report running with cause node-lost before dispatch treats the
    execution as ended"."""
    sim = _sim()
    obj = start(sim)
    lost = cause(CauseKind.NODE_LOST, "FailureTarget: node n2 NotReady", at=sim.now)
    sim.update(obj.ref, cause=lost)

    p = sim.step()

    (seen,) = committed(p, NodeLossObserved)
    assert isinstance(seen, NodeLossObserved)
    assert (seen.ref, seen.restart, seen.since) == (obj.ref, 0, lost.at)
    assert not actions(p, Stop)
    assert committed(p, ExecutionEnded) == []
    assert p.wake_at == sim.now + timedelta(seconds=WINDOW_S)
    status = _status(sim)
    assert status.state is State.RUNNING
    assert status.cause == lost
    # Still inside the window a little later: nothing more to do.
    sim.tick(WINDOW_S - 1)
    p = sim.step()
    assert p.steps == ()


def test_node_loss_window_runs_from_when_the_loss_was_first_seen() -> None:
    """Seed 000: "how long an object may report running with cause node-lost": without a
    time in the scheduler's cause, the window runs from the Discovery that first showed it."""
    sim = _sim()
    obj = start(sim)
    sim.update(obj.ref, cause=cause(CauseKind.NODE_LOST, "NotReady"))
    sim.seen_at = sim.now - timedelta(seconds=10)

    p = sim.step()

    (seen,) = committed(p, NodeLossObserved)
    assert isinstance(seen, NodeLossObserved)
    assert seen.since == sim.seen_at
    assert p.wake_at == sim.seen_at + timedelta(seconds=WINDOW_S)


def test_node_loss_past_window_stops_object_and_applies_rule() -> None:
    """Seed 000: "Past it, Next asks for the object to be stopped, then applies the plan for
    node-lost."."""
    sim = _sim()
    obj = start(sim)
    lost = cause(CauseKind.NODE_LOST, "FailureTarget", at=sim.now)
    sim.update(obj.ref, cause=lost, nodes=("n1", "n2"))
    sim.step()
    sim.tick(WINDOW_S)

    p = sim.step()

    (stop,) = actions(p, Stop)
    assert isinstance(stop, Stop)
    assert (stop.ref, stop.intent.why) == (obj.ref, "fence")
    (ended,) = committed(p, ExecutionEnded)
    assert isinstance(ended, ExecutionEnded)
    assert (ended.fenced, ended.cause) == (True, lost)
    (recovery,) = committed(p, RecoveryCommitted)
    assert isinstance(recovery, RecoveryCommitted)
    assert recovery.cause == lost
    (opened,) = committed(p, SubmissionOpened)
    assert isinstance(opened, SubmissionOpened)
    assert opened.submission == 2
    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert launch.submission == 2
    assert launch.exclude_nodes == ("n1", "n2")


def test_node_loss_past_window_with_no_rule_fails_the_job() -> None:
    """Seed 000: "then applies the plan for node-lost": with no rule for node-lost, the job
    fails with it."""
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=Declarations(node_loss_window_s=WINDOW_S))
    obj = start(sim)
    sim.update(obj.ref, cause=cause(CauseKind.NODE_LOST, "NotReady", at=sim.now))
    sim.step()
    sim.tick(WINDOW_S)

    sim.step()

    assert sim.job.outcome is State.FAILED
    assert sim.job.escalation("failed:node-lost") is not None


def test_replacement_gate_opens_only_after_old_object_ended() -> None:
    """Seed 000: "A replacement may be started, but its gate isn't opened until the
    scheduler shows the old object ended."."""
    sim = _sim()
    old = start(sim)
    sim.update(old.ref, cause=cause(CauseKind.NODE_LOST, "FailureTarget", at=sim.now))
    sim.step()
    sim.tick(WINDOW_S)
    sim.step()  # fence: stop the old one, launch the replacement (gate closed)
    new = sim.current()
    assert new.ref != old.ref
    assert new.gate is GateState.CLOSED
    sim.update(old.ref, phase=ObjectPhase.STOPPING)

    for _ in range(3):
        sim.tick(20)
        p = sim.step()
        assert not actions(p, OpenGate)
    assert sim.objects[new.ref].gate is GateState.CLOSED

    sim.end(old.ref, cause(CauseKind.NODE_LOST, "NODE_FAIL"))
    sim.tick(1)
    p = sim.step()

    (gate,) = actions(p, OpenGate)
    assert isinstance(gate, OpenGate)
    assert gate.ref == new.ref
    # The old object's late end was already recorded by the fence: nothing more to record.
    assert committed(p, ExecutionEnded) == []


def test_fenced_object_still_alive_is_asked_to_stop_again() -> None:
    """Seed 000: "Past it, Next asks for the object to be stopped": a stop lost on the way is
    asked again while the old object lives, so the replacement's gate can open."""
    sim = _sim()
    old = start(sim)
    sim.update(old.ref, cause=cause(CauseKind.NODE_LOST, "FailureTarget", at=sim.now))
    sim.step()
    sim.tick(WINDOW_S)
    first = sim.step()
    (stop,) = actions(first, Stop)
    assert first.wake_at is not None

    sim.tick(30)
    assert not actions(sim.step(), Stop)
    sim.tick(30)
    again = actions(sim.step(), Stop)

    (repeat,) = again
    assert isinstance(stop, Stop)
    assert isinstance(repeat, Stop)
    assert (repeat.ref, repeat.intent.why) == (old.ref, "fence")
    assert repeat.key != stop.key  # a new decision, not deduplicated as the first one

"""The planner: the node-loss fence (seed 000, "The node-loss fence").

One test per rule of the seed, named after it; each docstring quotes the sentence.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import pytest

from dispatch_core import decode_event
from dispatch_core.events import (
    ExecutionEnded,
    NodeLossObserved,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.fold import fold
from dispatch_core.job import Status
from dispatch_core.plan import next_steps
from dispatch_core.state import (
    CauseKind,
    Declarations,
    GateState,
    ObjectPhase,
    ObjectRef,
    State,
)
from dispatch_core.steps import Launch, OpenGate, Pass, Stop
from tests.unit.core.helpers import Sim, actions, cause, committed, rule, start
from tests.util import written

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


# -- the window counts unbroken node-lost sightings ----------------------------------------


def _fence_stops(p: Pass) -> list[Stop]:
    return [s for s in actions(p, Stop) if s.intent.why == "fence"]


def _lose(sim: Sim, obj_ref: ObjectRef, detail: str = "NotReady") -> None:
    """The scheduler shows the object running with cause node-lost, lost now."""
    sim.update(obj_ref, phase=ObjectPhase.RUNNING, cause=cause(CauseKind.NODE_LOST, detail))


def _back(sim: Sim, obj_ref: ObjectRef) -> None:
    """The node came back: the object shows running without a cause."""
    sim.update(obj_ref, phase=ObjectPhase.RUNNING, cause=None)


def test_a_node_back_ends_the_window_with_one_fact_not_one_per_poll() -> None:
    """Seed 000: the window is "how long an object may report running with cause
    node-lost": a sighting running without node-lost ends it, with one
    ``NodeLossObserved(since=None)``; further polls of the healthy object commit nothing."""
    sim = _sim()
    obj = start(sim)
    _lose(sim, obj.ref)
    (begun,) = committed(sim.step(), NodeLossObserved)
    assert isinstance(begun, NodeLossObserved)
    assert begun.since is not None
    sim.tick(10)
    _back(sim, obj.ref)

    p = sim.step()

    (ended,) = committed(p, NodeLossObserved)
    assert isinstance(ended, NodeLossObserved)
    assert (ended.ref, ended.restart, ended.since, ended.cause) == (obj.ref, 0, None, None)
    record = sim.job.object(obj.ref)
    assert record is not None
    assert record.node_loss_since is None
    assert p.wake_at is None or p.wake_at != begun.since + timedelta(seconds=WINDOW_S)
    status = _status(sim)
    assert status.state is State.RUNNING
    assert status.cause.kind is not CauseKind.NODE_LOST
    for _ in range(5):
        sim.tick(WINDOW_S)
        p = sim.step()
        assert committed(p, NodeLossObserved) == []
        assert _fence_stops(p) == []


def test_a_node_lost_again_after_coming_back_gets_a_new_window() -> None:
    """The bug of seed 000's fence: a node lost at 0, back at 10 and lost again at 500 was
    fenced at the window after 0, after only window - 500 s of loss. The second loss begins
    a new window: no fence before 500 + window, the fence at it."""
    window = 600.0
    sim = Sim(
        rule(CauseKind.NODE_LOST, budget=2),
        declarations=Declarations(node_loss_window_s=window),
    )
    obj = start(sim)
    t0 = sim.now
    _lose(sim, obj.ref)
    sim.step()
    sim.tick(10)
    _back(sim, obj.ref)
    sim.step()
    sim.tick(490)
    _lose(sim, obj.ref, "NotReady again")

    p = sim.step()

    (again,) = committed(p, NodeLossObserved)
    assert isinstance(again, NodeLossObserved)
    assert again.since == t0 + timedelta(seconds=500)
    assert p.wake_at == t0 + timedelta(seconds=500 + window)
    for _ in range(3):  # past 0 + window, still inside the second window: no fence
        sim.tick(50)
        p = sim.step()
        assert _fence_stops(p) == []
        assert committed(p, ExecutionEnded) == []
    sim.now = t0 + timedelta(seconds=500 + window - 1)
    assert _fence_stops(sim.step()) == []
    sim.tick(1)
    p = sim.step()
    (stop,) = _fence_stops(p)
    assert stop.ref == obj.ref
    (ended,) = committed(p, ExecutionEnded)
    assert isinstance(ended, ExecutionEnded)
    assert ended.fenced


def test_a_flapping_node_is_never_fenced_before_a_window_of_unbroken_loss() -> None:
    """A node that flaps (lost, back, lost, ...) for many windows is never fenced: no run of
    node-lost sightings lasts the window. Each flap costs two facts."""
    sim = _sim()
    obj = start(sim)
    facts: list[NodeLossObserved] = []
    for _ in range(10):
        _lose(sim, obj.ref)
        p = sim.step()
        assert _fence_stops(p) == []
        facts += committed(p, NodeLossObserved)
        sim.tick(WINDOW_S - 1)
        p = sim.step()
        assert _fence_stops(p) == []
        _back(sim, obj.ref)
        sim.tick(1)
        p = sim.step()
        assert _fence_stops(p) == []
        facts += committed(p, NodeLossObserved)
    assert sim.job.outcome is None
    assert [f.since is None for f in facts] == [False, True] * 10
    assert sim.job.recoveries == ()


def test_a_supervisor_restart_mid_window_keeps_the_since_from_the_record() -> None:
    """The window's start is a fact in the record: a supervisor that starts afresh (the
    record encoded, decoded and folded, nothing else) neither restarts nor forgets it, and
    an ended window read back stays ended."""
    sim = _sim()
    obj = start(sim)
    _lose(sim, obj.ref)
    sim.step()
    sim.tick(10)
    _back(sim, obj.ref)
    sim.step()
    sim.tick(100)
    _lose(sim, obj.ref)
    (begun,) = committed(sim.step(), NodeLossObserved)
    assert isinstance(begun, NodeLossObserved)
    assert begun.since is not None
    sim.tick(WINDOW_S / 2)
    sim.step()
    reread = [(seq, decode_event(msgspec.json.encode(ev))) for seq, ev in sim.record.events]
    due = begun.since + timedelta(seconds=WINDOW_S)

    def fresh(now: datetime) -> Pass:
        job = fold(written(reread), now)
        return next_steps(job, sim.discovery(), sim.declarations, now)

    early = fresh(due - timedelta(seconds=1))
    assert committed(early, NodeLossObserved) == []  # the window isn't begun again
    assert _fence_stops(early) == []
    assert early.wake_at == due
    (stop,) = _fence_stops(fresh(due))
    assert stop.ref == obj.ref


def test_an_old_node_loss_observed_decodes_with_its_since() -> None:
    """Records written before the ending fact existed always carry ``since`` and ``cause``:
    they decode unchanged."""
    raw = (
        b'{"type":"node-loss.observed","job_id":"j1","at":"2026-03-02T09:01:00Z",'
        b'"ref":{"cluster":"c1","id":"5"},"restart":0,"since":"2026-03-02T09:00:00Z",'
        b'"cause":{"kind":"node-lost","provenance":"scheduler","actor":null,'
        b'"detail":"NotReady","exit_code":null,"at":"2026-03-02T09:00:00Z"}}'
    )
    event = decode_event(raw)
    assert isinstance(event, NodeLossObserved)
    assert event.since is not None
    assert event.since.isoformat() == "2026-03-02T09:00:00+00:00"
    assert event.cause is not None
    assert event.cause.kind is CauseKind.NODE_LOST


@pytest.mark.parametrize("phase", [ObjectPhase.UNKNOWN, ObjectPhase.ENDED])
def test_an_unknown_or_ended_sighting_is_not_a_node_back(phase: ObjectPhase) -> None:
    """Only an object seen alive without node-lost ends the window: an unknown phase says
    nothing of the node, and an object Slurm ended (NODE_FAIL) ended on its lost node, so
    neither commits ``NodeLossObserved(since=None)`` (the events would read "node back")."""
    sim = _sim()
    obj = start(sim)
    _lose(sim, obj.ref)
    committed(sim.step(), NodeLossObserved)
    sim.tick(10)
    sim.update(obj.ref, phase=phase, cause=cause(CauseKind.NODE_LOST, "NODE_FAIL"))

    p = sim.step()

    assert [e for e in committed(p, NodeLossObserved) if e.since is None] == []

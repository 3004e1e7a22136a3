"""The planner's shape: pure, deterministic, idempotent, ordered, keyed, with the next
deadline (DESIGN.md sections 4-5; STYLE.md, "Pure core"; docs/core-semantics.md, "The
planner").
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import pytest

from dispatch_core.commands import Cancel
from dispatch_core.plan import next_steps
from dispatch_core.state import CauseKind, Declarations, Discovery, ObjectPhase
from dispatch_core.steps import AskCessation, Commit, Deliver, Launch, OpenGate, Stop
from tests.unit.core.helpers import (
    ALICE,
    CLUSTER,
    Record,
    Sim,
    actions,
    apply_pass,
    cause,
    rule,
    start,
)

_ORDER = {Commit: 0, Stop: 1, OpenGate: 2, Launch: 3, AskCessation: 4, Deliver: 5}


def _busy_sim() -> Sim:
    """A job in the middle of things: a recovery, a foreign object, a duplicate."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.foreign("999")
    sim.own(1, 5, phase=ObjectPhase.RUNNING)
    sim.step()
    sim.tick(1)
    sim.end(obj.ref, cause(CauseKind.PREEMPTED, "PREEMPTED"))
    return sim


def test_steps_are_commits_then_actions_then_deliver() -> None:
    """STYLE.md / the brief: "commits first, then actions, then Deliver"."""
    sim = _busy_sim()

    p = sim.plan()

    kinds = [_ORDER[type(s)] for s in p.steps]
    assert kinds == sorted(kinds)
    assert {type(s) for s in p.steps} >= {Commit, Launch, Deliver}


def test_same_inputs_give_same_steps_with_stable_keys() -> None:
    """STYLE.md: "The same inputs always give the same actions. Each action carries an
    idempotency key" (``<job>:<what>:<which>``, reused as Nats-Msg-Id)."""
    sim = _busy_sim()

    first, second = sim.plan(), sim.plan()

    assert first == second
    keys = [s.key for s in first.steps]
    assert len(keys) == len(set(keys))
    assert all(k.startswith("j1:") and k.count(":") >= 2 for k in keys)


def test_replanning_after_carrying_out_a_pass_gives_only_deliver() -> None:
    """docs/core-semantics.md: "once its Commit steps and action intents are committed,
    planning again with the same discovery and now gives no step except Deliver"."""
    sim = _busy_sim()
    discovery = sim.discovery()
    p = next_steps(sim.job, discovery, sim.declarations, sim.now)
    assert len(p.steps) > 3

    job = apply_pass(sim.record, p, sim.now)
    again = next_steps(job, discovery, sim.declarations, sim.now)

    assert [type(s) for s in again.steps] == [Deliver]
    assert again.wake_at == p.wake_at


def test_no_discovery_changes_no_object() -> None:
    """Seed 000: "A scheduler you can't reach is an ErrUnreachable error, never a state.":
    with no Discovery, the pass records no end, stops nothing and opens no gate; only what
    the record alone decides happens."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.vanish(obj.ref)
    sim.tick(3600)

    p = sim.plan(discovery=False)

    assert p.steps == ()
    assert not p.settled


def test_no_discovery_still_launches_a_new_job() -> None:
    """The first pass needs nothing from the scheduler: it opens and launches submission 1."""
    sim = Sim(rule(CauseKind.PREEMPTED))

    p = sim.plan(discovery=False)

    assert len(actions(p, Launch)) == 1


def test_discovery_of_another_job_is_refused() -> None:
    """A Discovery names its job; planning one job with another's is a caller's bug."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    other = Discovery(cluster=CLUSTER, job_id="other", seen_at=sim.now)

    with pytest.raises(ValueError, match="other"):
        next_steps(sim.job, other, sim.declarations, sim.now)


def test_wake_at_is_the_earliest_future_deadline() -> None:
    """DESIGN.md section 5: "each replica also wakes jobs at their next deadline
    (node-loss window, unresolved age, hold deadline, cleanup deadline, cessation
    interval)"."""
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=Declarations(node_loss_window_s=120.0))
    obj = start(sim)
    sim.update(obj.ref, cause=cause(CauseKind.NODE_LOST, "NotReady", at=sim.now))

    p = sim.step()
    assert p.wake_at == sim.now + timedelta(seconds=120.0)

    sim.command(Cancel(by=ALICE, reason="stop"))
    p = sim.step()  # now a stop re-ask (60 s) comes before the clean-up deadline (30 min)
    assert p.wake_at == sim.now + timedelta(seconds=60.0)


def test_settled_job_with_nothing_left_has_no_wake() -> None:
    """A settled job has no deadline left: only a change of the record or the Discovery can
    make a difference."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.NONE, "COMPLETED"))

    p = sim.step()

    assert p.settled
    assert p.wake_at is None


def test_plan_one_pass_of_a_thousand_event_record_is_fast() -> None:
    """The brief: "plan one pass of a job with a 1,000-event record <= 2 ms median" (a
    generous bound here; bench/core.py measures it)."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=1000))
    obj = start(sim)
    while len(sim.record.events) < 1000:
        sim.end(obj.ref, cause(CauseKind.PREEMPTED, "PREEMPTED"))
        sim.step(delivered=True)
        sim.tick(1)
        sim.step()
        sim.tick(1)
        sim.objects = {k: v for k, v in sim.objects.items() if v.alive}
        obj = sim.current()
    job, discovery = sim.job, sim.discovery()
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        next_steps(job, discovery, sim.declarations, sim.now)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.02


def test_record_helper_round_trips() -> None:
    """helpers.Record folds what it holds (sanity of the test harness)."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    record = Record(sim.record.events[0][1])  # type: ignore[arg-type]
    assert record.job().job_id == "j1"

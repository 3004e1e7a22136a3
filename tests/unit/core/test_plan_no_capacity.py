"""The planner: a no-capacity wait (docs/core-semantics.md, "No capacity"; issue 14, part 2:
a rule naming ``no-capacity`` fails over to the next cluster).

A backend shows a pending object whose scheduler says the capacity it asks for is missing
with cause ``no-capacity``. A rule covering ``no-capacity`` tolerates that wait for its
``wait_s`` of unbroken no-capacity sightings, counted from the first (a
``no-capacity.observed`` fact, like the node-loss fence's); then the pass stops the object
(why ``no-capacity``), and once the scheduler shows it cancelled, its end is recorded as
``no-capacity`` (the scheduler's words) and the rule applies: resubmit, on the next cluster
of its failover list. A sighting without that cause (queued on ``Resources``, running) ends
the wait, so a reason that flickers on a healthy cluster (reframe#1049) stops nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_core import (
    Cause,
    CauseKind,
    Declarations,
    InvalidPolicy,
    JobSpec,
    Publications,
    RecoveryPolicy,
    State,
    decode_event,
    make_plan,
    validate,
)
from dispatch_core.commands import Cancel
from dispatch_core.constants import NO_CAPACITY_WAIT_S
from dispatch_core.events import (
    ExecutionEnded,
    NoCapacityObserved,
    ProgressObserved,
    RecoveryCommitted,
    StopRequested,
    StopWhy,
    SubmissionOpened,
)
from dispatch_core.fold import fold
from dispatch_core.job import Status
from dispatch_core.plan import next_steps
from dispatch_core.state import GateState, ObjectPhase, ObservedObject, PlannedRule
from dispatch_core.steps import Launch, Pass, Stop
from tests.unit.core.helpers import (
    ALICE,
    CLUSTER,
    Sim,
    actions,
    cause,
    committed,
    rule,
    start,
)
from tests.util import written

OTHER = "c2"
WAIT_S = 120.0
WORDS = (
    "PENDING (Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
    "priority partitions)"
)
NO_CAPACITY = cause(CauseKind.NO_CAPACITY, WORDS)


def _sim(wait_s: float | None = WAIT_S, *, clusters: tuple[str, ...] = (CLUSTER, OTHER)) -> Sim:
    on = (CauseKind.NO_CAPACITY, CauseKind.NODE_LOST)
    covering = (
        rule(*on, budget=3, clusters=list(clusters))
        if wait_s is None
        else rule(*on, budget=3, clusters=list(clusters), wait_s=wait_s)
    )
    return Sim(covering, declarations=Declarations(node_loss_window_s=300.0))


def _waiting(sim: Sim) -> ObservedObject:
    """Submission 1 launched and its gate opened; the scheduler then shows it pending, gate
    open, for want of capacity, and a pass sees it so (the wait's first sighting)."""
    obj = start(sim)
    obj = sim.update(obj.ref, phase=ObjectPhase.PENDING, cause=NO_CAPACITY)
    sim.step()
    return obj


def _since(sim: Sim, obj: ObservedObject) -> datetime | None:
    record = sim.job.object(obj.ref)
    assert record is not None
    return record.no_capacity_since


def _first_seen(sim: Sim, obj: ObservedObject) -> datetime:
    since = _since(sim, obj)
    assert since is not None
    return since


def _queued(sim: Sim, obj: ObservedObject) -> None:
    """The scheduler shows it pending for an ordinary reason (Slurm's Resources, Priority)."""
    sim.update(obj.ref, phase=ObjectPhase.PENDING, cause=None)


def _no_capacity(sim: Sim, obj: ObservedObject) -> None:
    sim.update(obj.ref, phase=ObjectPhase.PENDING, cause=NO_CAPACITY)


def _no_capacity_stops(sim: Sim) -> list[Stop]:
    return _no_capacity_stops_of(sim.passes[-1])


def _no_capacity_stops_of(p: Pass) -> list[Stop]:
    return [s for s in actions(p, Stop) if s.intent.why is StopWhy.NO_CAPACITY]


def _status(sim: Sim) -> Status:
    status = sim.status()
    assert isinstance(status, Status)
    return status


# -- the wait ---------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    wait_s=st.integers(min_value=1, max_value=7200), early=st.integers(min_value=1, max_value=7200)
)
def test_the_wait_fires_exactly_at_wait_s_never_before(wait_s: int, early: int) -> None:
    sim = _sim(float(wait_s))
    obj = _waiting(sim)
    due = _first_seen(sim, obj) + timedelta(seconds=wait_s)
    sim.now = max(sim.now, due - timedelta(seconds=min(early, wait_s)))
    if sim.now < due:
        p = sim.step()
        assert _no_capacity_stops(sim) == []
        assert p.wake_at is not None
        assert p.wake_at <= due
        sim.now = due
    p = sim.step()
    (stop,) = _no_capacity_stops(sim)
    assert stop.ref == obj.ref
    assert stop.intent.cause is not None
    assert (stop.intent.cause.kind, stop.intent.cause.detail) == (CauseKind.NO_CAPACITY, WORDS)
    # Stopped, not yet ended: the rule applies once the scheduler confirms the end.
    assert committed(p, ExecutionEnded) == []
    assert committed(p, SubmissionOpened) == []


def test_the_first_sighting_is_recorded_once_with_the_discoverys_time() -> None:
    sim = _sim()
    obj = start(sim)
    _no_capacity(sim, obj)
    sim.seen_at = sim.now - timedelta(seconds=3)  # the Discovery was read a little earlier
    p = sim.step()
    (seen,) = committed(p, NoCapacityObserved)
    assert (seen.ref, seen.since, seen.cause) == (obj.ref, sim.seen_at, NO_CAPACITY)
    assert p.wake_at == sim.seen_at + timedelta(seconds=WAIT_S)
    first = sim.seen_at
    for _ in range(5):  # later polls that still show it: no fact each poll
        sim.tick(10)
        sim.seen_at = sim.now
        assert committed(sim.step(), NoCapacityObserved) == []
    assert _since(sim, obj) == first


def test_a_flicker_after_a_long_normal_queue_never_stops_the_job() -> None:
    """reframe#1049: a job queued on Resources far longer than wait_s shows ReqNodeNotAvail
    for one poll, then Resources again, then starts. The wait began at that poll: nothing
    is stopped, and the flicker leaves two facts, not one per poll."""
    sim = _sim()
    obj = start(sim)
    _queued(sim, obj)
    for _ in range(10):  # queued normally for 10 x wait_s
        sim.tick(WAIT_S)
        assert actions(sim.step(), Stop) == []
    assert _since(sim, obj) is None
    _no_capacity(sim, obj)
    sim.tick(30)
    p = sim.step()
    assert actions(p, Stop) == []
    (began,) = committed(p, NoCapacityObserved)
    assert began.since == sim.now
    assert p.wake_at == sim.now + timedelta(seconds=WAIT_S)
    _queued(sim, obj)
    sim.tick(30)
    p = sim.step()
    assert actions(p, Stop) == []
    (ended,) = committed(p, NoCapacityObserved)
    assert (ended.since, ended.cause) == (None, None)
    assert _since(sim, obj) is None
    sim.tick(WAIT_S * 10)
    assert actions(sim.step(), Stop) == []
    sim.update(obj.ref, phase=ObjectPhase.RUNNING)
    sim.tick(WAIT_S * 10)
    p = sim.step()
    assert actions(p, Stop) == []
    assert committed(p, NoCapacityObserved) == []
    assert _status(sim).state is State.RUNNING
    assert sum(isinstance(e, NoCapacityObserved) for _, e in sim.record.events) == 2


def test_a_wait_broken_by_a_resources_sighting_starts_again() -> None:
    sim = _sim()
    obj = _waiting(sim)
    sim.tick(WAIT_S - 1)
    _queued(sim, obj)
    sim.step()  # one poll on Resources, a second before the wait would have fired
    assert _since(sim, obj) is None
    sim.tick(1)
    _no_capacity(sim, obj)
    assert _no_capacity_stops_of(sim.step()) == []
    again = _first_seen(sim, obj)
    assert again == sim.now  # a new wait, from this sighting
    sim.now = again + timedelta(seconds=WAIT_S - 1)
    p = sim.step()
    assert _no_capacity_stops_of(p) == []
    assert p.wake_at == again + timedelta(seconds=WAIT_S)
    sim.now = again + timedelta(seconds=WAIT_S)
    (stop,) = _no_capacity_stops_of(sim.step())
    assert stop.ref == obj.ref


def test_a_running_sighting_ends_the_wait() -> None:
    sim = _sim()
    obj = _waiting(sim)
    sim.update(obj.ref, phase=ObjectPhase.RUNNING, cause=None)
    sim.tick(1)
    (ended,) = committed(sim.step(), NoCapacityObserved)
    assert ended.since is None


def test_a_supervisor_restart_mid_wait_keeps_the_since_from_the_record() -> None:
    """The wait's start is a fact in the record: a supervisor that starts afresh (the record
    encoded, decoded and folded, nothing else) neither restarts nor forgets the wait."""
    sim = _sim()
    obj = _waiting(sim)
    since = _first_seen(sim, obj)
    sim.tick(WAIT_S / 2)
    sim.step()
    reread = [(seq, decode_event(msgspec.json.encode(ev))) for seq, ev in sim.record.events]
    due = since + timedelta(seconds=WAIT_S)

    def fresh(now: datetime) -> Pass:
        job = fold(written(reread), now)
        return next_steps(job, sim.discovery(), sim.declarations, now)

    early = fresh(due - timedelta(seconds=1))
    assert committed(early, NoCapacityObserved) == []  # the wait isn't begun again
    assert _no_capacity_stops_of(early) == []
    assert early.wake_at == due
    (stop,) = _no_capacity_stops_of(fresh(due))
    assert stop.ref == obj.ref


def test_the_status_shows_the_wait_with_the_schedulers_words() -> None:
    sim = _sim()
    _waiting(sim)
    status = _status(sim)
    assert (status.state, status.cause) == (State.PENDING, NO_CAPACITY)


@settings(max_examples=25, deadline=None)
@given(after=st.floats(min_value=0, max_value=10 * WAIT_S))
def test_a_gate_closed_pending_object_never_counts(after: float) -> None:
    """An object whose gate is closed (dispatch's own, or shown closed again) waits for
    dispatch, not for capacity, whatever its cause says."""
    sim = _sim()
    obj = start(sim)
    sim.update(obj.ref, phase=ObjectPhase.PENDING, gate=GateState.CLOSED, cause=NO_CAPACITY)
    sim.tick(after)
    sim.step()
    assert _no_capacity_stops(sim) == []
    # Nor before dispatch ever opened it: the wait has no start.
    fresh = _sim()
    fresh.step()  # launched, gate closed
    (launched,) = fresh.objects.values()
    fresh.update(launched.ref, cause=NO_CAPACITY)
    fresh.tick(after)
    p = fresh.plan()
    assert [s for s in actions(p, Stop) if s.intent.why is StopWhy.NO_CAPACITY] == []


def test_an_object_that_starts_running_before_wait_s_cancels_nothing() -> None:
    sim = _sim()
    obj = _waiting(sim)
    sim.tick(WAIT_S / 2)
    sim.step()
    sim.update(obj.ref, phase=ObjectPhase.RUNNING, cause=None)
    sim.tick(WAIT_S * 10)
    p = sim.step()
    assert actions(p, Stop) == []
    assert _status(sim).state is State.RUNNING


def test_ordinary_queueing_is_never_stopped() -> None:
    sim = _sim()
    obj = start(sim)
    sim.update(obj.ref, phase=ObjectPhase.PENDING, cause=None)  # Resources, Priority
    sim.tick(WAIT_S * 100)
    assert actions(sim.step(), Stop) == []


def test_without_a_rule_covering_no_capacity_the_object_waits() -> None:
    sim = Sim(rule(CauseKind.NODE_LOST, budget=3))
    obj = start(sim)
    sim.update(obj.ref, phase=ObjectPhase.PENDING, cause=NO_CAPACITY)
    sim.tick(NO_CAPACITY_WAIT_S * 100)
    p = sim.step()
    assert actions(p, Stop) == []
    assert _status(sim).cause == NO_CAPACITY
    # Nothing is recorded of a wait no rule reads.
    assert not any(isinstance(e, NoCapacityObserved) for _, e in sim.record.events)


def test_the_default_wait_is_ten_minutes() -> None:
    sim = _sim(None)
    obj = _waiting(sim)
    due = _first_seen(sim, obj) + timedelta(seconds=NO_CAPACITY_WAIT_S)
    sim.now = due - timedelta(seconds=1)
    assert sim.step().wake_at == due
    sim.now = due
    sim.step()
    assert len(_no_capacity_stops(sim)) == 1


# -- the end and the rule ---------------------------------------------------------------------


def _stopped(sim: Sim) -> ObservedObject:
    obj = _waiting(sim)
    sim.tick(WAIT_S)
    sim.step()
    assert len(_no_capacity_stops(sim)) == 1
    return obj


def test_after_the_stop_the_next_submission_goes_to_the_next_cluster() -> None:
    sim = _sim()
    sim.publications = Publications(read_at=sim.now)  # a listing is read: still no progress fact
    obj = _stopped(sim)
    sim.tick(5)
    sim.settle_stops()  # the scheduler cancels it

    p = sim.step()

    (ended,) = committed(p, ExecutionEnded)
    assert (ended.ref, ended.fenced) == (obj.ref, False)
    assert (ended.cause.kind, ended.cause.detail) == (CauseKind.NO_CAPACITY, WORDS)
    (recovery,) = committed(p, RecoveryCommitted)
    assert recovery.cause.kind is CauseKind.NO_CAPACITY
    (opened,) = committed(p, SubmissionOpened)
    assert (opened.submission, opened.cluster) == (2, OTHER)
    (launch,) = actions(p, Launch)
    assert launch.spec.cluster == OTHER
    assert launch.exclude_nodes == ()  # nothing ran, so no node is suspect
    assert committed(p, ProgressObserved) == []  # a wait is not an execution
    job = sim.job
    assert job.spent(0) == 1  # the budget is spent as usual
    assert job.ended_cause is not None
    assert job.ended_cause.kind is CauseKind.NO_CAPACITY
    assert _status(sim).state is State.RECOVERING


def test_an_object_that_vanished_after_the_stop_ended_no_capacity() -> None:
    sim = _sim()
    obj = _stopped(sim)
    sim.tick(5)
    sim.vanish(obj.ref)
    p = sim.step()
    (ended,) = committed(p, ExecutionEnded)
    assert ended.cause.kind is CauseKind.NO_CAPACITY
    (opened,) = committed(p, SubmissionOpened)
    assert opened.cluster == OTHER


def test_an_object_that_ended_otherwise_before_the_stop_reached_it_keeps_its_cause() -> None:
    """Only a cancel is the stop's doing; an end the scheduler gives another cause is its."""
    sim = _sim()
    obj = _stopped(sim)
    sim.end(obj.ref, cause(CauseKind.NONE, "COMPLETED 0:0"))
    sim.step()
    assert sim.job.outcome is State.SUCCEEDED


def test_a_person_cancelling_during_the_stop_cancels_the_job() -> None:
    sim = _sim()
    obj = _stopped(sim)
    sim.command(Cancel(by=ALICE))
    sim.step()
    sim.settle_stops()
    sim.step()
    job = sim.job
    assert job.outcome is State.CANCELLED  # the cancel stands: no rule applies after it
    assert len(job.submissions) == 1
    record = job.object(obj.ref)
    assert record is not None
    assert record.ended == (0,)


def test_the_stop_is_asked_again_with_its_cause_kept() -> None:
    sim = _sim()
    obj = _stopped(sim)
    sim.tick(61)
    sim.step()
    again = _no_capacity_stops(sim)
    assert [s.ref for s in again] == [obj.ref]
    record = sim.job.object(obj.ref)
    assert record is not None
    assert record.stop_cause == replace_at(NO_CAPACITY, record.stop_cause)


def replace_at(expected: Cause, got: Cause | None) -> Cause:
    """``expected`` with ``got``'s ``at`` (the stop dates a cause that had no time)."""
    return msgspec.structs.replace(expected, at=None if got is None else got.at)


# -- the policy -------------------------------------------------------------------------------


@pytest.mark.parametrize("wait_s", [0.0, -1.0, float("inf"), float("nan")])
def test_validate_refuses_a_bad_wait(wait_s: float) -> None:
    with pytest.raises(InvalidPolicy):
        validate(RecoveryPolicy(rules=(rule(CauseKind.NO_CAPACITY, wait_s=wait_s),)))


def test_validate_refuses_a_wait_on_a_rule_not_covering_no_capacity() -> None:
    with pytest.raises(InvalidPolicy, match="only for a rule covering no-capacity"):
        validate(RecoveryPolicy(rules=(rule(CauseKind.NODE_LOST, wait_s=60),)))


def test_the_plan_shows_each_rules_wait() -> None:
    policy = RecoveryPolicy(
        rules=(
            rule(CauseKind.NO_CAPACITY, wait_s=45),
            rule(CauseKind.NODE_LOST),
        )
    )
    plan = make_plan(JobSpec(cluster=CLUSTER), policy, Declarations(node_loss_window_s=300.0))
    assert [r.wait_s for r in plan.rules] == [45.0, None]
    default = make_plan(
        JobSpec(cluster=CLUSTER),
        RecoveryPolicy(rules=(rule(CauseKind.NO_CAPACITY),)),
        Declarations(node_loss_window_s=300.0),
    )
    assert default.rules[0].wait_s == NO_CAPACITY_WAIT_S


# -- old records ------------------------------------------------------------------------------


def test_an_old_stop_requested_decodes_without_a_cause() -> None:
    raw = (
        b'{"type":"stop.requested","job_id":"j1","at":"2026-01-01T00:00:00Z",'
        b'"ref":{"cluster":"c1","id":"5"},"why":"fence","emergency":false,'
        b'"submission":null,"attempt":null}'
    )
    event = decode_event(raw)
    assert isinstance(event, StopRequested)
    assert event.cause is None


def test_an_old_planned_rule_without_wait_decodes_and_waits_the_default() -> None:
    raw = (
        b'{"rule":0,"on":["no-capacity"],"action":"resubmit","budget":3,'
        b'"enforcer":"supervisor","hold_for_s":86400.0}'
    )
    planned = msgspec.json.decode(raw, type=PlannedRule)
    assert planned.wait_s is None
    from dispatch_core.policy import planned_wait_s

    assert planned_wait_s(planned) == NO_CAPACITY_WAIT_S

"""The planner: gone is not ended, and stops that don't end (issue 15, items 1 and 5).

An object merely absent from a Discovery proves nothing (the observer may have been cut off,
the scheduler may keep its end elsewhere): only an object the Discovery lists as vanished
(the scheduler has no record of it) is ended ``unknown``; every other end is what the
backend shows. An object dispatch asked to stop and that the scheduler still doesn't show
ended after ``spec.stop_overdue_s`` is escalated ``stop-overdue:<object id>``, once, and the
replacement's gate stays closed.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_core.events import EscalationCommitted, ExecutionEnded, OutcomeCommitted
from dispatch_core.plan import STOP_INTERVAL_S, VANISHED_DETAIL
from dispatch_core.state import (
    CauseKind,
    Declarations,
    GateState,
    JobSpec,
    ObjectPhase,
    ObservedObject,
    Provenance,
    State,
)
from dispatch_core.steps import OpenGate, Stop
from tests.unit.core.helpers import (
    CLUSTER,
    Sim,
    actions,
    cause,
    committed,
    escalation_ids,
    rule,
    start,
)

WINDOW_S = 300.0
OVERDUE_S = 1800.0


def test_an_object_absent_while_the_observer_was_cut_off_is_not_ended() -> None:
    """Issue 15: "A job that succeeded while the scheduler was out of sight fails." The
    object stops being shown (the observer saw nothing of it for hours: a partition, then
    MinJobAge) and nothing is recorded; once the backend finds its end where the scheduler
    keeps ends (accounting, archive) and shows it ended, the job succeeds."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.forget(obj.ref)
    for _ in range(5):
        sim.tick(3600)
        p = sim.step()
        assert committed(p, ExecutionEnded) == []
        assert committed(p, OutcomeCommitted) == []
        assert not p.settled
    done = cause(CauseKind.NONE, "COMPLETED 0:0", provenance=Provenance.APPLICATION, exit_code=0)
    sim.show(obj)
    sim.end(obj.ref, done)

    p = sim.step()

    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.SUCCEEDED, done)
    assert p.settled


def test_a_vanished_object_ends_unknown_in_the_words_that_the_scheduler_has_no_record() -> None:
    """Issue 15: "Only when the scheduler itself has no word for it is the end unknown with
    the words saying so"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.vanish(obj.ref)

    p = sim.step()

    (ended,) = committed(p, ExecutionEnded)
    assert isinstance(ended, ExecutionEnded)
    assert (ended.ref, ended.restart) == (obj.ref, 0)
    assert (ended.cause.kind, ended.cause.provenance) == (CauseKind.UNKNOWN, Provenance.SCHEDULER)
    assert ended.cause.detail == VANISHED_DETAIL
    assert "no record" in ended.cause.detail
    assert escalation_ids(p) == ["failed:unknown"]


def test_a_vanished_object_of_another_cluster_or_one_already_ended_is_not_ended_again() -> None:
    """``vanished`` speaks for the Discovery's cluster only, and an end is recorded once."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.PREEMPTED, "PREEMPTED"))
    sim.step()  # recorded, recovered: submission 2
    sim.vanish(obj.ref)
    sim.tick(1)
    p = sim.step()
    assert [e.ref for e in committed(p, ExecutionEnded)] == []


def test_an_absent_stopped_object_is_not_ended_and_blocks_settling_until_it_vanishes() -> None:
    """Cancelled: the object dispatch asked to stop is no longer shown, but the scheduler
    hasn't said it ended: the job doesn't settle (``settled``) and the clean-up escalation
    names it; once the scheduler has no record of it, its end is recorded cancelled by
    dispatch and the job settles."""
    from dispatch_core.commands import Cancel
    from tests.unit.core.helpers import ALICE

    sim = Sim(rule(CauseKind.PREEMPTED), spec=JobSpec(cluster=CLUSTER, stop_overdue_s=7200.0))
    obj = start(sim)
    sim.command(Cancel(by=ALICE, reason="done"))
    sim.step()
    sim.forget(obj.ref)
    sim.tick(1800)
    p = sim.step()
    assert not p.settled
    assert escalation_ids(p) == ["cleanup-deadline"]
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert f"no longer shows, their end not known: {obj.ref}" in esc.detail

    sim.vanished.append(obj.ref)
    sim.tick(1)
    p = sim.step()
    (ended,) = committed(p, ExecutionEnded)
    assert isinstance(ended, ExecutionEnded)
    assert (ended.cause.kind, ended.cause.provenance) == (CauseKind.CANCELLED, Provenance.ACTOR)
    assert VANISHED_DETAIL in ended.cause.detail
    assert p.settled


def _fenced(sim: Sim) -> tuple[ObservedObject, ObservedObject]:
    """Run the fence: the object on a lost node is stopped past the window and a
    replacement launched; return (old, new) as the scheduler shows them."""
    obj = start(sim)
    sim.update(obj.ref, cause=cause(CauseKind.NODE_LOST, "NotReady", at=sim.now))
    sim.step()
    sim.tick(WINDOW_S)
    p = sim.step()
    assert [s.intent.why for s in actions(p, Stop)] == ["fence"]
    (new,) = [o for o in sim.objects.values() if o.submission == 2]
    return obj, new


def _fence_sim(overdue_s: float = OVERDUE_S) -> Sim:
    return Sim(
        rule(CauseKind.NODE_LOST, budget=2),
        spec=JobSpec(cluster=CLUSTER, stop_overdue_s=overdue_s),
        declarations=Declarations(node_loss_window_s=WINDOW_S),
    )


def test_a_fenced_object_that_never_ends_escalates_stop_overdue_once_gate_stays_closed() -> None:
    """Issue 15, item 5: "A fence that never completes waits silently ... An object that
    dispatch asked to stop and that is still not shown ended after a configurable deadline
    (default 30 min) raises one escalation per object ...; the fence still never opens the
    replacement's gate early"."""
    sim = _fence_sim()
    old, new = _fenced(sim)
    fenced_at = sim.now
    waking = sim.step()
    assert waking.wake_at is not None
    assert waking.wake_at <= fenced_at + timedelta(seconds=OVERDUE_S)
    seen: list[str] = []
    while sim.now < fenced_at + timedelta(seconds=OVERDUE_S + 4 * 3600):
        sim.tick(STOP_INTERVAL_S)
        p = sim.step()
        seen += escalation_ids(p)
        assert not actions(p, OpenGate), "the replacement's gate opened while the old object runs"
        if sim.now < fenced_at + timedelta(seconds=OVERDUE_S):
            assert seen == []
    assert seen == [f"stop-overdue:{old.ref.id}"]
    escalation = sim.job.escalation(seen[0])
    assert escalation is not None
    assert str(old.ref) in escalation.detail
    assert "emergency-stop" in escalation.detail
    assert sim.objects[new.ref].gate is GateState.CLOSED


def test_a_fenced_object_merely_absent_keeps_the_replacement_gate_closed_until_it_vanishes() -> (
    None
):
    """Gone is not ended: the fenced object no longer shown may still run on its lost node,
    so the replacement's gate waits for the scheduler's word (ended, or no record)."""
    sim = _fence_sim()
    old, new = _fenced(sim)
    sim.forget(old.ref)
    sim.tick(1)
    assert not actions(sim.step(), OpenGate)
    sim.vanished.append(old.ref)
    sim.tick(1)
    (opened,) = actions(sim.step(), OpenGate)
    assert opened.ref == new.ref


def test_a_stop_the_scheduler_carries_out_in_time_is_never_overdue() -> None:
    sim = _fence_sim()
    old, _new = _fenced(sim)
    sim.tick(60)
    sim.end(old.ref, cause(CauseKind.NODE_LOST, "NODE_FAIL"))
    for _ in range(4):
        sim.tick(OVERDUE_S)
        assert not [i for i in escalation_ids(sim.step()) if i.startswith("stop-overdue:")]


@settings(max_examples=60, deadline=None)
@given(
    overdue_s=st.sampled_from([60.0, 600.0, 1800.0, 7200.0]),
    ticks=st.lists(st.sampled_from([1.0, 30.0, 61.0, 600.0, 3601.0]), min_size=1, max_size=30),
)
def test_stop_overdue_is_raised_once_exactly_when_the_deadline_has_passed(
    overdue_s: float, ticks: list[float]
) -> None:
    """Property: whatever the passes' timing, ``stop-overdue:<id>`` is committed at most
    once, only at or after the first stop plus ``stop_overdue_s``, always by the first pass
    at or after it, and no pass opens the replacement's gate while the old object runs."""
    sim = _fence_sim(overdue_s)
    old, _new = _fenced(sim)
    first = sim.job.object(old.ref)
    assert first is not None
    assert first.first_stop_requested_at is not None
    due = first.first_stop_requested_at + timedelta(seconds=overdue_s)
    committed_at = []
    for dt in ticks:
        sim.tick(dt)
        p = sim.step()
        assert not actions(p, OpenGate)
        if escalation_ids(p):
            committed_at.append(sim.now)
    assert len(committed_at) <= 1
    if sim.now >= due:
        assert len(committed_at) == 1
        assert committed_at[0] >= due
        assert committed_at[0] - due < timedelta(seconds=max(ticks) + 1)
    else:
        assert committed_at == []


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("inf"), float("nan")])
def test_stop_overdue_s_must_be_a_positive_finite_duration(seconds: float) -> None:
    from dispatch_core.errors import InvalidSpec
    from dispatch_core.policy import validate_spec

    with pytest.raises(InvalidSpec) as err:
        validate_spec(JobSpec(cluster=CLUSTER, command=("true",), stop_overdue_s=seconds))
    assert err.value.field == "stop_overdue_s"


def test_phase_words_name_what_the_scheduler_shows() -> None:
    sim = _fence_sim(60.0)
    old, _ = _fenced(sim)
    sim.update(old.ref, phase=ObjectPhase.STOPPING)
    sim.tick(61)
    p = sim.step()
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert "still shows it stopping" in esc.detail


# -- refused at the door (issue 15, item 7) ---------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (JobSpec(cluster=CLUSTER, command=("python",), script="#!/bin/sh\ntrue\n"), "script"),
        (JobSpec(cluster=CLUSTER, command=("python", "a\0b")), "command"),
        (JobSpec(cluster=CLUSTER, script="#!/bin/sh\necho \0\n"), "script"),
        (JobSpec(cluster=CLUSTER, command=("true",), env={"A=B": "1"}), "env"),
        (JobSpec(cluster=CLUSTER, command=("true",), env={"": "1"}), "env"),
        (JobSpec(cluster=CLUSTER, command=("true",), env={"A\0": "1"}), "env"),
        (JobSpec(cluster=CLUSTER, command=("true",), env={"A": "x\0y"}), "env"),
        (JobSpec(cluster=CLUSTER, command=("true",), env={"DISPATCH_EPOCH": "7"}), "env"),
        (JobSpec(cluster=CLUSTER, command=("true",), env={"DISPATCH_FUTURE": "1"}), "env"),
        (
            JobSpec(cluster=CLUSTER, command=("true",), options={"chdir": "/tmp\0/x"}),
            "options.chdir",
        ),
        (JobSpec(cluster=CLUSTER, command=("true",), options={"ti\0me": "1"}), "options"),
    ],
)
def test_a_spec_no_runner_could_start_is_refused_naming_the_field(
    spec: JobSpec, field: str
) -> None:
    """Issue 15, item 7: "a NUL byte or ``=`` in the command, an environment key or
    options.chdir; a spec with both command and script. Each answers 400 naming the field"
    (the API and the CLI both go through ``decide``'s ``validate_spec``)."""
    from dispatch_core.commands import Submit
    from dispatch_core.decide import decide
    from dispatch_core.errors import InvalidSpec
    from dispatch_core.state import RecoveryPolicy
    from tests.unit.core.helpers import ALICE, T0

    with pytest.raises(InvalidSpec) as err:
        decide(
            None,
            Submit(
                job_id="j1",
                spec=spec,
                policy=RecoveryPolicy(),
                declarations=Declarations(node_loss_window_s=60.0),
                by=ALICE,
            ),
            T0,
        )
    assert err.value.field == field


def test_equals_signs_where_programs_and_paths_take_them_are_accepted() -> None:
    """``=`` is refused only in an environment key: ``--lr=0.1`` is an argument, ``a=b`` a
    value, ``/data/run=3`` a path a runner can ``chdir`` to."""
    from dispatch_core.policy import validate_spec

    validate_spec(
        JobSpec(
            cluster=CLUSTER,
            command=("python", "train.py", "--lr=0.1"),
            env={"OPTS": "a=b"},
            options={"chdir": "/data/run=3"},
        )
    )

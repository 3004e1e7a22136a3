"""The planner after a crash, and the record's loose ends: a decision a crash separated from
its ending is made again, never twice (DESIGN.md section 5: "Correctness never depends on
there being one supervisor"; seed 000, "An object ending is not the job ending").
"""

from __future__ import annotations

from dispatch_core.commands import HoldCommand
from dispatch_core.events import (
    ExecutionEnded,
    HoldReleased,
    OutcomeCommitted,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.state import CauseKind, JobSpec, Provenance, State, UnknownLaunchPolicy
from dispatch_core.steps import Commit, Launch
from tests.unit.core.helpers import (
    ALICE,
    CLUSTER,
    Sim,
    actions,
    cause,
    committed,
    decisions,
    escalation_ids,
    rule,
    start,
)

PREEMPTED = cause(CauseKind.PREEMPTED, "PREEMPTED")


def _crash_after(sim: Sim, kinds: tuple[type[object], ...]) -> None:
    """Plan a pass and append only its commits up to (and including) the first of ``kinds``:
    the supervisor crashed in the middle of appending."""
    p = sim.plan()
    kept = []
    for event in decisions(p):
        kept.append(event)
        if isinstance(event, kinds):
            break
    sim.record.append(kept)


def test_recovery_whose_submission_a_crash_lost_opens_it_without_spending_twice() -> None:
    """Seed 000: "a rule with budget left: the job is recovering, and the supervisor starts
    the next submission": a crash after the recovery was committed still starts it, and the
    budget is spent once."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=3))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    _crash_after(sim, (RecoveryCommitted,))
    assert len(sim.job.submissions) == 1

    p = sim.step()

    assert committed(p, RecoveryCommitted) == []
    (opened,) = committed(p, SubmissionOpened)
    assert isinstance(opened, SubmissionOpened)
    assert (opened.submission, opened.why) == (2, "recovery")
    assert len(actions(p, Launch)) == 1
    assert sim.job.spent(0) == 1


def test_ending_whose_decision_a_crash_lost_is_decided() -> None:
    """Seed 000: "When an object ends ... The plan decides.": an end recorded by a pass that
    crashed before its decision is decided by the next pass."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=3))
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    _crash_after(sim, (ExecutionEnded,))
    assert sim.job.recoveries == ()

    p = sim.step()

    assert committed(p, ExecutionEnded) == []
    assert len(committed(p, RecoveryCommitted)) == 1
    assert len(actions(p, Launch)) == 1
    sim.tick(1)
    p = sim.step()
    assert committed(p, RecoveryCommitted) == []
    assert sim.job.spent(0) == 1


def test_outcome_under_an_actor_hold_ends_the_hold() -> None:
    """Seed 000: "Only a committed outcome is terminal": an execution that ends under a
    person's hold still fails the job when no rule covers it, and the hold ends with the job
    (nothing is left to release, resubmit or give up)."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.command(HoldCommand(by=ALICE, reason="maintenance"))
    sim.end(obj.ref, cause(CauseKind.OUT_OF_MEMORY))

    p = sim.step()

    (released,) = committed(p, HoldReleased)
    assert isinstance(released, HoldReleased)
    assert released.how == "outcome"
    assert [type(s.event) for s in p.steps if isinstance(s, Commit)].index(HoldReleased) < [
        type(s.event) for s in p.steps if isinstance(s, Commit)
    ].index(OutcomeCommitted)
    assert sim.job.hold is None
    assert sim.job.outcome is State.FAILED


def test_resubmit_rule_under_an_actor_hold_waits_for_its_release_to_launch() -> None:
    """Seed 002: "for a hold an actor placed, Release(ctx, job, by) lets the job run again":
    the recovery is committed, its launch waits for the release."""
    from dispatch_core.commands import Release

    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.command(HoldCommand(by=ALICE, reason="maintenance"))
    sim.end(obj.ref, PREEMPTED)

    p = sim.step()
    assert len(committed(p, RecoveryCommitted)) == 1
    assert not actions(p, Launch)
    sim.command(Release(by=ALICE, reason="done"))
    p = sim.step()
    assert len(actions(p, Launch)) == 1


def test_object_gone_after_dispatch_asked_it_to_stop_ended_cancelled_by_dispatch() -> None:
    """Seed 000: the cause's provenance says "whether the scheduler said so, the application
    said so (an exit code), or an actor did it": an object dispatch asked to stop and the
    scheduler no longer shows was ended by dispatch."""
    from dispatch_core.commands import Cancel

    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.command(Cancel(by=ALICE, reason="wrong data"))
    sim.step()
    sim.vanish(obj.ref)
    sim.tick(5)

    p = sim.step()

    (ended,) = committed(p, ExecutionEnded)
    assert isinstance(ended, ExecutionEnded)
    assert ended.cause.kind is CauseKind.CANCELLED
    assert ended.cause.provenance is Provenance.ACTOR
    assert p.settled


def test_refused_then_unknown_launch_escalates_unmatched() -> None:
    """Seed 002: "all-unknown:<N> or unmatched:<N>/<a>": a submission whose earlier attempt
    was refused is not all-unknown; its unknown attempt is escalated unmatched, and
    abandoning it launches the next attempt."""
    from dispatch_core.commands import Abandon
    from dispatch_core.events import AbandonTarget

    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "refused"
    sim.step()
    sim.launch_answer = "unknown"
    sim.tick(1)
    sim.step()
    sim.tick(600)
    p = sim.step()
    assert escalation_ids(p) == ["unmatched:1/2"]
    sim.command(
        Abandon(by=ALICE, reason="not there", target=AbandonTarget(submission=1, attempt=2))
    )
    sim.launch_answer = "recorded"

    p = sim.step()

    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert (launch.submission, launch.attempt) == (1, 3)


def test_relaunch_launches_the_next_attempt_once_the_call_came_back_unknown() -> None:
    """Seed 002, "Choose an unmatched policy": with relaunch, a Start whose outcome is
    unknown is followed by the next attempt at once, not while the call is in flight."""
    spec = JobSpec(cluster=CLUSTER, on_unknown_launch=UnknownLaunchPolicy.RELAUNCH)
    sim = Sim(rule(CauseKind.PREEMPTED), spec=spec)
    sim.launch_answer = "lost"  # intent committed, no answer yet
    sim.step()
    assert not actions(sim.plan(), Launch)

    sim2 = Sim(rule(CauseKind.PREEMPTED), spec=spec)
    sim2.launch_answer = "unknown"
    sim2.step()
    (launch,) = actions(sim2.plan(), Launch)
    assert isinstance(launch, Launch)
    assert launch.attempt == 2

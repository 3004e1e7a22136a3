"""The planner: launches, unknown launches, refusals, duplicates, foreign and admin-held
objects, the epoch (seed 002, "Answer it by its id"; seed 004, "The epoch orders
executions").

One test per rule of the seeds, named after it; each docstring quotes the sentence.
"""

from __future__ import annotations

from datetime import timedelta

from dispatch_core.commands import Abandon, Cancel, Supersede
from dispatch_core.epoch import epoch
from dispatch_core.events import (
    AbandonTarget,
    EscalationCommitted,
    ExecutionEnded,
    JobCreated,
    LaunchRecorded,
    OutcomeCommitted,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.job import Status
from dispatch_core.plan import next_steps
from dispatch_core.state import (
    CauseKind,
    GateState,
    JobSpec,
    ObjectPhase,
    Provenance,
    State,
    UnknownLaunchPolicy,
)
from dispatch_core.steps import Launch, OpenGate, Stop
from tests.unit.core.helpers import (
    ALICE,
    CLUSTER,
    Record,
    Sim,
    actions,
    cause,
    committed,
    escalation_ids,
    rule,
    start,
)

AGE_S = 600.0


def _status(sim: Sim) -> Status:
    status = sim.status()
    assert isinstance(status, Status)
    return status


def test_first_pass_opens_submission_one_and_launches_it_with_its_gate_closed() -> None:
    """Seed 000: "dispatch knows about the training job, which may need several objects over
    its life": the first pass opens submission 1 and launches it; the object waits behind
    its start gate until a pass sees that nothing else of the job lives."""
    sim = Sim(rule(CauseKind.PREEMPTED))

    p = sim.step()

    (opened,) = committed(p, SubmissionOpened)
    assert isinstance(opened, SubmissionOpened)
    assert (opened.submission, opened.why) == (1, "initial")
    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert (launch.name, launch.submission, launch.attempt, launch.generation) == (
        "dj-j1",
        1,
        1,
        0,
    )
    assert (launch.intent.submission, launch.intent.attempt) == (1, 1)
    assert sim.current().gate is GateState.CLOSED
    sim.tick(1)
    p = sim.step()
    assert [s.ref for s in actions(p, OpenGate)] == [sim.current().ref]


def test_unknown_launch_after_unresolved_age_escalates_all_unknown() -> None:
    """Seed 002: "all-unknown:<N> ... A Start call's outcome stayed unknown for at least the
    job's unresolved age, 10 minutes unless WithUnresolvedAge set it, and no object turned up
    for it."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "unknown"
    first = sim.step()
    assert first.wake_at == sim.now + timedelta(seconds=AGE_S)

    sim.tick(AGE_S - 1)
    p = sim.step()
    assert escalation_ids(p) == []
    assert not actions(p, Launch)  # policy wait: nothing more is launched
    sim.tick(1)
    p = sim.step()

    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == "all-unknown:1"
    assert "dj-j1" in esc.detail
    assert not actions(p, Launch)
    sim.tick(AGE_S)
    assert escalation_ids(sim.step()) == []  # committed once


def test_unresolved_age_is_the_jobs_own() -> None:
    """Seed 002: "the job's unresolved age, 10 minutes unless WithUnresolvedAge set it"."""
    sim = Sim(rule(CauseKind.PREEMPTED), spec=JobSpec(cluster=CLUSTER, unresolved_age_s=60.0))
    sim.launch_answer = "lost"  # the supervisor crashed between intent and call
    sim.step()
    sim.tick(60)

    assert escalation_ids(sim.step()) == ["all-unknown:1"]


def test_unknown_launch_whose_object_turns_up_is_recorded_found() -> None:
    """Seed 002: "... and no object turned up for it": an object that does turn up for an
    unknown launch is that launch, and the job goes on with it."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "unknown"
    sim.step()
    sim.tick(30)
    obj = sim.own(1, 1)

    p = sim.step()

    (found,) = committed(p, LaunchRecorded)
    assert isinstance(found, LaunchRecorded)
    assert (found.ref, found.found) == (obj.ref, True)
    assert [s.ref for s in actions(p, OpenGate)] == [obj.ref]
    sim.tick(AGE_S)
    assert escalation_ids(sim.step()) == []


def test_abandoned_all_unknown_submission_launches_next() -> None:
    """Seed 002: "After an all-unknown submission is abandoned, the supervisor launches the
    next one."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "unknown"
    sim.step()
    sim.tick(AGE_S)
    sim.step()
    sim.command(
        Abandon(by=ALICE, reason="no such job in squeue", target=AbandonTarget(submission=1))
    )
    sim.launch_answer = "recorded"

    p = sim.step()

    (opened,) = committed(p, SubmissionOpened)
    assert isinstance(opened, SubmissionOpened)
    assert (opened.submission, opened.why) == (2, "abandoned")
    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert (launch.submission, launch.attempt) == (2, 1)
    assert sim.job.recoveries == ()  # no budget spent: no execution ended


def test_unmatched_attempt_escalates_unmatched() -> None:
    """Seed 002: "unmatched:<N>/<a>, a launch whose outcome nobody knows": under the
    relaunch policy the next attempt is launched at once; the unknown one whose object never
    turns up is escalated after the unresolved age."""
    spec = JobSpec(cluster=CLUSTER, on_unknown_launch=UnknownLaunchPolicy.RELAUNCH)
    sim = Sim(rule(CauseKind.PREEMPTED), spec=spec)
    sim.launch_answer = "unknown"
    sim.step()
    sim.launch_answer = "recorded"
    sim.tick(5)

    p = sim.step()
    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    assert launch.attempt == 2
    sim.tick(AGE_S)
    p = sim.step()

    assert escalation_ids(p) == ["unmatched:1/1"]
    sim.command(
        Abandon(by=ALICE, reason="not in squeue", target=AbandonTarget(submission=1, attempt=1))
    )
    assert escalation_ids(sim.step()) == []


def test_unmatched_object_turning_up_late_is_stopped_as_duplicate() -> None:
    """Seed 002, "Choose an unmatched policy": with relaunch, a launch whose object turns up
    after the next attempt's is a duplicate: recorded, stopped, never driving recovery
    (seed 000: the kind list has duplicate)."""
    spec = JobSpec(cluster=CLUSTER, on_unknown_launch=UnknownLaunchPolicy.RELAUNCH)
    sim = Sim(rule(CauseKind.PREEMPTED), spec=spec)
    sim.launch_answer = "unknown"
    sim.step()
    sim.launch_answer = "recorded"
    sim.tick(5)
    sim.step()
    sim.tick(5)
    sim.step()
    primary = sim.current()
    late = sim.own(1, 1, phase=ObjectPhase.RUNNING, gate=GateState.OPEN)
    sim.tick(5)

    p = sim.step()

    (found,) = committed(p, LaunchRecorded)
    assert isinstance(found, LaunchRecorded)
    assert found.ref == late.ref
    (stop,) = actions(p, Stop)
    assert isinstance(stop, Stop)
    assert (stop.ref, stop.intent.why) == (late.ref, "duplicate")
    sim.end(late.ref, cause(CauseKind.CANCELLED, "CANCELLED", provenance=Provenance.ACTOR))
    sim.tick(5)
    p = sim.step()
    assert [type(e) for e in committed(p)] == [ExecutionEnded]
    assert sim.job.outcome is None
    assert sim.current().ref == primary.ref


def test_duplicate_object_is_stopped_once_and_never_drives_recovery() -> None:
    """Seed 000: the cause kind list has "duplicate": an object for a launch the record never
    intended is stopped once; its end is recorded and drives nothing."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    start(sim)
    dup = sim.own(1, 7, phase=ObjectPhase.RUNNING, gate=GateState.OPEN)

    p = sim.step()
    (stop,) = actions(p, Stop)
    assert isinstance(stop, Stop)
    assert (stop.ref, stop.intent.why, stop.intent.submission, stop.intent.attempt) == (
        dup.ref,
        "duplicate",
        1,
        7,
    )
    sim.tick(10)
    assert not actions(sim.step(), Stop)  # asked once (again only after the stop interval)

    sim.end(dup.ref, cause(CauseKind.PREEMPTED, "PREEMPTED"))
    sim.tick(10)
    p = sim.step()
    assert [type(e) for e in committed(p)] == [ExecutionEnded]
    assert committed(p, RecoveryCommitted) == []
    assert _status(sim).state is State.RUNNING


def test_refused_every_attempt_fails_with_refused() -> None:
    """Seed 002: "failed:<cause> or refused:<N>, the job failed ... (for refused) the
    scheduler refused every attempt to launch"."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "refused"
    attempts = []
    p = sim.step()
    for _ in range(5):
        attempts += [s.attempt for s in actions(p, Launch)]
        if sim.job.outcome is not None:
            break
        sim.tick(1)
        p = sim.step()

    assert attempts == [1, 2, 3]
    (outcome,) = committed(p, OutcomeCommitted)
    assert isinstance(outcome, OutcomeCommitted)
    assert outcome.state is State.FAILED
    assert outcome.cause.kind is CauseKind.LAUNCH_FAILED
    assert outcome.cause.detail == "sbatch: error: Batch job submission failed"
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == "refused:1"
    assert "refused every attempt" in esc.detail


def test_foreign_object_blocks_settlement_and_is_never_stopped() -> None:
    """Seed 002: "foreign:<object id> ... It blocks the record from settling. dispatch never
    stops or adopts it."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    alien = sim.foreign("999")

    p = sim.step()
    assert escalation_ids(p) == ["foreign:999"]
    assert not actions(p, Stop)
    sim.command(Cancel(by=ALICE, reason="done"))
    sim.tick(1)
    p = sim.step()
    assert [s.ref for s in actions(p, Stop)] == [obj.ref]
    sim.settle_stops()
    sim.tick(1)
    p = sim.step()
    assert not p.settled
    assert not actions(p, Stop)
    assert escalation_ids(p) == []  # committed once

    sim.command(
        Abandon(
            by=ALICE,
            reason="site plugin rewrite, stopped by hand",
            target=AbandonTarget(foreign=alien.ref),
        )
    )
    assert sim.step().settled


def test_admin_held_gate_is_never_opened() -> None:
    """Seed 002: "admin-held:<object id>, a gate an administrator holds ... dispatch never
    opens it."."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.step()
    obj = sim.current()
    sim.update(
        obj.ref,
        gate=GateState.ADMIN_HELD,
        cause=cause(CauseKind.HELD, "JobHeldAdmin"),
    )
    sim.tick(1)

    p = sim.step()

    assert not actions(p, OpenGate)
    (esc,) = committed(p, EscalationCommitted)
    assert isinstance(esc, EscalationCommitted)
    assert esc.id == f"admin-held:{obj.ref.id}"
    assert "JobHeldAdmin" in esc.detail
    for _ in range(3):
        sim.tick(60)
        p = sim.step()
        assert not actions(p, OpenGate)
        assert escalation_ids(p) == []


def test_epoch_rises_with_resubmission_requeue_and_supersession() -> None:
    """Seed 004: "A resubmission raises N, a requeue raises R, and a supersession raises G,
    so each raises the epoch."; seed 002: a superseding job's "executions get a higher
    DISPATCH_EPOCH, so they outrank every checkpoint the old job published"."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=5))
    obj = start(sim)
    first = _status(sim).epoch
    sim.requeue(obj.ref, cause(CauseKind.PREEMPTED, "PREEMPTED"), phase=ObjectPhase.RUNNING)
    sim.step()
    requeued = _status(sim).epoch
    sim.end(obj.ref, cause(CauseKind.PREEMPTED, "PREEMPTED"))
    p = sim.step()
    (launch,) = actions(p, Launch)
    assert isinstance(launch, Launch)
    resubmitted = epoch(launch.generation, launch.submission, 0)
    sim.end(sim.current().ref, cause(CauseKind.OUT_OF_MEMORY))
    sim.tick(1)
    sim.step()
    assert sim.job.outcome is State.FAILED

    from dispatch_core.decide import decide

    created, _ = decide(sim.job, Supersede(by=ALICE, reason="fixed", new_job_id="j2"), sim.now)
    assert isinstance(created, JobCreated)
    new = Record(created)
    p = next_steps(new.job(), None, created.declarations, sim.now)
    (launch2,) = actions(p, Launch)
    assert isinstance(launch2, Launch)
    superseded = epoch(launch2.generation, launch2.submission, 0)

    assert first is not None
    assert requeued is not None
    assert first < requeued < resubmitted < superseded
    assert launch2.generation == 1

"""fold: replaying a record into a Job (seed 000, "Where the state comes from")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch_core.errors import MalformedRecord, OutOfOrderEvent
from dispatch_core.events import (
    ExecutionEnded,
    JobCreated,
    JobEvent,
    LaunchIntended,
    LaunchRecorded,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.fold import fold
from dispatch_core.state import (
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Declarations,
    Enforcer,
    JobSpec,
    ObjectRef,
    Plan,
    PlannedRule,
    Provenance,
    RecoveryPolicy,
    State,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
PLAN = Plan(
    rules=(
        PlannedRule(
            rule=0,
            on=(CauseKind.PREEMPTED,),
            action=Action.RESUBMIT,
            budget=3,
            enforcer=Enforcer.SUPERVISOR,
            hold_for_s=86400.0,
        ),
    ),
    uncovered=(),
)


def _created(job_id: str = "j1") -> JobCreated:
    return JobCreated(
        job_id=job_id,
        at=T0,
        spec=JobSpec(cluster="c"),
        policy=RecoveryPolicy(),
        plan=PLAN,
        declarations=Declarations(node_loss_window_s=60.0),
        by=ALICE,
    )


def _preempted_once() -> list[tuple[int, JobEvent]]:
    t = T0 + timedelta(minutes=1)
    ref = ObjectRef(cluster="c", id="100")
    cause = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED")
    events: list[JobEvent] = [
        _created(),
        SubmissionOpened(job_id="j1", at=t, submission=1, why="initial"),
        LaunchIntended(job_id="j1", at=t, submission=1, attempt=1),
        LaunchRecorded(job_id="j1", at=t, submission=1, attempt=1, ref=ref),
        ExecutionEnded(job_id="j1", at=t, ref=ref, restart=0, cause=cause, submission=1),
        RecoveryCommitted(job_id="j1", at=t, rule=0, action=Action.RESUBMIT, cause=cause),
        SubmissionOpened(job_id="j1", at=t, submission=2, why="recovery", cause=cause),
    ]
    # Stream sequences with gaps: other jobs' events sit between this job's.
    return [(3 * i + 5, ev) for i, ev in enumerate(events)]


def test_fold_replays_a_preemption_and_its_recovery() -> None:
    job = fold(_preempted_once(), T0)
    assert [s.number for s in job.submissions] == [1, 2]
    assert job.recoveries[0].cause.kind is CauseKind.PREEMPTED
    assert [t.state for t in job.history] == [State.RECOVERING]
    assert job.ended_cause is not None
    assert job.seq == 3 * 6 + 5


def test_fold_a_prefix_then_the_rest_equals_fold_of_all() -> None:
    record = _preempted_once()
    for cut in range(1, len(record) + 1):
        assert fold(record[cut:], T0, prior=fold(record[:cut], T0)) == fold(record, T0)


def test_fold_refuses_a_non_increasing_sequence() -> None:
    record = _preempted_once()
    record[3] = (record[2][0], record[3][1])
    with pytest.raises(OutOfOrderEvent, match=r"record of job 'j1', event seq 11"):
        fold(record, T0)


def test_fold_refuses_a_record_not_beginning_with_job_created() -> None:
    with pytest.raises(MalformedRecord, match=r"SubmissionOpened \(submission.opened\)"):
        fold(_preempted_once()[1:], T0)

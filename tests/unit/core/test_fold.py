"""fold: replaying a record into a Job (seed 000, "Where the state comes from";
docs/core-semantics.md, "fold")."""

from __future__ import annotations

import copy
import pickle
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from dispatch_core import (
    SUPERVISOR,
    Abandoned,
    AbandonTarget,
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Declarations,
    Enforcer,
    Escalation,
    EscalationCommitted,
    EscalationDelivered,
    ExecutionEnded,
    GateOpened,
    HoldHow,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    LaunchIntended,
    LaunchOutcome,
    LaunchRecorded,
    LaunchUnknown,
    MalformedRecord,
    ObjectRecord,
    ObjectRef,
    OutcomeCommitted,
    OutOfOrderEvent,
    Plan,
    PlannedRule,
    Provenance,
    RecoveryCommitted,
    RecoveryPolicy,
    State,
    StopRequested,
    StopWhy,
    SubmissionOpened,
    SubmissionWhy,
    Superseded,
    WriterKind,
    decode,
    decode_event,
    encode,
    fold,
    fold_one,
)
from dispatch_core.job import Indexed
from tests.unit.core.strategies import Record, records
from tests.util import written

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
REF = ObjectRef(cluster="c", id="100")
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED")
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


def _t(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


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


def _launched() -> list[JobEvent]:
    """Created, submission 1 opened, attempt 1/1 launched as REF."""
    return [
        _created(),
        SubmissionOpened(job_id="j1", at=_t(1), submission=1, why=SubmissionWhy.INITIAL),
        LaunchIntended(job_id="j1", at=_t(1), submission=1, attempt=1),
        LaunchRecorded(job_id="j1", at=_t(1), submission=1, attempt=1, ref=REF),
    ]


def _preempted_once() -> list[JobEvent]:
    return [
        *_launched(),
        ExecutionEnded(job_id="j1", at=_t(2), ref=REF, restart=0, cause=PREEMPTED, submission=1),
        RecoveryCommitted(job_id="j1", at=_t(2), rule=0, action=Action.RESUBMIT, cause=PREEMPTED),
        SubmissionOpened(
            job_id="j1", at=_t(2), submission=2, why=SubmissionWhy.RECOVERY, cause=PREEMPTED
        ),
    ]


def _seq(events: list[JobEvent]) -> Record:
    """Stream sequences with gaps: other jobs' events sit between this job's."""
    return [(3 * i + 5, ev) for i, ev in enumerate(events)]


def _fold(events: list[JobEvent]) -> Job:
    return fold(written(_seq(events)), T0)


# -- examples ---------------------------------------------------------------------------


def test_fold_replays_a_preemption_and_its_recovery() -> None:
    """ "dispatch.Fold replays the job's record into a Job: its submissions, holds, outcome
    and escalations" (seed 000, "Where the state comes from")."""
    job = fold(written(_seq(_preempted_once())), T0)
    assert [s.number for s in job.submissions] == [1, 2]
    assert job.submissions[0].attempts[0].outcome is LaunchOutcome.LAUNCHED
    assert job.object(REF) is not None
    assert job.recoveries[0].cause == PREEMPTED
    assert job.spent(0) == 1
    assert [t.state for t in job.history] == [State.RECOVERING]
    assert job.ended_cause == PREEMPTED
    assert job.seq == 3 * 6 + 5


def test_history_holds_recoveries_holds_and_outcomes_never_running() -> None:
    """ "Status.History holds the transitions committed to the record (recoveries, holds,
    outcomes) and not running" (seed 000)."""
    events: list[JobEvent] = [
        *_preempted_once(),
        HoldPlaced(
            job_id="j1",
            at=_t(3),
            instance=1,
            kind=HoldKind.ACTOR,
            by=ALICE,
            reason="look",
            deadline=_t(60),
        ),
        HoldReleased(job_id="j1", at=_t(4), instance=1, by=ALICE, how=HoldHow.RELEASE),
        OutcomeCommitted(job_id="j1", at=_t(5), state=State.SUCCEEDED, cause=PREEMPTED),
    ]
    job = fold(written(_seq(events)), T0)
    assert [(t.state, t.cause.kind) for t in job.history] == [
        (State.RECOVERING, CauseKind.PREEMPTED),
        (State.HELD, CauseKind.HELD),
        (State.RECOVERING, CauseKind.RELEASED),
        (State.SUCCEEDED, CauseKind.PREEMPTED),
    ]
    held = job.history[1].cause
    assert (held.provenance, held.actor, held.detail) == (Provenance.ACTOR, ALICE, "look")
    assert job.history[2].detail == "release"
    assert job.holds[0].released_by == ALICE


def test_a_hold_released_before_any_execution_ended_returns_to_pending() -> None:
    events: list[JobEvent] = [
        _created(),
        HoldPlaced(
            job_id="j1",
            at=_t(1),
            instance=1,
            kind=HoldKind.ACTOR,
            by=ALICE,
            reason="wait",
            deadline=_t(9),
        ),
        HoldReleased(
            job_id="j1", at=_t(2), instance=1, by=SUPERVISOR, how=HoldHow.RELEASE, override=True
        ),
    ]
    job = fold(written(_seq(events)), T0)
    assert job.history[-1].state is State.PENDING
    assert job.holds[0].override


def test_sequence_gaps_between_a_jobs_events_are_normal() -> None:
    """JetStream sequences are per stream: another job's events fill the gaps."""
    record = [(seq * 1000, ev) for seq, ev in _seq(_preempted_once())]
    assert fold(written(record), T0).seq == record[-1][0]


def test_a_duplicate_stopped_and_ended_is_recorded_but_never_drives_the_job() -> None:
    dup = ObjectRef(cluster="c", id="101")
    ended = Cause(kind=CauseKind.CANCELLED, provenance=Provenance.ACTOR)
    events: list[JobEvent] = [
        *_launched(),
        StopRequested(
            job_id="j1", at=_t(2), ref=dup, why=StopWhy.DUPLICATE, submission=1, attempt=1
        ),
        ExecutionEnded(job_id="j1", at=_t(3), ref=dup, restart=0, cause=ended, submission=1),
    ]
    job = fold(written(_seq(events)), T0)
    record = job.object(dup)
    assert record is not None
    assert (record.duplicate, record.submission, record.attempt, record.ended) == (True, 1, 1, (0,))
    assert record.stop_why == "duplicate"
    assert job.ended_cause is None


def test_abandoning_an_unknown_attempt_closes_it() -> None:
    """ "Only a human actor may abandon" closes a launch whose outcome nobody knows (seed 002)."""
    events: list[JobEvent] = [
        *_launched()[:3],
        LaunchUnknown(job_id="j1", at=_t(1), submission=1, attempt=1, detail="timeout"),
        Abandoned(job_id="j1", at=_t(20), target=AbandonTarget(submission=1), by=ALICE, reason="x"),
    ]
    job = fold(written(_seq(events)), T0)
    assert job.submissions[0].attempts[0].outcome is LaunchOutcome.ABANDONED
    assert job.abandoned == (AbandonTarget(submission=1),)


def test_an_escalation_is_delivered_once_keyed_by_its_id() -> None:
    """ "Each escalation is committed once, keyed by its ID" (seed 002)."""
    events: list[JobEvent] = [
        _created(),
        EscalationCommitted(job_id="j1", at=_t(1), id="foreign:c/9", detail="who is this?"),
        EscalationDelivered(job_id="j1", at=_t(2), id="foreign:c/9", channel="pager"),
        EscalationDelivered(job_id="j1", at=_t(3), id="foreign:c/9", channel="pager"),
    ]
    job = fold(written(_seq(events)), T0)
    assert [(e.id, e.delivered) for e in job.escalations] == [("foreign:c/9", _t(2))]


# -- malformed records: a typed error naming job, seq and problem -----------------------


def test_fold_refuses_a_non_increasing_sequence() -> None:
    record = _seq(_preempted_once())
    record[3] = (record[2][0], record[3][1])
    with pytest.raises(
        OutOfOrderEvent, match=r"record of job 'j1', event seq 11: sequence 11 is not after 11"
    ):
        fold(written(record), T0)
    record[3] = (record[2][0] - 1, record[3][1])
    with pytest.raises(OutOfOrderEvent) as err:
        fold(written(record), T0)
    assert (err.value.job_id, err.value.last_seq, err.value.got) == ("j1", 11, 10)


def test_fold_refuses_a_sequence_not_after_the_prior() -> None:
    record = _seq(_preempted_once())
    prior = fold(written(record[:4]), T0)
    with pytest.raises(OutOfOrderEvent):
        fold(written(record[3:]), T0, prior=prior)


def test_fold_refuses_a_record_not_beginning_with_job_created() -> None:
    with pytest.raises(MalformedRecord, match=r"SubmissionOpened \(submission.opened\)"):
        fold(written(_seq(_preempted_once()[1:])), T0)


def test_fold_refuses_an_empty_record() -> None:
    with pytest.raises(MalformedRecord, match="empty"):
        fold(written([]), T0)


def test_fold_refuses_a_second_job_created() -> None:
    with pytest.raises(MalformedRecord, match=r"seq 8: a second job.created"):
        fold(written(_seq([_created(), _created()])), T0)


def test_fold_refuses_an_event_of_another_job() -> None:
    events = [*_launched(), GateOpened(job_id="j2", at=_t(2), ref=REF)]
    with pytest.raises(
        MalformedRecord, match=r"gate.opened of job 'j2' in the record of 'j1'"
    ) as err:
        fold(written(_seq(events)), T0)
    assert (err.value.job_id, err.value.seq) == ("j1", 17)


_BAD: list[tuple[str, list[JobEvent], str]] = [
    (
        "launch for an attempt never intended",
        [*_launched()[:2], LaunchRecorded(job_id="j1", at=T0, submission=1, attempt=2, ref=REF)],
        r"attempt 1/2, which was never intended",
    ),
    (
        "intent for a submission never opened",
        [_created(), LaunchIntended(job_id="j1", at=T0, submission=1, attempt=1)],
        r"submission 1, which was never opened",
    ),
    (
        "submission skipped",
        [_created(), SubmissionOpened(job_id="j1", at=T0, submission=2, why=SubmissionWhy.INITIAL)],
        r"submission 2 opened where submission 1 was next",
    ),
    (
        "attempt skipped",
        [*_launched()[:2], LaunchIntended(job_id="j1", at=T0, submission=1, attempt=2)],
        r"attempt 1/2 where attempt 1/1 was next",
    ),
    (
        "second launch of one attempt",
        [*_launched(), LaunchRecorded(job_id="j1", at=T0, submission=1, attempt=1, ref=REF)],
        r"attempt 1/1, whose outcome is already launched",
    ),
    (
        "gate of an object never launched",
        [*_launched(), GateOpened(job_id="j1", at=T0, ref=ObjectRef(cluster="c", id="9"))],
        r"object c/9, which the record never launched",
    ),
    (
        "fence stop of an object never launched",
        [
            *_launched(),
            StopRequested(
                job_id="j1", at=T0, ref=ObjectRef(cluster="c", id="9"), why=StopWhy.FENCE
            ),
        ],
        r"stop.requested \(why 'fence'\) names object c/9",
    ),
    (
        "execution ended twice",
        [
            *_launched(),
            ExecutionEnded(job_id="j1", at=T0, ref=REF, restart=0, cause=PREEMPTED, submission=1),
            ExecutionEnded(job_id="j1", at=T0, ref=REF, restart=0, cause=PREEMPTED, submission=1),
        ],
        r"execution 0 of object c/100 is already recorded ended",
    ),
    (
        "execution ended under another submission",
        [
            *_launched(),
            ExecutionEnded(job_id="j1", at=T0, ref=REF, restart=0, cause=PREEMPTED, submission=2),
        ],
        r"belongs to submission 1",
    ),
    (
        "recovery by a rule the plan doesn't have",
        [
            _created(),
            RecoveryCommitted(job_id="j1", at=T0, rule=4, action=Action.RESUBMIT, cause=PREEMPTED),
        ],
        r"rule 4, but the plan has 1 rules",
    ),
    (
        "release of a hold never placed",
        [_created(), HoldReleased(job_id="j1", at=T0, instance=1, by=ALICE, how=HoldHow.RELEASE)],
        r"hold.released names hold 1, which is not in force",
    ),
    (
        "hold placed over a hold in force",
        [
            _created(),
            HoldPlaced(
                job_id="j1",
                at=T0,
                instance=1,
                kind=HoldKind.ACTOR,
                by=ALICE,
                reason="",
                deadline=T0,
            ),
            HoldPlaced(
                job_id="j1",
                at=T0,
                instance=2,
                kind=HoldKind.ACTOR,
                by=ALICE,
                reason="",
                deadline=T0,
            ),
        ],
        r"hold 2 placed while hold 1 is in force",
    ),
    (
        "hold instance skipped",
        [
            _created(),
            HoldPlaced(
                job_id="j1",
                at=T0,
                instance=2,
                kind=HoldKind.ACTOR,
                by=ALICE,
                reason="",
                deadline=T0,
            ),
        ],
        r"hold 2 placed where hold instance 1 was next",
    ),
    (
        "second outcome",
        [
            _created(),
            OutcomeCommitted(job_id="j1", at=T0, state=State.FAILED, cause=PREEMPTED),
            OutcomeCommitted(job_id="j1", at=T0, state=State.SUCCEEDED, cause=PREEMPTED),
        ],
        r"a second outcome succeeded after the committed outcome failed",
    ),
    (
        "outcome that is not an outcome",
        [_created(), OutcomeCommitted(job_id="j1", at=T0, state=State.RUNNING, cause=PREEMPTED)],
        r"outcome running is not an outcome",
    ),
    (
        "escalation committed twice",
        [
            _created(),
            EscalationCommitted(job_id="j1", at=T0, id="give-up", detail=""),
            EscalationCommitted(job_id="j1", at=T0, id="give-up", detail=""),
        ],
        r"escalation 'give-up' committed a second time",
    ),
    (
        "delivery of an escalation never committed",
        [_created(), EscalationDelivered(job_id="j1", at=T0, id="overdue:1")],
        r"escalation 'overdue:1' delivered but never committed",
    ),
    (
        "abandoning a submission never opened",
        [
            _created(),
            Abandoned(job_id="j1", at=T0, target=AbandonTarget(submission=3), by=ALICE, reason=""),
        ],
        r"abandoned names submission 3, which was never opened",
    ),
    (
        "abandoning nothing",
        [
            _created(),
            Abandoned(job_id="j1", at=T0, target=AbandonTarget(attempt=1), by=ALICE, reason=""),
        ],
        r"abandon target names neither",
    ),
    (
        "superseded twice",
        [
            _created(),
            Superseded(job_id="j1", at=T0, new_job="j2", by=ALICE, reason=""),
            Superseded(job_id="j1", at=T0, new_job="j3", by=ALICE, reason=""),
        ],
        r"superseded by 'j3', but already superseded by 'j2'",
    ),
]


@pytest.mark.parametrize(
    ("events", "problem"), [(e, p) for _, e, p in _BAD], ids=[n for n, _, _ in _BAD]
)
def test_fold_refuses_a_reference_to_something_that_does_not_exist(
    events: list[JobEvent], problem: str
) -> None:
    """ "Nothing is silently skipped": a record dispatch could not have written is refused,
    naming the job, the event's sequence and the problem."""
    record = _seq(events)
    with pytest.raises(MalformedRecord, match=problem) as err:
        fold(written(record), T0)
    assert err.value.job_id == "j1"
    assert err.value.seq == record[-1][0]


# -- properties over records a real dispatch could write --------------------------------


@given(records())
def test_fold_is_deterministic(record: Record) -> None:
    """ "Both are pure functions with the time passed in, so the state can't drift between
    adapters or between the processes reading it" (seed 000)."""
    first = fold(written(record), T0)
    assert fold(written(record), T0) == first
    assert encode(fold(written(list(record)), T0 + timedelta(days=3))) == encode(first)


@given(records(), st.data())
def test_fold_of_a_prefix_then_the_rest_equals_fold_of_all(
    record: Record, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(min_value=1, max_value=len(record)))
    assert fold(written(record[cut:]), T0, prior=fold(written(record[:cut]), T0)) == fold(
        written(record), T0
    )


@given(records())
def test_fold_of_a_decoded_record_equals_fold_of_the_record(record: Record) -> None:
    """What a reader decodes from the stream folds to what the writer folded."""
    decoded = [(seq, decode_event(encode(ev))) for seq, ev in record]
    assert fold(written(decoded), T0) == fold(written(record), T0)


@given(records())
def test_a_committed_outcome_never_changes_whatever_events_follow(record: Record) -> None:
    """ "Only a committed outcome is terminal. succeeded, failed and cancelled never change
    once committed" (seed 000)."""
    job = None
    outcome = None
    for seq, ev in record:
        job = fold(written([(seq, ev)]), T0, prior=job)
        if outcome is not None:
            assert (job.outcome, job.outcome_cause, job.outcome_at) == outcome
        elif job.outcome is not None:
            outcome = (job.outcome, job.outcome_cause, job.outcome_at)


@given(records())
def test_no_rules_budget_is_ever_exceeded(record: Record) -> None:
    """ "a rule with budget left: the job is recovering" (seed 000): a rule recovers at most
    its budget's worth of times."""
    job = fold(written(record), T0)
    for rule in job.plan.rules:
        assert job.spent(rule.rule) <= rule.budget


@given(records())
def test_history_never_holds_running(record: Record) -> None:
    assert State.RUNNING not in {t.state for t in fold(written(record), T0).history}


# -- the incremental fold (issue 11, "Fold that is truly incremental") -----------------------


def _scan_object(job: Job, ref: ObjectRef) -> ObjectRecord | None:
    return next((o for o in job.objects if o.ref == ref), None)


def _scan_escalation(job: Job, escalation_id: str) -> Escalation | None:
    return next((e for e in job.escalations if e.id == escalation_id), None)


def _lookups_agree(job: Job, refs: set[ObjectRef], ids: set[str]) -> None:
    """``Job.object``/``escalation`` (by index) answer what a linear scan answers, for the
    job's own keys and for keys only other versions of the job hold; and so do the other
    accessors the planner uses instead of going through the whole job."""
    for ref in refs:
        assert job.object(ref) == _scan_object(job, ref)
    for escalation_id in ids:
        assert job.escalation(escalation_id) == _scan_escalation(job, escalation_id)
    # What fold keeps of each version (marks and tallies) is what going through it finds.
    assert job.unconfirmed_objects() == [o for o in job.objects if o.fenced or not o.ended]
    assert job.unknown_submissions() == [
        s for s in job.submissions if any(a.outcome is LaunchOutcome.UNKNOWN for a in s.attempts)
    ]
    for rule in range(len(job.plan.rules)):
        assert job.spent(rule) == sum(1 for r in job.recoveries if r.rule == rule)
    for native in (False, True):
        assert job.recoveries_made(native=native) == sum(
            1 for r in job.recoveries if r.native == native
        )
    whys = {s.why for s in job.submissions} | {"recovery"}
    for why in whys:
        assert job.submissions_opened(why) == sum(1 for s in job.submissions if s.why == why)
    assert job.objects_among(refs) == [o for o in job.objects if o.ref in refs]
    for sub in job.submissions:
        assert job.first_launched(sub.number) == next(
            (o for o in job.objects if o.submission == sub.number and not o.duplicate), None
        )


@given(records())
def test_fold_one_event_at_a_time_equals_the_full_fold_of_every_prefix(record: Record) -> None:
    """Folding each new event into the job folded so far (as the supervisor, the planner and
    the API do) gives, after every event, the job a full fold of that prefix gives; and every
    earlier version still answers as it did (a fold never changes its prior)."""
    items = written(record)
    job = fold(items[:1], T0)
    versions = [(job, encode(job))]
    for n in range(2, len(items) + 1):
        seq, event, writer = items[n - 1]
        job = fold_one(job, seq, event, writer)
        assert job == fold(items[:n], T0)
        assert job.seq == seq
        versions.append((job, encode(job)))
    refs = {o.ref for o in job.objects}
    ids = {e.id for e in job.escalations}
    for version, encoded in versions:
        assert encode(version) == encoded
        _lookups_agree(version, refs, ids)


@given(records(), st.data())
def test_two_folds_of_one_prior_each_equal_their_full_fold(
    record: Record, data: st.DataObject
) -> None:
    """Two continuations folded over one cached job (a pass's plan and its commit, or a
    conflict's re-read) don't see each other: they share the prior's indexes, never its
    answers."""
    cut = data.draw(st.integers(min_value=1, max_value=len(record)))
    drop = data.draw(st.integers(min_value=cut, max_value=len(record)))
    items = written(record)
    prior = fold(items[:cut], T0)
    whole = fold(items[cut:], T0, prior=prior)
    try:  # the record without one of its events: often malformed, sometimes a sibling
        sibling: Job | None = fold(items[cut:drop] + items[drop + 1 :], T0, prior=prior)
    except MalformedRecord:
        sibling = None
    again = fold(items[cut:], T0, prior=prior)
    assert whole == again == fold(items, T0)
    assert prior == fold(items[:cut], T0)
    refs = {o.ref for o in whole.objects}
    ids = {e.id for e in whole.escalations}
    for version in (prior, whole, again, *([] if sibling is None else [sibling])):
        _lookups_agree(version, refs, ids)
    if sibling is not None:
        assert sibling == fold(items[:drop] + items[drop + 1 :], T0)


def test_siblings_placing_the_same_object_at_different_positions_each_find_theirs() -> None:
    """Three folds of one prior: the first records a duplicate's end, the second a stop and
    then that end, the third another duplicate's end and then that end, so the same ref sits
    at position 1 in two of them and 2 in the third; each version finds its own objects,
    and the prior none of theirs."""
    other = ObjectRef(cluster="c", id="200")
    base = _launched()
    prior = _fold(base)
    seq = 3 * len(base) + 5
    dup = ExecutionEnded(job_id="j1", at=_t(3), ref=other, restart=0, cause=PREEMPTED, submission=1)
    stop = StopRequested(job_id="j1", at=_t(3), ref=REF, why=StopWhy.CANCEL)
    first = fold(written([(seq, dup)]), T0, prior=prior)
    second = fold(written([(seq, stop), (seq + 1, dup)]), T0, prior=prior)
    intruder = ObjectRef(cluster="c", id="300")
    third = fold(written([(seq, replace(dup, ref=intruder)), (seq + 1, dup)]), T0, prior=prior)
    assert [o.ref for o in first.objects] == [REF, other]
    assert [o.ref for o in third.objects] == [REF, intruder, other]
    for job in (prior, first, second, third):
        _lookups_agree(job, {REF, other, intruder}, set())
    assert prior.object(other) is None
    assert third.object(other) == ObjectRecord(
        ref=other, submission=1, attempt=0, duplicate=True, ended=(0,)
    )


def test_fold_one_shares_what_the_event_leaves_alone() -> None:
    """Folding one event copies nothing it doesn't change: the other tuples are the prior's
    own objects (what makes a pass's cost independent of the record's length)."""
    job = _fold(_preempted_once())
    seq = job.seq + 1
    after = fold_one(
        job,
        seq,
        LaunchIntended(job_id="j1", at=_t(3), submission=2, attempt=1),
        WriterKind.SUPERVISOR,
    )
    assert after.objects is job.objects
    assert after.history is job.history
    assert after.recoveries is job.recoveries
    assert after.escalations is job.escalations
    assert after.submissions[0] is job.submissions[0]
    assert after.submissions[1].attempts[0].intended_at == _t(3)


def test_a_job_not_folded_here_is_looked_up_by_an_index_built_once() -> None:
    """A decoded Job (a plain tuple of objects) builds its index at the first lookup."""
    job = _fold(_preempted_once())
    decoded = decode(encode(job), Job)
    assert decoded == job
    assert not isinstance(decoded.objects, Indexed)
    _lookups_agree(decoded, {REF, ObjectRef(cluster="c", id="404")}, {"none"})
    launched = job.object(REF)
    assert launched is not None
    assert decoded.object(REF) == launched
    assert decoded.object(ObjectRef(cluster="c", id="404")) is None
    opened = fold_one(
        decoded, job.seq + 1, GateOpened(job_id="j1", at=_t(4), ref=REF), WriterKind.SUPERVISOR
    )
    assert opened.object(REF) == replace(launched, gate_opened_at=_t(4))


def test_a_folded_job_copies_and_pickles_with_what_fold_keeps() -> None:
    """A Job goes between processes (pickle) and may be copied: its tuples keep their
    index, marks and tallies, and answer as before."""
    job = _fold(_preempted_once())
    for copied in (pickle.loads(pickle.dumps(job)), copy.deepcopy(job), copy.copy(job)):
        assert copied == job
        assert isinstance(copied.objects, Indexed)
        assert copied.object(REF) == job.object(REF)
        assert copied.spent(0) == job.spent(0) == 1
        assert copied.unconfirmed_objects() == job.unconfirmed_objects()

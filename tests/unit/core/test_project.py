"""project and settled: the Status a caller reads (seed 000, "Where the state comes from",
"Without a record", "The node-loss fence"; docs/core-semantics.md, "project", "Settled")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from dispatch_core import (
    STATUS_HISTORY_LIMIT,
    Abandon,
    AbandonTarget,
    Action,
    Actor,
    ActorKind,
    Cancel,
    Cause,
    CauseKind,
    Commit,
    Declarations,
    Discovery,
    ExecutionEnded,
    GateState,
    HoldCommand,
    Job,
    JobEvent,
    JobSpec,
    LaunchIntended,
    LaunchRecorded,
    LaunchUnknown,
    Level,
    NodeLossObserved,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    OutcomeCommitted,
    Provenance,
    RecoveryCommitted,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
    StopRequested,
    StopWhy,
    SubmissionOpened,
    SubmissionWhy,
    Submit,
    Transition,
    decide,
    decode,
    encode,
    epoch,
    fold,
    next_steps,
    project,
    settled,
)
from tests.unit.core.strategies import Record, discoveries, observed_objects, records
from tests.util import written

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
BOT = Actor(name="ci-bot", kind=ActorKind.SERVICE)
REF1 = ObjectRef(cluster="c", id="101")
REF2 = ObjectRef(cluster="c", id="102")
FOREIGN = ObjectRef(cluster="c", id="999")
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED")
NODE_FAIL = Cause(kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail="NODE_FAIL")


def _t(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


class _Rec:
    """A record under construction, folded as it grows."""

    def __init__(self, generation: int = 0) -> None:
        submit = Submit(
            by=ALICE,
            job_id="j1",
            spec=JobSpec(cluster="c"),
            policy=RecoveryPolicy(
                rules=(
                    RecoveryRule(
                        on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST),
                        action=Action.RESUBMIT,
                        budget=2,
                    ),
                )
            ),
            declarations=Declarations(node_loss_window_s=120.0),
        )
        created = decide(None, submit, T0)[0]
        self.job: Job = fold(written([(1, replace(created, generation=generation))]), T0)

    def add(self, *events: JobEvent) -> _Rec:
        self.job = fold(
            written([(self.job.seq + 1 + i, ev) for i, ev in enumerate(events)]), T0, prior=self.job
        )
        return self

    def launch(self, n: int, ref: ObjectRef, *, why: str = "initial") -> _Rec:
        return self.add(
            SubmissionOpened(job_id="j1", at=_t(n), submission=n, why=SubmissionWhy(why)),
            LaunchIntended(job_id="j1", at=_t(n), submission=n, attempt=1),
            LaunchRecorded(job_id="j1", at=_t(n), submission=n, attempt=1, ref=ref),
        )

    def ended(self, ref: ObjectRef, n: int, cause: Cause, *, fenced: bool = False) -> _Rec:
        return self.add(
            ExecutionEnded(
                job_id="j1", at=_t(n), ref=ref, restart=0, cause=cause, fenced=fenced, submission=n
            )
        )

    def recovered(self, n: int, cause: Cause) -> _Rec:
        return self.add(
            RecoveryCommitted(job_id="j1", at=_t(n), rule=0, action=Action.RESUBMIT, cause=cause),
            SubmissionOpened(
                job_id="j1", at=_t(n), submission=n + 1, why=SubmissionWhy.RECOVERY, cause=cause
            ),
        )


def _obj(
    ref: ObjectRef,
    n: int | None,
    phase: ObjectPhase,
    *,
    cause: Cause | None = None,
    gate: GateState = GateState.OPEN,
    restarts: int = 0,
) -> ObservedObject:
    return ObservedObject(
        ref=ref,
        name="dj-j1",
        submission=n,
        attempt=None if n is None else 1,
        phase=phase,
        cause=cause,
        gate=gate,
        restarts=restarts,
    )


def _seen(*objects: ObservedObject, job_id: str = "j1") -> Discovery:
    return Discovery(cluster="c", job_id=job_id, seen_at=T0, objects=objects)


# -- without a record -------------------------------------------------------------------


def test_without_a_record_the_status_is_object_only_running_or_pending() -> None:
    """ "Its Status has Level object-only, and its state is pending or running, from whether
    any object of the job is alive" (seed 000, "Without a record")."""
    running = project(None, _seen(_obj(REF1, 1, ObjectPhase.STOPPING)), T0)
    assert (running.level, running.state, running.cause.kind) == (
        Level.OBJECT_ONLY,
        State.RUNNING,
        CauseKind.NONE,
    )
    assert running.objects == (REF1,)
    pending = project(None, _seen(_obj(REF1, 1, ObjectPhase.PENDING)), T0)
    assert pending.state is State.PENDING
    foreign_only = project(None, _seen(_obj(FOREIGN, None, ObjectPhase.RUNNING)), T0)
    assert foreign_only.state is State.PENDING
    assert project(None, None, T0, job_id="j1").state is State.PENDING


def test_without_a_record_an_ended_object_is_never_terminal() -> None:
    """ "It's never terminal, because an object ending isn't the job ending, and only the
    record knows which it was" (seed 000, "Without a record")."""
    status = project(None, _seen(_obj(REF1, 1, ObjectPhase.ENDED, cause=PREEMPTED)), T0)
    assert status.state is State.PENDING
    assert not status.settled


@given(discoveries)
def test_an_object_only_status_is_never_terminal(discovery: Discovery) -> None:
    status = project(None, discovery, T0)
    assert status.level is Level.OBJECT_ONLY
    assert status.state in {State.PENDING, State.RUNNING}
    assert not status.state.terminal
    assert not status.settled


def test_without_a_record_or_a_discovery_the_job_id_is_needed() -> None:
    with pytest.raises(ValueError, match="job id"):
        project(None, None, T0)


# -- with a record ----------------------------------------------------------------------


def test_a_never_launched_job_is_pending() -> None:
    status = project(_Rec().job, None, T0)
    assert (status.level, status.state, status.cause.kind) == (
        Level.FULL,
        State.PENDING,
        CauseKind.NONE,
    )
    assert (status.submission, status.epoch, status.seq) == (None, None, 1)


def test_a_running_object_makes_the_job_running_with_its_epoch() -> None:
    """Whether a job is running "comes from what the scheduler shows when you ask" (seed
    000); DISPATCH_EPOCH = G*10^12 + N*10^6 + R (seed 004)."""
    rec = _Rec(generation=2).launch(1, REF1)
    status = project(rec.job, _seen(_obj(REF1, 1, ObjectPhase.RUNNING, restarts=4)), T0)
    assert (status.state, status.cause.kind) == (State.RUNNING, CauseKind.NONE)
    assert status.epoch == epoch(2, 1, 4) == 2_000_001_000_004
    assert status.submission == 1


def test_inside_the_window_a_job_on_a_lost_node_is_running_with_cause_node_lost() -> None:
    """ "Inside the window the job is running with cause node-lost: the one case where a
    running job carries a cause" (seed 000, "The node-loss fence")."""
    rec = _Rec().launch(1, REF1)
    rec.add(
        NodeLossObserved(job_id="j1", at=_t(2), ref=REF1, restart=0, since=_t(2), cause=NODE_FAIL)
    )
    status = project(rec.job, _seen(_obj(REF1, 1, ObjectPhase.RUNNING, cause=NODE_FAIL)), _t(3))
    assert (status.state, status.cause) == (State.RUNNING, NODE_FAIL)


def test_past_the_window_the_fenced_job_is_recovering_while_the_old_object_still_runs() -> None:
    """ "Past it, Next asks for the object to be stopped, then applies the plan for
    node-lost" (seed 000): the fenced execution no longer makes the job running."""
    rec = _Rec().launch(1, REF1)
    rec.add(StopRequested(job_id="j1", at=_t(5), ref=REF1, why=StopWhy.FENCE))
    rec.ended(REF1, 1, NODE_FAIL, fenced=True).recovered(1, NODE_FAIL)
    rec.add(
        LaunchIntended(job_id="j1", at=_t(5), submission=2, attempt=1),
        LaunchRecorded(job_id="j1", at=_t(5), submission=2, attempt=1, ref=REF2),
    )
    seen = _seen(
        _obj(REF1, 1, ObjectPhase.RUNNING, cause=NODE_FAIL),
        _obj(REF2, 2, ObjectPhase.PENDING, gate=GateState.CLOSED),
    )
    status = project(rec.job, seen, _t(6))
    assert (status.state, status.cause) == (State.RECOVERING, NODE_FAIL)
    assert status.epoch == epoch(0, 2, 0)
    assert status.objects == (REF1, REF2)


def test_recovering_never_goes_back_to_pending() -> None:
    """ "recovering never goes back to pending. A job whose second submission is waiting to
    start is recovering" (seed 000)."""
    rec = _Rec().launch(1, REF1).ended(REF1, 1, PREEMPTED).recovered(1, PREEMPTED)
    assert project(rec.job, None, _t(2)).state is State.RECOVERING
    rec.add(
        LaunchIntended(job_id="j1", at=_t(2), submission=2, attempt=1),
        LaunchRecorded(job_id="j1", at=_t(2), submission=2, attempt=1, ref=REF2),
    )
    seen = _seen(_obj(REF2, 2, ObjectPhase.PENDING, gate=GateState.CLOSED))
    status = project(rec.job, seen, _t(3))
    assert (status.state, status.cause) == (State.RECOVERING, PREEMPTED)
    assert [t.state for t in status.history] == [State.RECOVERING]


def test_a_gate_an_administrator_holds_shows_the_job_held_by_the_scheduler() -> None:
    """admin-held: "A launched object is held by someone other than dispatch" (seed 002)."""
    rec = _Rec().launch(1, REF1)
    why = Cause(kind=CauseKind.HELD, provenance=Provenance.SCHEDULER, detail="JobHeldAdmin")
    status = project(
        rec.job, _seen(_obj(REF1, 1, ObjectPhase.PENDING, gate=GateState.ADMIN_HELD, cause=why)), T0
    )
    assert (status.state, status.cause.kind, status.cause.provenance, status.cause.detail) == (
        State.HELD,
        CauseKind.HELD,
        Provenance.SCHEDULER,
        "JobHeldAdmin",
    )


def test_an_object_in_a_phase_the_adapter_cannot_map_shows_the_job_unknown_with_its_words() -> None:
    """ "an adapter that sees something new reports unknown with the scheduler's words in the
    detail" (seed 000, "State and cause")."""
    rec = _Rec().launch(1, REF1)
    words = Cause(kind=CauseKind.UNKNOWN, provenance=Provenance.SCHEDULER, detail="SPECIAL_EXIT")
    status = project(rec.job, _seen(_obj(REF1, 1, ObjectPhase.UNKNOWN, cause=words)), T0)
    assert (status.state, status.cause) == (State.UNKNOWN, words)


def test_a_hold_shows_its_kind_and_becomes_overdue_at_its_deadline() -> None:
    """ "Status.Hold.Kind says which kind it is"; a hold past its deadline is overdue and
    stays in force (seed 002, ``overdue:<instance>``)."""
    rec = _Rec().launch(1, REF1)
    rec.add(*decide(rec.job, HoldCommand(by=ALICE, reason="data fix", for_s=600.0), _t(2)))
    seen = _seen(_obj(REF1, 1, ObjectPhase.RUNNING))
    before = project(rec.job, seen, _t(11))
    assert (before.state, before.cause.kind, before.cause.actor) == (
        State.HELD,
        CauseKind.HELD,
        ALICE,
    )
    assert before.hold is not None
    assert (before.hold.kind, before.hold.overdue) == ("actor", False)
    after = project(rec.job, seen, _t(12))
    assert after.hold is not None
    assert after.hold.overdue
    assert after.state is State.HELD


def test_a_committed_outcome_is_final_whatever_the_scheduler_shows() -> None:
    """ "succeeded, failed and cancelled never change once committed" (seed 000)."""
    rec = (
        _Rec()
        .launch(1, REF1)
        .ended(REF1, 1, Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER))
    )
    rec.add(
        OutcomeCommitted(
            job_id="j1",
            at=_t(2),
            state=State.SUCCEEDED,
            cause=Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER),
        )
    )
    for seen in (None, _seen(_obj(REF1, 1, ObjectPhase.RUNNING, cause=NODE_FAIL))):
        assert project(rec.job, seen, _t(3)).state is State.SUCCEEDED


@given(st.lists(observed_objects, max_size=4))
def test_a_committed_outcome_is_final_for_any_discovery(objects: list[ObservedObject]) -> None:
    rec = _Rec().launch(1, REF1)
    rec.add(*decide(rec.job, Cancel(by=ALICE, reason="wrong data"), _t(2)))
    status = project(rec.job, _seen(*objects), _t(3))
    assert (status.state, status.cause.kind, status.cause.actor) == (
        State.CANCELLED,
        CauseKind.CANCELLED,
        ALICE,
    )


def test_a_discovery_of_another_job_is_refused() -> None:
    with pytest.raises(ValueError, match="discovery of job 'j2'"):
        project(_Rec().job, replace(_seen(), job_id="j2"), T0)


# -- settled ----------------------------------------------------------------------------


def _cancelled() -> _Rec:
    rec = _Rec().launch(1, REF1)
    rec.add(*decide(rec.job, Cancel(by=ALICE), _t(2)))
    return rec


def test_a_job_without_an_outcome_is_never_settled() -> None:
    assert not settled(_Rec().launch(1, REF1).job, _seen())


def test_a_job_with_an_outcome_settles_once_nothing_of_it_is_alive() -> None:
    """ "A job settles when it has an outcome and nothing of it can still act: no live
    object, no launch whose outcome is unknown, no foreign object" (DESIGN.md 3)."""
    rec = _cancelled()
    assert not settled(rec.job, _seen(_obj(REF1, 1, ObjectPhase.STOPPING)))
    assert not settled(rec.job, None)
    assert settled(rec.job, _seen(_obj(REF1, 1, ObjectPhase.ENDED)))
    assert project(rec.job, _seen(_obj(REF1, 1, ObjectPhase.ENDED)), _t(3)).settled


def test_an_object_a_discovery_does_not_show_is_not_proven_gone_until_its_end_is_recorded() -> None:
    """A discovery that doesn't show a launched object may predate it (the observer
    republishes only on change), so it proves nothing by itself (regression found by the
    stateful test: a cancelled job "settled" while the object it had just launched was alive
    on the scheduler). Gone is not ended (issue 15): however late the discovery, an object
    merely absent is never recorded ended; the job settles once a discovery lists it
    vanished (the scheduler has no record of it) and the planner records its end."""
    rec = _cancelled()
    assert not settled(rec.job, _seen())
    decl = Declarations(node_loss_window_s=120.0)
    later = Discovery(cluster="c", job_id="j1", seen_at=_t(60), objects=())
    absent = next_steps(rec.job, later, decl, _t(60))
    assert not absent.settled
    assert not [
        s for s in absent.steps if isinstance(s, Commit) and isinstance(s.event, ExecutionEnded)
    ]
    vanished = Discovery(cluster="c", job_id="j1", seen_at=_t(60), objects=(), vanished=(REF1,))
    the_pass = next_steps(rec.job, vanished, decl, _t(60))
    assert the_pass.settled
    ended = [s.event for s in the_pass.steps if isinstance(s, Commit)]
    assert any(isinstance(e, ExecutionEnded) and e.ref == REF1 for e in ended)


def test_a_foreign_object_blocks_settling_until_a_human_abandons_it() -> None:
    """foreign:<object id> "blocks the record from settling" (seed 002)."""
    rec = _cancelled()
    seen = _seen(_obj(REF1, 1, ObjectPhase.ENDED), _obj(FOREIGN, None, ObjectPhase.RUNNING))
    assert not settled(rec.job, seen)
    rec.add(
        *decide(
            rec.job,
            Abandon(by=ALICE, reason="site plugin", target=AbandonTarget(foreign=FOREIGN)),
            _t(4),
        )
    )
    assert settled(rec.job, seen)


def test_a_launch_whose_outcome_is_unknown_blocks_settling() -> None:
    rec = _Rec().launch(1, REF1)
    rec.add(
        SubmissionOpened(job_id="j1", at=_t(2), submission=2, why=SubmissionWhy.RECOVERY),
        LaunchIntended(job_id="j1", at=_t(2), submission=2, attempt=1),
        LaunchUnknown(job_id="j1", at=_t(2), submission=2, attempt=1, detail="timeout"),
    )
    rec.add(*decide(rec.job, Cancel(by=ALICE), _t(3)))
    first_ended = _seen(_obj(REF1, 1, ObjectPhase.ENDED))
    assert not settled(rec.job, first_ended)
    rec.add(
        *decide(rec.job, Abandon(by=ALICE, target=AbandonTarget(submission=2, attempt=1)), _t(14))
    )
    assert settled(rec.job, first_ended)


def test_a_cancelled_job_that_never_launched_settles_without_a_discovery() -> None:
    rec = _Rec()
    rec.add(*decide(rec.job, Cancel(by=BOT), T0))
    assert settled(rec.job, None)


# -- properties -------------------------------------------------------------------------


def _discovery_for(job: Job) -> Discovery:
    """What the scheduler might show: every recorded object pending, so the record decides."""
    return _seen(
        *(
            _obj(o.ref, o.submission or 1, ObjectPhase.PENDING, gate=GateState.CLOSED)
            for o in job.objects
        ),
        job_id=job.job_id,
    )


@given(records())
def test_recovering_never_returns_to_pending_over_a_growing_record(record: Record) -> None:
    """ "recovering never goes back to pending" (seed 000), however the record grows."""
    job = None
    was_recovering = False
    for seq, ev in record:
        job = fold(written([(seq, ev)]), T0, prior=job)
        for seen in (None, _discovery_for(job)):
            state = project(job, seen, ev.at).state
            if was_recovering:
                assert state is not State.PENDING
            if state is State.RECOVERING:
                was_recovering = True


@given(records(), discoveries)
def test_project_is_total_and_deterministic(record: Record, discovery: Discovery) -> None:
    job = fold(written(record), T0)
    seen = replace(discovery, job_id=job.job_id)
    status = project(job, seen, T0)
    assert project(job, seen, T0) == status
    assert status.level is Level.FULL
    assert status.settled == settled(job, seen)
    if job.outcome is not None:
        assert status.state is job.outcome


# -- the bounded history (issue 11, "Fold that is truly incremental") ------------------------


def test_a_status_carries_the_latest_transitions_and_how_many_the_record_holds() -> None:
    """A Status stays small however long the job lives: the last STATUS_HISTORY_LIMIT
    transitions, and the count; the record holds them all."""
    rec = _Rec().launch(1, REF1).ended(REF1, 1, PREEMPTED).recovered(1, PREEMPTED)
    many = tuple(
        Transition(at=_t(i), state=State.RECOVERING, cause=PREEMPTED)
        for i in range(STATUS_HISTORY_LIMIT * 3 + 7)
    )
    job = replace(rec.job, history=many)
    status = project(job, None, _t(1000))
    assert status.history == many[-STATUS_HISTORY_LIMIT:]
    assert status.history_total == len(many)
    assert status.history_count == len(many)
    assert status.history_omitted == len(many) - STATUS_HISTORY_LIMIT
    short = project(rec.job, None, _t(1000))
    assert short.history == rec.job.history
    assert short.history_total == len(rec.job.history) == 1
    assert short.history_omitted == 0


def test_a_status_written_before_the_history_was_bounded_still_decodes_whole() -> None:
    """An old Status (every transition, no ``history_total``) decodes, and says it holds
    its whole history."""
    rec = _Rec().launch(1, REF1).ended(REF1, 1, PREEMPTED).recovered(1, PREEMPTED)
    status = project(rec.job, None, _t(10))
    old = msgspec.json.decode(encode(status))
    del old["history_total"]
    decoded = decode(msgspec.json.encode(old), Status)
    assert decoded == replace(status, history_total=0)
    assert decoded.history_count == len(decoded.history) == 1
    assert decoded.history_omitted == 0

"""decide: what an operator's command commits, or why it is refused (seed 002, "Answer it by
its id"; docs/core-semantics.md, "decide")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dispatch_core import (
    JOB_PLACEHOLDER,
    SUPERVISOR,
    Abandon,
    Abandoned,
    AbandonTarget,
    Action,
    Actor,
    ActorKind,
    Cancel,
    CancelRequested,
    Cause,
    CauseKind,
    Declarations,
    EmergencyStop,
    EmergencyStopRequested,
    EscalationCommitted,
    ExecutionEnded,
    GaveUp,
    GiveUp,
    HoldCommand,
    HoldHow,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    InvalidPolicy,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    LaunchIntended,
    LaunchRecorded,
    LaunchUnknown,
    ObjectRef,
    OperatorCommand,
    OptionRefused,
    OutcomeCommitted,
    Provenance,
    RecoveryPolicy,
    RecoveryRule,
    Refused,
    Release,
    Resubmit,
    State,
    SubmissionOpened,
    SubmissionWhy,
    Submit,
    Supersede,
    Superseded,
    WriterKind,
    decide,
    fold,
    project,
)
from tests.unit.core.strategies import Record, commands, job_ids, records
from tests.util import written

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
BOB = Actor(name="bob", kind=ActorKind.HUMAN)
BOT = Actor(name="ci-bot", kind=ActorKind.SERVICE)
REF = ObjectRef(cluster="c", id="101")
OOM = Cause(kind=CauseKind.OUT_OF_MEMORY, provenance=Provenance.SCHEDULER, detail="OOMKilled")
POLICY = RecoveryPolicy(
    rules=(
        RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),
        RecoveryRule(on=(CauseKind.OUT_OF_MEMORY,), action=Action.HOLD, hold_for_s=3600.0),
    )
)
SUBMIT = Submit(
    by=ALICE,
    reason="train",
    job_id="llm-7b",
    spec=JobSpec(cluster="c", checkpoint="/ckpt/llm"),
    policy=POLICY,
    declarations=Declarations(node_loss_window_s=300.0),
)


def _t(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _apply(job: Job | None, *events: JobEvent) -> Job:
    seq = 0 if job is None else job.seq
    return fold(written([(seq + 1 + i, ev) for i, ev in enumerate(events)]), T0, prior=job)


def _submitted() -> Job:
    return _apply(None, *decide(None, SUBMIT, T0))


def _launched() -> Job:
    j = "llm-7b"
    return _apply(
        _submitted(),
        SubmissionOpened(job_id=j, at=_t(1), submission=1, why=SubmissionWhy.INITIAL),
        LaunchIntended(job_id=j, at=_t(1), submission=1, attempt=1),
        LaunchRecorded(job_id=j, at=_t(1), submission=1, attempt=1, ref=REF),
    )


def _recovery_held() -> Job:
    """The OOM hold rule placed a recovery hold after the execution ended."""
    j = "llm-7b"
    return _apply(
        _launched(),
        ExecutionEnded(job_id=j, at=_t(5), ref=REF, restart=0, cause=OOM, submission=1),
        HoldPlaced(
            job_id=j,
            at=_t(5),
            instance=1,
            kind=HoldKind.RECOVERY,
            by=SUPERVISOR,
            reason="rule 1 holds on out-of-memory",
            deadline=_t(65),
            cause=OOM,
            rule=1,
        ),
    )


def _actor_held(by: Actor = ALICE) -> Job:
    job = _launched()
    return _apply(job, *decide(job, HoldCommand(by=by, reason="bad shard", for_s=600.0), _t(2)))


def _failed() -> Job:
    job = _recovery_held()
    return _apply(job, *decide(job, GiveUp(by=ALICE, reason="needs a bigger node"), _t(10)))


def _refused(job: Job | None, command: OperatorCommand, match: str) -> Refused:
    with pytest.raises(Refused, match=match) as err:
        decide(job, command, _t(30))
    return err.value


# -- submit -----------------------------------------------------------------------------


def test_submit_opens_the_record_with_the_plan_made_before_the_job_starts() -> None:
    """ "Plan.Uncovered lists, before the job starts, every cause no rule covers" (seed 000)."""
    (created,) = decide(None, SUBMIT, T0)
    assert isinstance(created, JobCreated)
    assert (created.job_id, created.generation, created.supersedes, created.by) == (
        "llm-7b",
        0,
        None,
        ALICE,
    )
    assert CauseKind.NODE_LOST in created.plan.uncovered
    assert created.policy == POLICY


def test_submit_is_refused_for_a_job_that_exists_or_an_invalid_id() -> None:
    _refused(_submitted(), SUBMIT, "already exists; to run it again, supersede it")
    bad = Submit(
        by=ALICE, job_id="LLM.7b", spec=SUBMIT.spec, policy=POLICY, declarations=SUBMIT.declarations
    )
    err = _refused(None, bad, r"'LLM.7b' is not a job id")
    assert (err.job_id, err.command) == ("LLM.7b", "submit")


def test_submit_with_an_illegal_policy_raises_invalid_policy() -> None:
    illegal = RecoveryPolicy(rules=(RecoveryRule(on=(CauseKind.UNKNOWN,), action=Action.RESUBMIT),))
    with pytest.raises(InvalidPolicy, match="is a guess"):
        decide(
            None,
            Submit(
                by=ALICE,
                job_id="j",
                spec=SUBMIT.spec,
                policy=illegal,
                declarations=SUBMIT.declarations,
            ),
            T0,
        )


def _created(command: Submit) -> JobCreated:
    (created,) = decide(None, command, T0)
    assert isinstance(created, JobCreated)
    return created


def _with_root(checkpoint: str | None, job_id: str = "llm-7b") -> Submit:
    spec = msgspec.structs.replace(SUBMIT.spec, checkpoint=checkpoint)
    return msgspec.structs.replace(SUBMIT, job_id=job_id, spec=spec)


def test_submit_records_the_checkpoint_root_with_job_replaced_by_the_job_id() -> None:
    """``{job}`` stands for the job's id, expanded once at creation (like Slurm's ``%j``):
    the record, and every backend that folds it, sees the concrete root."""
    created = _created(_with_root("/ckpt/{job}/run-{job}"))
    assert created.spec.checkpoint == "/ckpt/llm-7b/run-llm-7b"
    assert created.spec == msgspec.structs.replace(
        SUBMIT.spec, checkpoint="/ckpt/llm-7b/run-llm-7b"
    )
    assert _apply(None, created).spec.checkpoint == "/ckpt/llm-7b/run-llm-7b"


def test_one_job_file_submitted_twice_gives_each_job_its_own_root() -> None:
    """Two jobs at generation 0 sharing a root: the second would resume from the first's
    publications, and its own saves could never outrank them."""
    first = _created(_with_root("/ckpt/digits/{job}", "digits-a1b2c3d4"))
    second = _created(_with_root("/ckpt/digits/{job}", "digits-e5f6a7b8"))
    assert (first.spec.checkpoint, second.spec.checkpoint) == (
        "/ckpt/digits/digits-a1b2c3d4",
        "/ckpt/digits/digits-e5f6a7b8",
    )


@pytest.mark.parametrize(
    "root",
    [
        None,
        "",
        "/ckpt/llm",
        "s3://bucket/{run}/{job_id}/{JOB}/{ job }/{}/%j/{job",
        "/ckpt/job}",
    ],
)
def test_a_root_without_the_exact_token_is_recorded_as_given(root: str | None) -> None:
    """Only ``{job}`` is replaced: other braces (``{job_id}``, ``{JOB}``) are left alone."""
    command = _with_root(root)
    assert _created(command).spec == command.spec


def test_a_superseding_job_continues_from_the_old_jobs_concrete_root() -> None:
    """Supersede copies the old record's spec, already concrete: the new job resumes from
    the old job's publications (and outranks them with a higher generation), not from a
    root of its own."""
    old = _apply(None, _created(_with_root("/ckpt/{job}")))
    old = _apply(old, *decide(old, Cancel(by=ALICE), _t(1)))
    created, _ = decide(old, Supersede(by=BOB, new_job_id="llm-7b-2"), _t(2))
    assert isinstance(created, JobCreated)
    assert created.spec.checkpoint == "/ckpt/llm-7b"
    assert created.generation == 1


@given(job_ids, st.lists(st.text(max_size=8), min_size=1, max_size=4))
def test_every_job_token_and_nothing_else_becomes_the_job_id(job_id: str, parts: list[str]) -> None:
    """Property: a root made of pieces joined by ``{job}`` is recorded as the pieces joined
    by the job id (the token has no border, so joining makes no new token)."""
    assume(all(JOB_PLACEHOLDER not in part for part in parts))
    command = _with_root(JOB_PLACEHOLDER.join(parts), job_id)
    created = _created(command)
    assert created.spec.checkpoint == job_id.join(parts)
    assert msgspec.structs.replace(created.spec, checkpoint=command.spec.checkpoint) == (
        command.spec
    )


def test_a_command_for_a_job_without_a_record_is_refused() -> None:
    err = _refused(None, Cancel(by=ALICE), "has no record")
    assert err.command == "cancel"
    with pytest.raises(Refused, match="job 'ghost'"):
        decide(None, Release(by=ALICE), T0, job_id="ghost")


# -- hold and release -------------------------------------------------------------------


def test_hold_places_an_actor_hold_with_its_deadline() -> None:
    job = _launched()
    (placed,) = decide(job, HoldCommand(by=BOB, reason="bad shard", for_s=600.0), _t(2))
    assert placed == HoldPlaced(
        job_id="llm-7b",
        at=_t(2),
        instance=1,
        kind=HoldKind.ACTOR,
        by=BOB,
        reason="bad shard",
        deadline=_t(12),
    )


def test_hold_is_refused_with_a_hold_in_force_an_outcome_or_a_bad_duration() -> None:
    _refused(_actor_held(), HoldCommand(by=BOB), r"hold 1 \(actor, by alice\) is already in force")
    _refused(_failed(), HoldCommand(by=BOB), r"outcome \(failed\) is committed and final")
    _refused(_launched(), HoldCommand(by=BOB, for_s=0.0), "not a positive number of seconds")


def test_release_of_a_recovery_hold_is_refused() -> None:
    """ "for a recovery hold, which a hold rule placed after an execution ended, Release is
    refused. Use Resubmit ..., Cancel, or GiveUp" (seed 002)."""
    err = _refused(_recovery_held(), Release(by=ALICE), "recovery hold")
    assert "use resubmit" in err.reason
    assert "cancel" in err.reason
    assert "give-up" in err.reason


def test_release_of_an_actor_hold_lets_the_job_run_again() -> None:
    """ "for a hold an actor placed, Release(ctx, job, by) lets the job run again" (seed 002)."""
    job = _actor_held(ALICE)
    (released,) = decide(job, Release(by=ALICE, reason="fixed"), _t(3))
    assert released == HoldReleased(
        job_id="llm-7b",
        at=_t(3),
        instance=1,
        by=ALICE,
        how=HoldHow.RELEASE,
        override=False,
        reason="fixed",
    )
    job = _apply(job, released)
    assert job.hold is None
    assert project(job, None, _t(3)).state is State.PENDING


def test_releasing_a_hold_someone_else_placed_notes_the_override() -> None:
    """ "Releasing a hold someone else placed works, and the record notes that you overrode
    it" (seed 002)."""
    (released,) = decide(_actor_held(ALICE), Release(by=BOB), _t(3))
    assert isinstance(released, HoldReleased)
    assert released.override
    assert _apply(_actor_held(ALICE), released).holds[0].override


def test_release_without_a_hold_is_refused() -> None:
    _refused(_launched(), Release(by=ALICE), "no hold is in force")


# -- resubmit ---------------------------------------------------------------------------


def test_resubmit_lifts_a_recovery_hold_and_runs_a_new_submission_without_spending_budget() -> None:
    """ "Use Resubmit(ctx, job, by, reason) to run a new submission" (seed 002)."""
    job = _recovery_held()
    events = decide(job, Resubmit(by=BOB, reason="bigger batch fixed"), _t(20))
    assert events == (
        HoldReleased(
            job_id="llm-7b",
            at=_t(20),
            instance=1,
            by=BOB,
            how=HoldHow.RESUBMIT,
            reason="bigger batch fixed",
        ),
        SubmissionOpened(
            job_id="llm-7b", at=_t(20), submission=2, why=SubmissionWhy.RESUBMIT, cause=OOM, by=BOB
        ),
    )
    job = _apply(job, *events)
    assert job.recoveries == ()
    status = project(job, None, _t(20))
    assert (status.state, status.cause, status.submission) == (State.RECOVERING, OOM, 2)


def test_resubmit_is_refused_without_a_recovery_hold() -> None:
    _refused(_actor_held(), Resubmit(by=ALICE), "actor hold .*release it instead")
    _refused(_launched(), Resubmit(by=ALICE), "no hold is in force")


# -- cancel, give-up, emergency stop ----------------------------------------------------


def test_cancel_commits_the_cancelled_outcome_and_releases_a_hold() -> None:
    job = _actor_held(ALICE)
    events = decide(job, Cancel(by=BOB, reason="wrong data"), _t(4))
    assert [type(e) for e in events] == [CancelRequested, HoldReleased, OutcomeCommitted]
    released, outcome = events[1], events[2]
    assert isinstance(released, HoldReleased)
    assert (released.how, released.override) == ("cancel", True)
    assert isinstance(outcome, OutcomeCommitted)
    assert outcome.state is State.CANCELLED
    assert outcome.cause == Cause(
        kind=CauseKind.CANCELLED,
        provenance=Provenance.ACTOR,
        actor=BOB,
        detail="wrong data",
        at=_t(4),
    )
    job = _apply(job, *events)
    assert (job.outcome, job.cancel_requested_at, job.cancelled_by) == (State.CANCELLED, _t(4), BOB)


def test_cancel_is_refused_once_the_outcome_is_committed() -> None:
    """ "succeeded, failed and cancelled never change once committed" (seed 000)."""
    _refused(_failed(), Cancel(by=ALICE), r"outcome \(failed\) is committed and final")


def test_give_up_fails_the_job_with_the_cause_that_ended_it() -> None:
    """ "GiveUp(ctx, job, by, reason) to fail the job with the cause that ended it" (seed 002);
    "give-up: Someone called GiveUp. It records the decision" (seed 002)."""
    job = _recovery_held()
    events = decide(job, GiveUp(by=ALICE, reason="needs a bigger node"), _t(10))
    assert [type(e) for e in events] == [
        GaveUp,
        HoldReleased,
        OutcomeCommitted,
        EscalationCommitted,
    ]
    outcome, escalation = events[2], events[3]
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.state, outcome.cause) == (State.FAILED, OOM)
    assert isinstance(escalation, EscalationCommitted)
    assert escalation.id == "give-up"
    job = _apply(job, *events)
    status = project(job, None, _t(10))
    assert (status.state, status.cause) == (State.FAILED, OOM)
    assert job.escalation("give-up") is not None


def test_give_up_on_an_actor_hold_fails_with_the_held_cause() -> None:
    events = decide(_actor_held(ALICE), GiveUp(by=ALICE), _t(5))
    outcome = events[2]
    assert isinstance(outcome, OutcomeCommitted)
    assert (outcome.cause.kind, outcome.cause.provenance, outcome.cause.actor) == (
        CauseKind.HELD,
        Provenance.ACTOR,
        ALICE,
    )


def test_give_up_without_a_hold_is_refused() -> None:
    _refused(_launched(), GiveUp(by=ALICE), "only a held job can be given up")


def test_emergency_stop_cancels_a_job_without_an_outcome() -> None:
    events = decide(_launched(), EmergencyStop(by=ALICE, reason="runaway"), _t(3))
    assert [type(e) for e in events] == [EmergencyStopRequested, CancelRequested, OutcomeCommitted]
    after = decide(_failed(), EmergencyStop(by=ALICE, reason="still alive"), _t(40))
    assert [type(e) for e in after] == [EmergencyStopRequested]
    assert _apply(_failed(), *after).outcome is State.FAILED


# -- abandon ----------------------------------------------------------------------------


def _unknown_launch() -> Job:
    j = "llm-7b"
    return _apply(
        _submitted(),
        SubmissionOpened(job_id=j, at=_t(1), submission=1, why=SubmissionWhy.INITIAL),
        LaunchIntended(job_id=j, at=_t(1), submission=1, attempt=1),
        LaunchUnknown(job_id=j, at=_t(1), submission=1, attempt=1, detail="sbatch timed out"),
    )


def test_only_a_human_may_abandon() -> None:
    """ "Only a human actor may abandon" (seed 002)."""
    err = _refused(
        _unknown_launch(), Abandon(by=BOT, target=AbandonTarget(submission=1)), "only a human"
    )
    assert "ci-bot is a service actor" in err.reason


def test_abandon_closes_an_all_unknown_submission() -> None:
    """all-unknown:<N>: "If there's none, close it" (seed 002)."""
    job = _unknown_launch()
    target = AbandonTarget(submission=1)
    (abandoned,) = decide(
        job, Abandon(by=ALICE, reason="no such job in squeue", target=target), _t(11)
    )
    assert abandoned == Abandoned(
        job_id="llm-7b", at=_t(11), target=target, by=ALICE, reason="no such job in squeue"
    )
    job = _apply(job, abandoned)
    assert job.submissions[0].attempts[0].outcome == "abandoned"
    _refused(job, Abandon(by=ALICE, target=target), "not all-unknown")


def test_abandon_closes_an_unmatched_attempt() -> None:
    """unmatched:<N>/<a>: ``AbandonTarget{Submission: 2, Attempt: 1}`` (seed 002)."""
    job = _unknown_launch()
    (abandoned,) = decide(
        job, Abandon(by=ALICE, target=AbandonTarget(submission=1, attempt=1)), _t(11)
    )
    assert isinstance(abandoned, Abandoned)
    _refused(
        _launched(),
        Abandon(by=ALICE, target=AbandonTarget(submission=1, attempt=1)),
        "is launched, not unknown",
    )
    _refused(job, Abandon(by=ALICE, target=AbandonTarget(submission=1, attempt=2)), "never made")
    _refused(job, Abandon(by=ALICE, target=AbandonTarget(submission=3)), "never opened")


def test_abandon_disposes_of_a_foreign_object_once() -> None:
    """foreign:<object id>: "then dispose of it in the record" (seed 002)."""
    foreign = ObjectRef(cluster="c", id="4242")
    target = AbandonTarget(foreign=foreign)
    job = _launched()
    (abandoned,) = decide(
        job, Abandon(by=ALICE, reason="site plugin rewrite", target=target), _t(3)
    )
    job = _apply(job, abandoned)
    assert job.abandoned == (target,)
    _refused(job, Abandon(by=ALICE, target=target), "already abandoned")
    _refused(job, Abandon(by=ALICE, target=AbandonTarget(foreign=REF)), "dispatch's own")
    _refused(
        job,
        Abandon(by=ALICE, target=AbandonTarget(submission=1, foreign=foreign)),
        "not both",
    )
    _refused(job, Abandon(by=ALICE, target=AbandonTarget()), "names nothing")


# -- supersede --------------------------------------------------------------------------


def test_supersede_creates_a_new_job_one_generation_up_and_links_both_records() -> None:
    """ "The new job has the same spec, a new id, and names the old one in Status.Supersedes.
    Its executions get a higher DISPATCH_EPOCH" (seed 002)."""
    old = _failed()
    created, superseded = decide(
        old, Supersede(by=BOB, reason="fixed the data path", new_job_id="llm-7b-2"), _t(50)
    )
    assert isinstance(created, JobCreated)
    assert isinstance(superseded, Superseded)
    assert (created.job_id, created.generation, created.supersedes) == ("llm-7b-2", 1, "llm-7b")
    assert (created.spec, created.policy, created.declarations) == (
        old.spec,
        old.policy,
        old.declarations,
    )
    assert created.plan == old.plan
    assert (superseded.job_id, superseded.new_job) == ("llm-7b", "llm-7b-2")
    new = _apply(None, created)
    old = _apply(old, superseded)
    assert project(new, None, _t(50)).supersedes == "llm-7b"
    assert project(old, None, _t(50)).superseded_by == "llm-7b-2"
    assert project(old, None, _t(50)).state is State.FAILED
    assert new.generation == old.generation + 1


def test_supersede_is_refused_without_an_outcome_or_twice() -> None:
    """ "Running a failed job again is Supersede" (seed 000): only a finished job."""
    _refused(_launched(), Supersede(by=ALICE, new_job_id="x"), "no outcome yet")
    old = _failed()
    old = _apply(old, decide(old, Supersede(by=ALICE, new_job_id="x"), _t(50))[1])
    _refused(old, Supersede(by=ALICE, new_job_id="y"), "already superseded by 'x'")
    _refused(_failed(), Supersede(by=ALICE, new_job_id="llm-7b"), "id of its own")
    _refused(_failed(), Supersede(by=ALICE, new_job_id="Bad Id"), "not a job id")


def test_supersede_is_refused_for_an_option_the_backend_now_refuses() -> None:
    """A job recorded before its options were checked: the new job would keep the spec and
    could only fail at launch. The backend's refusal is given to decide as data."""
    bad = OptionRefused(key="partition", reason="no partition 'gpu-old' on this cluster")
    with pytest.raises(Refused, match=r"spec\.options\.partition is invalid: no partition") as err:
        decide(_failed(), Supersede(by=ALICE, new_job_id="x"), _t(30), refused_option=bad)
    assert "submit a new job with the option fixed" in err.value.reason
    # Only a supersede is refused for it; a finished job without a refusal is superseded.
    assert decide(_failed(), Supersede(by=ALICE, new_job_id="x"), _t(30))
    assert decide(_launched(), Cancel(by=ALICE), _t(30), refused_option=bad)


# -- properties -------------------------------------------------------------------------


@given(records(), commands)
def test_what_decide_commits_is_a_legal_continuation_of_the_record(
    record: Record, command: OperatorCommand
) -> None:
    """decide only commits events fold accepts from the API (which appends them); a
    committed outcome never changes."""
    job = fold(written(record), T0)
    now = job.created_at + timedelta(days=30)
    try:
        events = decide(job, command, now)
    except (Refused, InvalidPolicy):
        return
    own = [e for e in events if e.job_id == job.job_id]
    api = WriterKind.API
    after = fold([(job.seq + 1 + i, e, api) for i, e in enumerate(own)], now, prior=job)
    if job.outcome is not None:
        assert (after.outcome, after.outcome_cause) == (job.outcome, job.outcome_cause)
        assert not any(isinstance(e, OutcomeCommitted) for e in events)
    for e in events:
        if e.job_id != job.job_id:
            assert isinstance(e, JobCreated)
            assert e.supersedes == job.job_id
            fold([(1, e, api)], now)


@pytest.mark.parametrize("holder", ["actor", "recovery"])
def test_give_up_release_and_resubmit_are_refused_once_an_outcome_is_committed(
    holder: str,
) -> None:
    """Seed 000: "succeeded, failed and cancelled never change once committed." A record in
    which an outcome was committed while a hold was still recorded in force (as an earlier
    planner could leave it) must not let give-up commit a second outcome, nor release or
    resubmit run the job again (a regression the planner's random walks found)."""
    held = _actor_held() if holder == "actor" else _recovery_held()
    job = _apply(
        held,
        OutcomeCommitted(
            job_id=held.job_id,
            at=_t(20),
            state=State.CANCELLED,
            cause=Cause(kind=CauseKind.CANCELLED, provenance=Provenance.SCHEDULER),
        ),
    )
    assert job.hold is not None
    assert job.outcome is State.CANCELLED
    for command in (
        GiveUp(by=ALICE, reason="r"),
        Release(by=ALICE, reason="r"),
        Resubmit(by=ALICE, reason="r"),
    ):
        _refused(job, command, "committed and final")

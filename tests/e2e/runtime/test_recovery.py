"""Recovery end to end through a real nats-server on the local backend (issue 3, tests 1-3 and
6): the observer and a supervisor replica run in-process; faults are injected into the local
backend as an operator would."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from dispatch_core import (
    Action,
    CauseKind,
    EscalationCommitted,
    ExecutionEnded,
    GateOpened,
    HoldKind,
    Job,
    LaunchRecorded,
    NodeLossObserved,
    ObjectPhase,
    ObjectRef,
    RecoveryPolicy,
    RecoveryRule,
    Refused,
    Release,
    Resubmit,
    State,
    Status,
    StopRequested,
    decode,
    epoch,
)
from tests.e2e.runtime.conftest import MakeRuntime
from tests.e2e.runtime.harness import ALICE, PRINT_ENV, Runtime, shell, until_flag
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

RESUBMIT_PREEMPTED = RecoveryPolicy(
    rules=(RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),)
)


def _object(job: Job, submission: int) -> ObjectRef:
    for obj in job.objects:
        if obj.submission == submission and not obj.duplicate:
            return obj.ref
    raise AssertionError(f"{job.job_id}: no object of submission {submission}: {job.objects}")


def running(submission: int) -> object:
    def check(status: Status) -> None:
        assert status.state is State.RUNNING, status
        assert status.submission == submission, status

    return check


async def _running_object(rt: Runtime, job_id: str, submission: int) -> tuple[ObjectRef, int]:
    """Wait until submission N of the job runs; return its object and the DISPATCH_EPOCH its
    process printed."""
    status = await rt.wait_status(job_id, running(submission))  # type: ignore[arg-type]
    ref = _object(await rt.job(job_id), submission)
    env = await rt.execution_env(ref)
    assert int(env["DISPATCH_EPOCH"]) == status.epoch
    assert env["DISPATCH_SUBMISSION"] == str(submission)
    return ref, int(env["DISPATCH_EPOCH"])


async def test_resubmit_on_preempted_until_the_budget_is_spent(runtime: Runtime) -> None:
    """Test 1: preempted twice, recovering -> running each time with a higher epoch, then
    succeeds; another job preempted a third time with the budget spent fails
    ``failed:preempted``, escalated."""
    rt = runtime
    await rt.observer()
    await rt.supervisor()
    ok, spent = "pre-ok", "pre-spent"
    for job_id in (ok, spent):
        await rt.submit(job_id, rt.spec(until_flag()), RESUBMIT_PREEMPTED)

    epochs: dict[str, list[int]] = {ok: [], spent: []}
    for submission in (1, 2, 3):
        for job_id in (ok, spent):
            ref, dispatch_epoch = await _running_object(rt, job_id, submission)
            epochs[job_id].append(dispatch_epoch)
            if submission < 3 or job_id == spent:
                await rt.preempt(ref)
    assert epochs[ok] == [epoch(0, 1, 0), epoch(0, 2, 0), epoch(0, 3, 0)]
    assert epochs[spent] == epochs[ok]

    rt.release()

    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status
        assert status.settled, status

    status = await rt.wait_status(ok, succeeded)
    recoveries = [t for t in status.history if t.state is State.RECOVERING]
    assert [t.cause.kind for t in recoveries] == [CauseKind.PREEMPTED] * 2

    def failed(status: Status) -> None:
        assert status.state is State.FAILED, status
        assert status.settled, status

    status = await rt.wait_status(spent, failed)
    assert status.cause.kind is CauseKind.PREEMPTED
    job = await rt.job(spent)
    assert [e.id for e in job.escalations] == ["failed:preempted"]
    assert "budget" in job.escalations[0].detail
    assert len(job.recoveries) == 2
    assert len(job.submissions) == 3


async def test_hold_rule_on_non_zero_exit_release_refused_resubmit_runs_again(
    runtime: Runtime,
) -> None:
    """Test 2: a non-zero exit under a hold rule: held under a recovery hold; release is
    refused; resubmit runs it again."""
    rt = runtime
    await rt.observer()
    await rt.supervisor()
    job_id = "held"
    policy = RecoveryPolicy(
        rules=(RecoveryRule(on=(CauseKind.NON_ZERO_EXIT,), action=Action.HOLD, hold_for_s=3600),)
    )
    script = f'{PRINT_ENV}; [ "$DISPATCH_SUBMISSION" = 1 ] && exit 3; exit 0'
    await rt.submit(job_id, rt.spec(shell(script)), policy)

    def held(status: Status) -> None:
        assert status.state is State.HELD, status
        assert status.hold is not None, status

    status = await rt.wait_status(job_id, held)
    assert status.hold is not None
    assert status.hold.kind is HoldKind.RECOVERY
    assert status.hold.cause is not None
    assert status.hold.cause.kind is CauseKind.NON_ZERO_EXIT
    assert status.hold.cause.exit_code == 3

    with pytest.raises(Refused, match="recovery hold"):
        await rt.command(job_id, Release(by=ALICE, reason="try again"))

    await rt.command(job_id, Resubmit(by=ALICE, reason="fixed the data path"))

    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status
        assert status.settled, status

    status = await rt.wait_status(job_id, succeeded)
    assert status.submission == 2
    job = await rt.job(job_id)
    assert [s.why for s in job.submissions] == ["initial", "resubmit"]
    env = await rt.execution_env(_object(job, 2))
    assert env["DISPATCH_EPOCH"] == str(epoch(0, 2, 0))
    assert not job.escalations


async def test_node_loss_fence_then_replacement_gate_after_the_old_object_ended(
    make_runtime: MakeRuntime,
) -> None:
    """Test 3: an object running with node-lost: inside the window the job runs with cause
    node-lost; past it the object is stopped, the rule applies, and the replacement's gate
    opens only once the old object is seen ended (the old process ignores SIGTERM, so it
    takes the kill wait to die)."""
    window_s, kill_wait_s = 4.0, 3.0
    rt = await make_runtime(node_loss_window_s=window_s, kill_wait_s=kill_wait_s)
    await rt.observer()
    await rt.supervisor()
    job_id = "lost"
    policy = RecoveryPolicy(
        rules=(RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1),)
    )
    # The first execution ignores SIGTERM (it dies of the SIGKILL after the kill wait); the
    # replacement exits 0 once the flag exists.
    command = until_flag(
        "if [ \"$DISPATCH_SUBMISSION\" = 1 ]; then trap '' TERM; while :; do sleep 0.2; done; fi;"
    )
    await rt.submit(job_id, rt.spec(command), policy)
    old, _ = await _running_object(rt, job_id, 1)
    statuses: list[Status] = []

    async def watch() -> None:
        async with rt.statuses.watch((job_id,)) as feed:
            async for entry in feed:
                statuses.append(decode(entry.payload, Status))

    watcher = asyncio.create_task(watch())
    try:
        lost_at = datetime.now(UTC)
        await rt.node_lost(old)

        # Every Status is kept by the watch: the job's latest one may already be past the
        # window's end by the time a poll reads it on a loaded machine.
        def fenced_running_shown() -> None:
            assert any(
                s.state is State.RUNNING and s.cause.kind is CauseKind.NODE_LOST for s in statuses
            ), statuses

        await assert_eventually(fenced_running_shown, timeout_s=30)
        replacement, _ = await _running_object(rt, job_id, 2)
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher

    events = await rt.events(job_id)
    observed = next(e for e in events if isinstance(e, NodeLossObserved))
    assert observed.ref == old
    fenced = next(e for e in events if isinstance(e, ExecutionEnded) and e.ref == old)
    assert fenced.fenced
    assert fenced.cause.kind is CauseKind.NODE_LOST
    assert observed.since is not None  # the window began
    assert (fenced.at - observed.since).total_seconds() >= window_s
    assert observed.since >= lost_at.replace(microsecond=0)
    stop = next(e for e in events if isinstance(e, StopRequested) and e.ref == old)
    assert stop.why == "fence"
    launched = next(e for e in events if isinstance(e, LaunchRecorded) and e.ref == replacement)
    opened = next(e for e in events if isinstance(e, GateOpened) and e.ref == replacement)

    # The old object ended (SIGKILL after the kill wait) after the replacement was made and
    # before its gate opened.
    objects = (await rt.objects())[job_id]
    old_seen = next(o for o in objects if o.ref == old)
    assert old_seen.phase is ObjectPhase.ENDED
    assert old_seen.cause is not None
    assert old_seen.cause.kind is CauseKind.NODE_LOST
    old_ended = await rt.ended_at(old)
    assert launched.at < old_ended < opened.at
    assert (old_ended - stop.at).total_seconds() >= kill_wait_s - 0.5

    rt.release()
    await rt.wait_status(job_id, lambda s: _assert_state(s, State.SUCCEEDED))


def _assert_state(status: Status, state: State) -> None:
    assert status.state is state, status
    assert status.settled, status


async def test_foreign_object_blocks_settlement_and_is_never_stopped(runtime: Runtime) -> None:
    """Test 6: an object named for the job whose submission and attempt can't be read is
    escalated ``foreign:<id>``, blocks settling, and is never stopped."""
    rt = runtime
    await rt.observer()
    await rt.supervisor()
    job_id = "alien"
    await rt.submit(job_id, rt.spec(until_flag()), RecoveryPolicy())
    await _running_object(rt, job_id, 1)
    foreign = await rt.foreign(job_id)

    def escalated(job: Job) -> None:
        assert job.escalation(f"foreign:{foreign.id}") is not None, job.escalations

    await rt.wait_job(job_id, escalated)
    rt.release()

    def succeeded_unsettled(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status
        assert not status.settled, status

    await rt.wait_status(job_id, succeeded_unsettled)
    # Passes keep running (the job's own object ended, the foreign one lives): wait for the
    # record to show the own object's end, then check nothing ever asked to stop the foreign.
    job = await rt.job(job_id)
    assert job.outcome is State.SUCCEEDED
    events = await rt.events(job_id)
    assert not [e for e in events if isinstance(e, StopRequested) and e.ref == foreign]
    assert [e.id for e in events if isinstance(e, EscalationCommitted)] == [f"foreign:{foreign.id}"]
    seen = next(o for o in (await rt.objects())[job_id] if o.ref == foreign)
    assert seen.phase is ObjectPhase.RUNNING
    assert seen.foreign

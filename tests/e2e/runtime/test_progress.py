"""Progress-aware recovery end to end on the local backend (issue 14, part 1): the observer
reads the job's ``pub/`` listing (dispatch_ckpt, POSIX), the supervisor's pass commits the
progress fact, and the budget arithmetic of the core applies; preemption is injected into the
local backend as an operator would."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dispatch_core import (
    Action,
    CauseKind,
    HoldKind,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
)
from tests.e2e.runtime.harness import PRINT_ENV, Runtime, shell, until_flag
from tests.e2e.runtime.test_recovery import _running_object, running
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CKPT = Path(sys.executable).parent / "dispatch-ckpt"


def _publishing() -> tuple[str, ...]:
    """A job that publishes a save of step 10 x its submission, then waits for the flag."""
    return shell(
        f"{PRINT_ENV}; "
        'd="$DISPATCH_CHECKPOINT/exec/$DISPATCH_ATTEMPT/save"; mkdir -p "$d" && '
        f'{CKPT} publish --root "$DISPATCH_CHECKPOINT" --step $((DISPATCH_SUBMISSION * 10)) '
        '"$d" || exit 7; '
        'while [ ! -e "$FLAG" ]; do sleep 0.1; done; exit 0'
    )


async def test_a_preemption_after_publishing_costs_nothing_under_free_if_progress(
    runtime: Runtime, tmp_path: Path
) -> None:
    rt = runtime
    await rt.observer()
    await rt.supervisor()
    root = tmp_path / "ckpt" / "prog-free"
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(
                on=(CauseKind.PREEMPTED,),
                action=Action.RESUBMIT,
                budget=0,
                free_if_progress=True,
            ),
        )
    )
    await rt.submit("prog-free", rt.spec(_publishing(), checkpoint=str(root)), policy)
    ref, _ = await _running_object(rt, "prog-free", 1)

    def published() -> None:
        # ``pub/`` is made by the job's first publish (dispatch_ckpt: an absent ``pub/`` has
        # no entries); the job may not have got that far when it is seen running.
        pub = root / "pub"
        assert pub.is_dir(), "nothing published yet (no pub/)"
        assert any(pub.iterdir()), "nothing published yet"

    await assert_eventually(published, timeout_s=60)
    await rt.preempt(ref)
    await rt.wait_status("prog-free", running(2))  # type: ignore[arg-type]
    job = await rt.job("prog-free")
    assert [r.free for r in job.recoveries] == [True]
    assert job.spent(0) == 0
    assert [(f.step, f.advanced) for f in job.progress] == [(10, True)]

    def shows_step(status: Status) -> None:
        assert status.published_step == 10, status

    await rt.wait_status("prog-free", shows_step)


async def test_three_executions_that_publish_nothing_hold_with_no_progress_3(
    runtime: Runtime, tmp_path: Path
) -> None:
    rt = runtime
    await rt.observer()
    await rt.supervisor()
    root = tmp_path / "ckpt" / "prog-none"
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(
                on=(CauseKind.PREEMPTED,),
                action=Action.RESUBMIT,
                budget=5,
                max_without_progress=3,
            ),
        )
    )
    await rt.submit("prog-none", rt.spec(until_flag(), checkpoint=str(root)), policy)
    for n in (1, 2, 3):
        ref, _ = await _running_object(rt, "prog-none", n)
        await rt.preempt(ref)

    def held(status: Status) -> None:
        assert status.state is State.HELD, status
        assert status.hold is not None
        assert status.hold.kind is HoldKind.RECOVERY

    await rt.wait_status("prog-none", held)
    job = await rt.job("prog-none")
    assert job.escalation("no-progress:3") is not None
    assert [f.without_progress for f in job.progress] == [1, 2, 3]
    assert len(job.submissions) == 3

"""How the CLI shows progress-aware recovery (issue 14, part 1): the plan shows both settings
per rule, the record's progress facts and free recoveries read in a few words, and
``no-progress:<N>`` is answered by resubmit, give-up or cancel."""

from __future__ import annotations

from datetime import UTC, datetime

from dispatch_cli.render import answer_hint, event_line, plan_lines
from dispatch_core import (
    Action,
    Cause,
    CauseKind,
    Declarations,
    JobSpec,
    ObjectRef,
    Provenance,
    RecoveryPolicy,
    RecoveryRule,
    make_plan,
)
from dispatch_core.events import ProgressObserved, RecoveryCommitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
R = '--reason "..."'


def test_the_plan_shows_free_if_progress_and_max_without_progress() -> None:
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(
                on=(CauseKind.PREEMPTED,),
                action=Action.RESUBMIT,
                budget=3,
                free_if_progress=True,
                max_without_progress=4,
            ),
            RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1),
        )
    )
    lines = plan_lines(make_plan(JobSpec(cluster="c"), policy, Declarations(node_loss_window_s=1)))
    assert lines[0] == (
        "  rule 0:     resubmit on preempted (budget 3) (free if progress) "
        "(hold after 4 without progress)"
    )
    assert lines[1] == "  rule 1:     resubmit on node-lost (budget 1)"


def test_progress_facts_and_free_recoveries_read_in_a_few_words() -> None:
    ref = ObjectRef(cluster="c", id="7")
    fact = ProgressObserved(
        job_id="j", at=T0, ref=ref, restart=0, submission=1, step=300, advanced=True, rule=0
    )
    assert "c/7 ended at step 300, advanced" in event_line(5, fact)
    stalled = ProgressObserved(
        job_id="j", at=T0, ref=ref, restart=0, submission=2, rule=0, without_progress=2
    )
    assert "ended at nothing published, 2 without progress" in event_line(6, stalled)
    recovery = RecoveryCommitted(
        job_id="j",
        at=T0,
        rule=0,
        action=Action.RESUBMIT,
        cause=Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER),
        free=True,
    )
    assert "(free: the execution made progress)" in event_line(7, recovery)


def test_no_progress_is_answered_by_resubmit_or_give_up_or_cancel() -> None:
    hint = answer_hint("j", "no-progress:3")
    assert f"dispatch resubmit j {R}" in hint
    assert "give-up" in hint
    assert "cancel" in hint


def test_status_shows_the_latest_published_step_and_when() -> None:
    from dispatch_cli.render import status_detail
    from dispatch_core import Level, State, Status

    status = Status(
        job_id="j",
        level=Level.FULL,
        state=State.RECOVERING,
        cause=Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER),
        at=T0,
        seq=9,
        published_step=300,
        published_at=T0,
    )
    assert "  published   step 300 (as of " in status_detail(status, [])

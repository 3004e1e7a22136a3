"""How the CLI shows a no-capacity wait (docs/core-semantics.md, "No capacity"): the plan
shows each rule's ``wait_s``; the record's no-capacity stop says what the scheduler said."""

from __future__ import annotations

from datetime import UTC, datetime

from dispatch_cli.render import event_line, plan_lines
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
from dispatch_core.events import NoCapacityObserved, StopRequested, StopWhy

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_plan_shows_the_no_capacity_wait() -> None:
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(
                on=(CauseKind.NO_CAPACITY,),
                action=Action.RESUBMIT,
                budget=2,
                clusters=("lab", "local"),
                wait_s=900,
            ),
            RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1),
        )
    )
    lines = plan_lines(
        make_plan(JobSpec(cluster="lab"), policy, Declarations(node_loss_window_s=1))
    )
    assert lines[0] == (
        "  rule 0:     resubmit on no-capacity (budget 2) (fail over: lab -> local) "
        "(no capacity for 15 min: stop and apply)"
    )
    assert lines[1] == "  rule 1:     resubmit on node-lost (budget 1)"


def test_a_no_capacity_stop_reads_with_the_schedulers_words() -> None:
    words = "PENDING (ReqNodeNotAvail, UnavailableNodes:node[1-3])"
    stop = StopRequested(
        job_id="j",
        at=T0,
        ref=ObjectRef(cluster="lab", id="41"),
        why=StopWhy.NO_CAPACITY,
        cause=Cause(kind=CauseKind.NO_CAPACITY, provenance=Provenance.SCHEDULER, detail=words),
    )
    line = event_line(9, stop)
    assert "stop of lab/41: no-capacity (no-capacity:" in line, line
    assert words in line, line


def test_a_wait_beginning_and_ending_reads_in_the_events() -> None:
    words = "PENDING (ReqNodeNotAvail, UnavailableNodes:node[1-3])"
    ref = ObjectRef(cluster="lab", id="41")
    began = NoCapacityObserved(
        job_id="j",
        at=T0,
        ref=ref,
        since=T0,
        cause=Cause(kind=CauseKind.NO_CAPACITY, provenance=Provenance.SCHEDULER, detail=words),
    )
    line = event_line(7, began)
    assert "lab/41 waits for capacity: no-capacity" in line, line
    assert words in line, line
    ended = NoCapacityObserved(job_id="j", at=T0, ref=ref, since=None)
    assert "lab/41 no longer waits for capacity" in event_line(8, ended)

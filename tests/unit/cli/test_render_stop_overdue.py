"""How the CLI shows ``stop-overdue:<object id>`` (issue 15, item 5): the escalation in
``dispatch status JOB`` with the commands that answer it: stop the object on the scheduler
yourself, or emergency-stop the job."""

from __future__ import annotations

from datetime import UTC, datetime

from dispatch_cli.client import EscalationView
from dispatch_cli.render import answer_hint, status_detail
from dispatch_core import Cause, CauseKind, Level, Provenance, State, Status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
R = '--reason "..."'


def test_stop_overdue_is_answered_by_a_stop_on_the_scheduler_or_an_emergency_stop() -> None:
    hint = answer_hint("j", "stop-overdue:17", cluster="slurm-a")
    assert "stop object slurm-a/17 on the scheduler yourself" in hint
    assert f"dispatch emergency-stop j {R}" in hint


def test_status_shows_the_stop_overdue_escalation_and_its_answer() -> None:
    status = Status(
        job_id="j",
        level=Level.FULL,
        state=State.RECOVERING,
        cause=Cause(kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER),
        at=T0,
        seq=12,
        submission=2,
    )
    escalation = EscalationView(
        job_id="j",
        id="stop-overdue:17",
        at=T0,
        detail="object slurm-a/17 (submission 1) was asked to stop (fence) ...",
    )
    detail = status_detail(status, [escalation], cluster="slurm-a")
    assert "stop-overdue:17  [UNDELIVERED]  object slurm-a/17" in detail
    assert "answer: stop object slurm-a/17 on the scheduler yourself" in detail
    assert f"dispatch emergency-stop j {R}" in detail

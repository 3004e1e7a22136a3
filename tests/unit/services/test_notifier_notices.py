"""What people read of a notice: its label, answers they can copy, a link a browser opens."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from dispatch_cli.embedded import terminal_line
from dispatch_core import Actor, ActorKind, Hold, HoldKind
from services.notifier.channels import (
    Notice,
    NoticeKind,
    SlackChannel,
    TerminalChannel,
    WebhookChannel,
)
from services.notifier.config import SlackSpec, TerminalSpec, WebhookSpec
from services.notifier.routing import Severity
from services.notifier.service import _held_detail

AT = datetime(2026, 1, 1, tzinfo=UTC)
LINK = "http://api.test/v1/jobs/j1"
PAGE = "http://api.test/#/job/j1"


def _notice(kind: NoticeKind = "notice", esc_id: str = "held:1") -> Notice:
    return msgspec.structs.replace(
        Notice(
            job_id="j1",
            id=esc_id,
            detail="held",
            at=AT,
            severity=Severity.WARNING,
            link=LINK,
            page=PAGE,
        ),
        kind=kind,
    )


def test_dispatch_up_prints_a_held_notice_as_a_notice_not_an_escalation() -> None:
    terminal = TerminalChannel("terminal", TerminalSpec(), stream=io.StringIO())
    notice = terminal_line(terminal.line(_notice()))
    escalation = terminal_line(terminal.line(_notice("escalation", "failed:preempted")))
    assert notice.startswith("NOTICE ")
    assert "ESCALATION" not in notice
    assert "held:1" in notice
    assert escalation.startswith("ESCALATION ")
    assert "failed:preempted" in escalation
    # a line an older notifier wrote (no label) was an escalation
    assert terminal_line("2026-01-01 [critical] x") == "ESCALATION 2026-01-01 [critical] x"


@pytest.mark.parametrize("kind", list(HoldKind))
def test_every_answer_a_held_notice_prints_carries_a_reason(kind: HoldKind) -> None:
    hold = Hold(
        instance=1,
        kind=kind,
        by=Actor(name="bob", kind=ActorKind.HUMAN),
        reason="checking",
        placed_at=AT,
        deadline=AT + timedelta(hours=1),
    )
    for program in ("dispatch", ".venv/bin/dispatch"):  # NOTIFIER_ANSWER_COMMAND
        detail = _held_detail("j1", hold, program)
        answer = detail.split("Answer: ", 1)[1]
        commands = [
            c for c in ("release", "resubmit", "cancel", "give-up") if f"{program} {c} " in answer
        ]
        assert commands
        for command in commands:
            assert f'{program} {command} j1 --reason "..."' in answer, answer
        assert answer.count(program) == len(commands), answer


def test_people_get_the_web_page_and_the_webhook_keeps_the_api_url() -> None:
    notice = _notice("escalation", "failed:preempted")
    terminal = TerminalChannel("terminal", TerminalSpec(), stream=io.StringIO())
    assert f"({PAGE})" in terminal.line(notice)
    assert LINK not in terminal.line(notice)
    slack = SlackChannel("slack", SlackSpec(url="http://slack.test/x"), session=None)  # type: ignore[arg-type]
    assert PAGE in str(slack.payload(notice))
    webhook = WebhookChannel("webhook", WebhookSpec(url="http://hook.test/x"), session=None)  # type: ignore[arg-type]
    body = msgspec.json.decode(webhook.body(notice))
    assert body["link"] == LINK  # documented: the JSON API URL, for programs
    assert body["page"] == PAGE

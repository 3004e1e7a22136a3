"""The web page's escalation adapter (services/api/web/escalations.py): each prefix of seed
002 has the core table's meaning, severity and answers; abandon names its target; the
notifier's ``held:<i>`` notice has the answers of ``overdue:``."""

from __future__ import annotations

import pytest

from dispatch_core import HoldKind, State, escalation_info, hold_answers, job_commands
from services.api.schemas import COMMAND_REQUESTS
from services.api.web.escalations import describe


@pytest.mark.parametrize(
    ("esc_id", "kind", "answers"),
    [
        ("overdue:2", "overdue", ("release", "resubmit", "cancel", "give-up")),
        ("held:1", "held", ("release", "resubmit", "cancel", "give-up")),
        ("all-unknown:2", "all-unknown", ("abandon",)),
        ("unmatched:2/1", "unmatched", ("abandon",)),
        ("foreign:77", "foreign", ("abandon",)),
        ("admin-held:77", "admin-held", ("cancel",)),
        ("failed:preempted", "failed", ("supersede",)),
        ("refused:3", "refused", ("supersede",)),
        ("cleanup-deadline", "cleanup-deadline", ("emergency-stop",)),
        ("stop-overdue:77", "stop-overdue", ("emergency-stop",)),
        ("give-up", "give-up", ()),
    ],
)
def test_each_prefix_has_a_meaning_and_its_answers(
    esc_id: str, kind: str, answers: tuple[str, ...]
) -> None:
    info = describe(esc_id, cluster="local", job_id="j-1")
    assert (info.kind, info.answers) == (kind, answers)
    assert info.meaning
    assert "<job>" not in info.advice
    assert set(info.answers) <= set(COMMAND_REQUESTS)
    core = escalation_info(esc_id)
    if core is not None:  # the core's words, not a copy
        assert (info.meaning, info.severity) == (core.meaning, core.severity.value)


def test_abandon_names_the_target_the_id_names() -> None:
    assert describe("all-unknown:2").abandon_target == {"submission": 2}
    assert describe("unmatched:2/1").abandon_target == {"submission": 2, "attempt": 1}
    assert describe("foreign:a/b", cluster="k8s").abandon_target == {
        "foreign": {"cluster": "k8s", "id": "a/b"}
    }
    assert describe("failed:preempted").abandon_target is None


def test_an_unknown_prefix_is_listed_without_answers() -> None:
    info = describe("martian:1")
    assert (info.kind, info.arg, info.answers, info.severity) == ("martian", "1", (), "warning")
    bad = describe("overdue:x")  # a known prefix, an argument of no shape seed 002 gives
    assert (bad.kind, bad.answers) == ("overdue", ())
    assert "overdue:<instance>" in bad.meaning


@pytest.mark.parametrize(
    ("esc_id", "hold", "answers"),
    [
        ("held:1", HoldKind.RECOVERY, ("resubmit", "cancel", "give-up")),
        ("held:1", HoldKind.ACTOR, ("release",)),
        ("overdue:1", HoldKind.RECOVERY, ("resubmit", "cancel", "give-up")),
        ("overdue:1", HoldKind.ACTOR, ("release",)),
    ],
)
def test_a_holds_answers_are_those_of_its_kind(
    esc_id: str, hold: HoldKind, answers: tuple[str, ...]
) -> None:
    assert describe(esc_id, hold_kind=hold).answers == answers == hold_answers(hold)


@pytest.mark.parametrize(
    ("state", "settled", "hold", "opened", "commands"),
    [
        (State.SUCCEEDED, True, None, (), ("supersede",)),
        (State.FAILED, True, None, ("failed:non-zero-exit",), ("supersede",)),
        (State.CANCELLED, False, None, ("cleanup-deadline",), ("supersede", "emergency-stop")),
        (State.HELD, False, HoldKind.RECOVERY, ("held:1",), ("resubmit", "cancel", "give-up")),
        (State.HELD, False, HoldKind.ACTOR, (), ("release",)),
        (State.RUNNING, False, None, (), ("hold", "cancel", "emergency-stop")),
        (
            State.PENDING,
            False,
            None,
            ("all-unknown:1",),
            ("hold", "cancel", "emergency-stop", "abandon"),
        ),
        (
            State.RUNNING,
            False,
            None,
            ("foreign:x",),
            ("hold", "cancel", "emergency-stop", "abandon"),
        ),
        (
            State.RECOVERING,
            False,
            None,
            ("unmatched:1/2",),
            ("hold", "cancel", "emergency-stop", "abandon"),
        ),
    ],
)
def test_job_commands_are_those_that_can_apply_now(
    state: State,
    settled: bool,
    hold: HoldKind | None,
    opened: tuple[str, ...],
    commands: tuple[str, ...],
) -> None:
    assert job_commands(state, settled=settled, hold=hold, open_escalations=opened) == commands

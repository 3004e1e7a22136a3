"""The web page's escalation adapter (services/api/web/escalations.py): each prefix of seed
002 has the core table's meaning, severity and answers; abandon names its target; the
notifier's ``held:<i>`` notice has the answers of ``overdue:``."""

from __future__ import annotations

import pytest

from dispatch_core import escalation_info
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

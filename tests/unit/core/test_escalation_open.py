"""``escalation_open``: the one rule (seed 002) the CLI's ``dispatch escalations`` and the web
page's inbox use to say whether an escalation still waits for a person."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from dispatch_core import (
    AbandonTarget,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    HoldKind,
    HoldView,
    Level,
    ObjectRef,
    Provenance,
    State,
    Status,
    escalation_open,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNNING = Status(
    job_id="j",
    level=Level.FULL,
    state=State.RUNNING,
    cause=Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER),
    at=T0,
    submission=2,
)
SETTLED = msgspec.structs.replace(RUNNING, state=State.SUCCEEDED, settled=True)
FAILED = msgspec.structs.replace(RUNNING, state=State.FAILED, settled=True)
SUPERSEDED = msgspec.structs.replace(FAILED, superseded_by="j2")


def _held(instance: int) -> Status:
    hold = HoldView(
        instance=instance,
        kind=HoldKind.RECOVERY,
        by=Actor(name="supervisor", kind=ActorKind.SERVICE),
        reason="r",
        since=T0,
        deadline=T0,
        overdue=True,
    )
    return msgspec.structs.replace(RUNNING, state=State.HELD, hold=hold)


@pytest.mark.parametrize("delivered", [True, False])
def test_a_failure_is_open_until_superseded_delivered_or_not(delivered: bool) -> None:
    for esc in ("failed:non-zero-exit", "refused:1"):
        assert escalation_open(esc, delivered=delivered, job=FAILED)
        assert not escalation_open(esc, delivered=delivered, job=SUPERSEDED)


def test_overdue_is_open_while_its_hold_is_in_force() -> None:
    assert escalation_open("overdue:2", delivered=True, job=_held(2))
    assert not escalation_open("overdue:1", delivered=True, job=_held(2)), "an older hold"
    assert not escalation_open("overdue:2", delivered=True, job=RUNNING), "released"
    assert not escalation_open("overdue:2", delivered=False, job=RUNNING), "answered"


def test_an_unknown_launch_is_answered_by_its_abandon_or_a_later_submission() -> None:
    assert escalation_open("all-unknown:2", delivered=True, job=RUNNING)
    assert not escalation_open("all-unknown:1", delivered=True, job=RUNNING), "moved past it"
    assert not escalation_open(
        "all-unknown:2", delivered=True, job=RUNNING, abandoned=(AbandonTarget(submission=2),)
    )
    assert escalation_open("unmatched:2/1", delivered=True, job=RUNNING)
    assert escalation_open(
        "unmatched:2/1",
        delivered=True,
        job=RUNNING,
        abandoned=(AbandonTarget(submission=2, attempt=2),),
    )
    assert not escalation_open(
        "unmatched:2/1",
        delivered=True,
        job=RUNNING,
        abandoned=(AbandonTarget(submission=2, attempt=1),),
    )


def test_a_foreign_object_is_answered_by_abandoning_that_object() -> None:
    assert escalation_open("foreign:77", delivered=True, job=RUNNING)
    gone = (AbandonTarget(foreign=ObjectRef(cluster="local", id="77")),)
    assert not escalation_open("foreign:77", delivered=False, job=RUNNING, abandoned=gone)
    other = (AbandonTarget(foreign=ObjectRef(cluster="local", id="78")),)
    assert escalation_open("foreign:77", delivered=True, job=RUNNING, abandoned=other)


@pytest.mark.parametrize("esc", ["admin-held:7", "cleanup-deadline", "stop-overdue:7", "martian:1"])
def test_the_rest_is_open_while_undelivered_or_the_job_can_still_act(esc: str) -> None:
    assert escalation_open(esc, delivered=True, job=RUNNING)
    assert escalation_open(esc, delivered=False, job=SETTLED), "nobody was told yet"
    assert not escalation_open(esc, delivered=True, job=SETTLED)


def test_give_up_asks_nothing_and_is_open_only_until_delivered() -> None:
    assert escalation_open("give-up", delivered=False, job=FAILED)
    assert not escalation_open("give-up", delivered=True, job=FAILED)
    assert not escalation_open("give-up", delivered=True, job=RUNNING)


def test_a_job_whose_status_is_unknown_keeps_its_escalations_open() -> None:
    assert escalation_open("foreign:77", delivered=True, job=None)
    assert escalation_open("failed:preempted", delivered=True, job=None)

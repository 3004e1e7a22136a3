"""Held notices (issue 15, item 6: "Tell the on-call when a job waits for them"): with
``held_notices`` the notifier sends ``held:<instance>`` to the channels routed for it as soon
as a hold is placed (a recovery hold or a person's), through a real webhook receiver, and
records nothing: it is not an escalation.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch_core import (
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    HoldHow,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    Provenance,
)
from dispatch_nats import RecordStore
from tests.integration.notifier.conftest import StartNotifier
from tests.integration.notifier.support import (
    Receiver,
    append,
    create_job,
    escalate,
    new_job_id,
    read_job,
    undelivered,
)
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

BOB = Actor(name="bob", kind=ActorKind.HUMAN)
SUPERVISOR = Actor(name="dispatch-supervisor", kind=ActorKind.SERVICE)
OOM = Cause(
    kind=CauseKind.OUT_OF_MEMORY,
    provenance=Provenance.SCHEDULER,
    detail="OUT_OF_MEMORY 0:125",
)


def _hold(job_id: str, instance: int, kind: HoldKind) -> HoldPlaced:
    now = datetime.now(UTC)
    recovery = kind is HoldKind.RECOVERY
    return HoldPlaced(
        job_id=job_id,
        at=now,
        instance=instance,
        kind=kind,
        by=SUPERVISOR if recovery else BOB,
        reason="rule 0 holds out-of-memory" if recovery else "checking the data",
        deadline=now + timedelta(hours=24),
        cause=OOM if recovery else None,
        rule=None,
    )


async def test_a_recovery_hold_is_sent_at_once_as_a_notice_and_nothing_is_recorded(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    await start_notifier(webhook_url=receiver.url("/hook"), held_notices=True)
    job = new_job_id()
    await create_job(store, job)
    seq_before = (await read_job(store, job)).seq
    await append(store, _hold(job, 1, HoldKind.RECOVERY))

    def notified() -> None:
        assert receiver.accepted_ids("/hook") == {"held:1": 1}, receiver.requests

    await assert_eventually(notified)
    [req] = receiver.accepted("/hook")
    assert req.headers["Idempotency-Key"] == f"{job}:held:1"
    body = req.json
    assert (body["job"], body["id"], body["kind"]) == (job, "held:1", "notice")
    assert body["severity"] == "warning"
    assert "out-of-memory" in body["detail"]
    assert "OUT_OF_MEMORY 0:125" in body["detail"]
    assert f"dispatch resubmit {job}" in body["detail"]
    job_now = await read_job(store, job)
    assert job_now.escalations == ()  # a notice, not an escalation
    assert job_now.seq == seq_before + 1  # only the hold: nothing recorded by the notifier


async def test_a_persons_hold_is_routed_by_its_id_and_retried_until_accepted(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    """Routes name ``held:*`` like an escalation id; a channel that fails first gets it
    again (same idempotency key) until it accepts."""
    receiver.fail_first = 1
    await start_notifier(
        webhook_url=receiver.url("/all"),
        slack_url=receiver.url("/oncall"),
        routes=["held:*=slack", "*=webhook"],
        held_notices=True,
    )
    job = new_job_id()
    await create_job(store, job)
    await append(store, _hold(job, 1, HoldKind.ACTOR))
    await escalate(store, job, "overdue:1")

    def both() -> None:
        assert [r.esc_id for r in receiver.accepted("/oncall")] == ["held:1"]
        assert [r.esc_id for r in receiver.accepted("/all")] == ["overdue:1"]

    await assert_eventually(both)
    attempts = receiver.on("/oncall")
    assert len(attempts) == 2, attempts  # refused once, then accepted
    assert {r.headers["Idempotency-Key"] for r in attempts} == {f"{job}:held:1"}
    text = receiver.accepted("/oncall")[0].json["text"]
    assert "held by bob: checking the data" in text
    assert f"dispatch release {job}" in text
    assert undelivered(await read_job(store, job)) == []


async def test_without_held_notices_a_hold_sends_nothing(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    """Off by default (``dispatch up`` turns it on): only escalations are sent."""
    await start_notifier(webhook_url=receiver.url("/hook"))
    job = new_job_id()
    await create_job(store, job)
    await append(store, _hold(job, 1, HoldKind.RECOVERY))
    await escalate(store, job, "give-up")

    def given_up() -> None:
        assert receiver.accepted_ids("/hook") == {"give-up": 1}, receiver.requests

    await assert_eventually(given_up)
    assert [r.esc_id for r in receiver.requests] == ["give-up"]


async def test_a_hold_no_longer_in_force_when_the_notifier_gets_to_it_is_not_notified(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    """A notifier catching up (a new consumer starts at the stream's first event) tells
    nobody of a hold already released: the job no longer waits."""
    job = new_job_id()
    await create_job(store, job)
    await append(store, _hold(job, 1, HoldKind.ACTOR))
    await append(
        store,
        HoldReleased(job_id=job, at=datetime.now(UTC), instance=1, by=BOB, how=HoldHow.RELEASE),
    )
    await append(store, _hold(job, 2, HoldKind.ACTOR))
    await start_notifier(webhook_url=receiver.url("/hook"), held_notices=True)

    def second_only() -> None:
        assert receiver.accepted_ids("/hook") == {"held:2": 1}, receiver.requests

    await assert_eventually(second_only)
    assert [r.esc_id for r in receiver.requests] == ["held:2"]

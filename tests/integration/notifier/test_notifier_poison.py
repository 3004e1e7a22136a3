"""Poison contained (issue 10, item 4) in the notifier: an escalation of a job whose record
can't be read (an undecodable event, or one its writer may not write) is left alone
(terminated once, counted, logged at ERROR with the job and seq); every other job's
escalations are delivered as ever."""

from __future__ import annotations

import logging

import pytest
from nats.aio.client import Client as NATS

from dispatch_core import Actor, ActorKind, CancelRequested, WriterKind, encode
from dispatch_nats import Layout, RecordStore
from tests.integration.notifier.conftest import StartNotifier
from tests.integration.notifier.support import (
    Receiver,
    create_job,
    escalate,
    new_job_id,
    read_job,
    undelivered,
)
from tests.util import assert_eventually

pytestmark = pytest.mark.integration


async def _poison(nc: NATS, layout: Layout, job_id: str, how: str) -> int:
    if how == "undecodable":
        subject = layout.record_subject(job_id, WriterKind.SUPERVISOR)
        return (await nc.jetstream().publish(subject, b"\xff not json")).seq
    notifier = RecordStore(nc, writer=WriterKind.NOTIFIER, layout=layout)
    try:
        forged = CancelRequested(
            job_id=job_id,
            at=(await read_job(notifier, job_id)).created_at,
            by=Actor(name="alice", kind=ActorKind.HUMAN),
            reason="forged",
        )
        last = await notifier.last_seq(job_id)
        return await notifier.append(job_id, encode(forged), expected_last_seq=last, msg_id="f")
    finally:
        await notifier.aclose()


@pytest.mark.parametrize("how", ["undecodable", "refused-writer"])
async def test_an_unreadable_jobs_escalation_is_left_alone_and_others_delivered(
    nc: NATS,
    layout: Layout,
    store: RecordStore,
    receiver: Receiver,
    start_notifier: StartNotifier,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    caplog.set_level(logging.ERROR, logger="dispatch.notifier")
    bad, good = new_job_id(), new_job_id()
    await create_job(store, bad)
    seq = await _poison(nc, layout, bad, how)
    await escalate(store, bad, "give-up")
    notifier = await start_notifier(webhook_url=receiver.url("/hook"))
    await create_job(store, good)
    await escalate(store, good, "give-up")

    async def good_delivered() -> None:
        assert undelivered(await read_job(store, good)) == []

    await assert_eventually(good_delivered, timeout_s=30)

    def left_alone() -> None:
        assert notifier.metric("dispatch_notifier_errors_total", kind="unreadable-record") == 1
        [line] = [r for r in caplog.records if r.getMessage() == "record.unreadable"]
        assert line.levelno == logging.ERROR
        assert (getattr(line, "job_id", None), getattr(line, "record_seq", None)) == (bad, seq)

    await assert_eventually(left_alone, timeout_s=30)
    assert [r.json["job"] for r in receiver.requests] == [good]
    assert not notifier.task.done()
    # Terminated, not redelivered: another good escalation goes through, and the bad one's
    # message is not handled again meanwhile.
    await escalate(store, good, "overdue:1")
    await assert_eventually(good_delivered, timeout_s=30)
    assert notifier.metric("dispatch_notifier_errors_total", kind="unreadable-record") == 1

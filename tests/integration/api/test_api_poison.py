"""Poison contained (issue 10, item 4): a record holding an event that can't be read (it does
not decode, or the kind of writer that appended it may not write it) makes that job's reads
answer 422 ``record-unreadable`` naming the job and the seq; every other job, and the
listings, still answer (the listings name the job apart, under ``unreadable``)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from nats.aio.client import Client as NATS

from dispatch_cli.errors import EXIT_OK, EXIT_UNREADABLE, ApiError
from dispatch_cli.main import main
from dispatch_core import (
    Actor,
    ActorKind,
    CancelRequested,
    EscalationCommitted,
    State,
    WriterKind,
    encode,
)
from dispatch_nats import RecordStore
from dispatch_sdk import Client
from tests.integration.api.support import HUMAN_TOKEN, Api, now
from tests.integration.api.test_api_stream import next_event, status, stream

pytestmark = pytest.mark.integration


async def _poison(api: Api, nc: NATS, job_id: str, how: str) -> int:
    """Make the job's record unreadable; return the seq of the event at fault."""
    if how == "undecodable":
        # A privileged raw connection publishes what no build of dispatch wrote.
        subject = api.layout.record_subject(job_id, WriterKind.SUPERVISOR)
        ack = await nc.jetstream().publish(subject, b'{"type": "cancel.requested", "job_id": 7}')
        return ack.seq
    if how == "no-writer-kind":
        # The stream takes dispatch.record.*.*: a raw publish may name no writer kind at all.
        event = EscalationCommitted(job_id=job_id, at=now(), id="overdue:9", detail="x")
        subject = f"{api.layout.root}.record.{job_id}.observer"
        return (await nc.jetstream().publish(subject, encode(event))).seq
    notifier = RecordStore(nc, writer=WriterKind.NOTIFIER, layout=api.layout)
    try:
        forged = CancelRequested(
            job_id=job_id,
            at=now(),
            by=Actor(name="alice", kind=ActorKind.HUMAN),
            reason="forged by a notifier",
        )
        last = await notifier.last_seq(job_id)
        return await notifier.append(
            job_id, encode(forged), expected_last_seq=last, msg_id=f"forged-{job_id}"
        )
    finally:
        await notifier.aclose()


def _names(reply_error: dict[str, object], job_id: str, seq: int) -> None:
    assert reply_error["code"] == "record-unreadable"
    assert reply_error["job_id"] == job_id
    assert reply_error["seq"] == seq
    assert f"record of job {job_id!r}, event seq {seq}" in str(reply_error["message"])


@pytest.mark.parametrize("how", ["undecodable", "refused-writer", "no-writer-kind"])
async def test_an_unreadable_record_is_that_jobs_problem_only(api: Api, nc: NATS, how: str) -> None:
    bad = (await api.submit(job_id="bad"))["job_id"]
    good = (await api.submit(job_id="good"))["job_id"]
    for job_id in (bad, good):
        await api.append(
            job_id, EscalationCommitted(job_id=job_id, at=now(), id="give-up", detail="x")
        )
    # Read once, so the API's cache holds both folds: the poison comes after them.
    assert (await api.call("GET", "/v1/escalations")).status == 200
    seq = await _poison(api, nc, bad, how)

    listing = await api.call("GET", "/v1/escalations")
    assert listing.status == 200, listing.text
    assert [(e["job_id"], e["id"]) for e in listing.body["escalations"]] == [(good, "give-up")]
    [unreadable] = listing.body["unreadable"]
    assert (unreadable["job_id"], unreadable["seq"]) == (bad, seq)
    assert f"event seq {seq}" in unreadable["message"]

    jobs = await api.call("GET", "/v1/jobs")
    assert jobs.status == 200, jobs.text
    assert [j["job_id"] for j in jobs.body["jobs"]] == [good]
    assert [(u["job_id"], u["seq"]) for u in jobs.body["unreadable"]] == [(bad, seq)]

    # Every other job answers as before.
    assert (await api.call("GET", f"/v1/jobs/{good}")).status == 200
    assert (await api.call("GET", f"/v1/jobs/{good}/record")).status == 200
    assert (await api.command(good, "hold")).status == 200

    # That job's own reads and commands name it and the seq.
    for reply in (
        await api.call("GET", f"/v1/jobs/{bad}"),
        await api.call("GET", f"/v1/jobs/{bad}/record"),
        await api.call("GET", f"/v1/escalations?job={bad}"),
        await api.command(bad, "cancel"),
    ):
        assert reply.status == 422, reply.text
        _names(reply.error, bad, seq)
    # Its status stream says so, as an event, and ends.
    async with stream(api, bad) as (response, source):
        assert response.status == 200
        error = await next_event(source)
        assert error.event == "error"
        _names(json.loads(error.data)["error"], bad, seq)
    # The part of its record after the event still reads.
    before = await api.call("GET", f"/v1/jobs/{bad}/record?after={seq}")
    assert before.status == 200, before.text
    assert before.body["events"] == []


async def test_a_poisoned_job_that_had_a_status_is_marked_and_the_cli_says_so(
    api: Api, nc: NATS, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the supervisor's Statuses published (it then leaves a poisoned job alone, so
    that job's Status goes stale): the listing keeps the job's row marked ``unreadable``
    and names the event apart; its status stream says so at once, even though a Status is
    there to send; and the CLI (`dispatch watch`, `dispatch status`, `dispatch
    escalations`) says so and ends at once with exit 9, instead of retrying."""
    bad = (await api.submit(job_id="stale"))["job_id"]
    good = (await api.submit(job_id="fine"))["job_id"]
    for job_id in (bad, good):
        await api.publish(status(job_id, State.RUNNING, await api.records.last_seq(job_id)))
    seq = await _poison(api, nc, bad, "undecodable")

    jobs = await api.call("GET", "/v1/jobs")
    assert jobs.status == 200, jobs.text
    rows = {j["job_id"]: j for j in jobs.body["jobs"]}
    assert (rows[bad]["state"], rows[bad]["unreadable"]) == ("running", True)
    assert rows[good]["unreadable"] is False
    assert [(u["job_id"], u["seq"]) for u in jobs.body["unreadable"]] == [(bad, seq)]
    running = await api.call("GET", "/v1/jobs?state=running")
    assert {j["job_id"]: j["unreadable"] for j in running.body["jobs"]} == {
        bad: True,
        good: False,
    }

    async with stream(api, bad) as (response, source):
        assert response.status == 200
        error = await next_event(source)
        assert error.event == "error"
        _names(json.loads(error.data)["error"], bad, seq)
    async with stream(api, good) as (response, source):  # the other job streams as ever
        assert (await next_event(source)).event == "status"

    # The CLI is synchronous: it runs in a thread while this loop serves the API.
    def cli(*args: str) -> int:
        return main([*args, "--api", api.url, "--token", HUMAN_TOKEN])

    started = time.monotonic()
    assert await asyncio.to_thread(cli, "watch", bad) == EXIT_UNREADABLE
    assert time.monotonic() - started < 30  # at once, not after 120 s of resuming
    err = capsys.readouterr().err
    assert "stream lost" not in err
    assert f"record of job {bad!r}, event seq {seq}" in err
    assert "422 record-unreadable" in err

    assert await asyncio.to_thread(cli, "status") == EXIT_OK
    table = capsys.readouterr().out
    [bad_row] = [line.split() for line in table.splitlines() if line.startswith(f"{bad} ")]
    assert bad_row[1:3] == ["unreadable", "record"]
    [good_row] = [line.split() for line in table.splitlines() if line.startswith(f"{good} ")]
    assert good_row[1] == "running"
    assert f"unreadable: {bad}: event seq {seq}: " in table

    assert await asyncio.to_thread(cli, "status", bad) == EXIT_UNREADABLE
    assert f"event seq {seq}" in capsys.readouterr().err
    assert await asyncio.to_thread(cli, "escalations", "--all") == EXIT_OK
    assert f"unreadable: {bad}: event seq {seq}: " in capsys.readouterr().out

    # The SDK's watch too: it raises at once (it used to resume the ended stream for ever).
    def sdk_watch() -> None:
        for _ in Client(api.url, HUMAN_TOKEN).watch(bad):
            pass

    with pytest.raises(ApiError) as caught:
        await asyncio.to_thread(sdk_watch)
    assert (caught.value.status, caught.value.code) == (422, "record-unreadable")

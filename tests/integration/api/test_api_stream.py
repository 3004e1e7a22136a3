"""``GET /v1/jobs/{job}/stream``: server-sent events of a job's Status, each change in order
(published with ``LatestStore`` as the supervisor does), heartbeats, resume by
``Last-Event-ID``, and a clean end when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
import pytest
from nats.aio.client import Client as NATS

from dispatch_core import Cause, CauseKind, Level, Provenance, State, Status, encode
from tests.integration.api.support import HUMAN_TOKEN, Api, now
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

NONE = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
STATES = [State.PENDING, State.RUNNING, State.RECOVERING, State.HELD, State.RUNNING]


@dataclass
class Message:
    """One SSE message: an event (with its id and data) or a comment."""

    event: str | None
    id: str | None
    data: str
    comment: str | None = None

    @property
    def status(self) -> Status:
        """The Status the event carries."""
        assert self.event == "status", self
        return msgspec.json.decode(self.data, type=Status)


async def messages(response: aiohttp.ClientResponse) -> AsyncIterator[Message]:
    """Parse the SSE stream of ``response`` into messages."""
    fields: dict[str, str] = {}
    comment: str | None = None
    while True:
        raw = await response.content.readline()
        if not raw:
            return
        line = raw.decode().rstrip("\n")
        if line == "":
            if fields or comment is not None:
                yield Message(
                    fields.get("event"), fields.get("id"), fields.get("data", ""), comment
                )
            fields, comment = {}, None
        elif line.startswith(":"):
            comment = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


@contextlib.asynccontextmanager
async def stream(
    api: Api, job_id: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[aiohttp.ClientResponse, AsyncIterator[Message]]]:
    """Open the job's SSE stream."""
    sent = {"Authorization": f"Bearer {HUMAN_TOKEN}", **(headers or {})}
    async with api.session.get(f"{api.url}/v1/jobs/{job_id}/stream", headers=sent) as response:
        yield response, messages(response)


async def next_event(source: AsyncIterator[Message], timeout_s: float = 10.0) -> Message:
    """The next event (skipping comments)."""
    async with asyncio.timeout(timeout_s):
        async for message in source:
            if message.event is not None:
                return message
    raise AssertionError("the stream ended")


def status(job_id: str, state: State, seq: int) -> Status:
    """A Status as the supervisor publishes it."""
    return Status(job_id=job_id, level=Level.FULL, state=state, cause=NONE, at=now(), seq=seq)


async def test_every_status_change_arrives_in_order(api: Api) -> None:
    """Statuses published one pass after another (as the supervisor's passes of one job
    follow each other) each arrive, in order, with their stream seq as the event id."""
    job_id = (await api.submit())["job_id"]
    async with stream(api, job_id) as (response, source):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first = await next_event(source)
        assert first.id is None  # nothing published yet: the API's own projection
        assert first.status.state is State.PENDING
        assert first.status.seq == 1

        last = 0
        for i in range(40):
            published = status(job_id, STATES[i % len(STATES)], seq=i + 1)
            # With OCC on the subject, as the supervisor publishes.
            last = await api.statuses.put((job_id,), encode(published), expected_last_seq=last)
            message = await next_event(source)
            assert message.status == published
            assert message.id == str(last)
    assert api.metric("dispatch_api_sse_events_total") == 41


async def test_a_burst_arrives_in_order_and_ends_with_the_latest(api: Api) -> None:
    """The status stream keeps one Status per job: a Status replaced before the server
    delivered it is skipped (measured on nats-server 2.15 with back-to-back puts). What the
    stream sends is still in publication order, never an older Status after a newer one,
    and always ends with the latest."""
    job_id = (await api.submit())["job_id"]
    await api.publish(status(job_id, State.PENDING, seq=1))
    async with stream(api, job_id) as (_, source):
        assert (await next_event(source)).status.seq == 1
        published = [status(job_id, STATES[i % len(STATES)], seq=i + 2) for i in range(40)]
        ids = [await api.publish(s) for s in published]
        received: list[Message] = []
        while not received or received[-1].status != published[-1]:
            received.append(await next_event(source))
    seqs = [m.status.seq for m in received]
    assert seqs == sorted(set(seqs))
    assert [int(m.id or 0) for m in received] == sorted(int(m.id or 0) for m in received)
    for m in received:
        assert m.status == published[m.status.seq - 2]
        assert int(m.id or 0) == ids[m.status.seq - 2]


async def test_a_published_status_comes_first_and_heartbeats_keep_it_open(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    current = status(job_id, State.RUNNING, seq=1)
    seq = await api.publish(current)
    async with stream(api, job_id) as (_, source):
        first = await next_event(source)
        assert first.status == current
        assert first.id == str(seq)
        async with asyncio.timeout(10):
            async for message in source:
                if message.comment == "heartbeat":
                    break
                raise AssertionError(f"expected a heartbeat, got {message}")


async def test_last_event_id_skips_what_the_client_has(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    await api.publish(status(job_id, State.PENDING, seq=1))
    seen = await api.publish(status(job_id, State.RUNNING, seq=2))
    async with stream(api, job_id, {"Last-Event-ID": str(seen)}) as (_, source):
        later = status(job_id, State.RECOVERING, seq=3)
        later_seq = await api.publish(later)
        message = await next_event(source)
        assert message.status == later
        assert message.id == str(later_seq)


async def test_the_stream_ends_cleanly_when_the_client_goes_away(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    async with stream(api, job_id) as (_, source):
        await next_event(source)
        assert api.metric("dispatch_api_sse_streams") == 1

    def closed() -> None:
        assert api.metric("dispatch_api_sse_streams") == 0

    await assert_eventually(closed)
    route = {"route": "/v1/jobs/{job}/stream", "method": "GET", "status": "200"}

    def counted() -> None:
        assert api.metric("dispatch_api_requests_total", route) == 1

    await assert_eventually(counted)
    # The API still serves: the stream's end was clean.
    assert (await api.call("GET", f"/v1/jobs/{job_id}")).status == 200


async def test_a_stream_of_an_unknown_job_is_404(api: Api) -> None:
    for job_id in ("no-such-job", "Bad.Id"):
        reply = await api.call("GET", f"/v1/jobs/{job_id}/stream")
        assert reply.status == 404
        assert reply.error["code"] == "not-found"


async def test_the_stream_ends_when_nats_goes_away(api: Api, nc: NATS) -> None:
    job_id = (await api.submit())["job_id"]
    async with stream(api, job_id) as (response, source):
        await next_event(source)
        await nc.close()
        async with asyncio.timeout(15):
            async for _ in source:  # heartbeats, then the end
                pass
        assert response.content.at_eof()

    def closed() -> None:
        assert api.metric("dispatch_api_sse_streams") == 0

    await assert_eventually(closed)

"""LatestStore on the discovery and status streams against a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from dispatch_nats import (
    ConcurrencyConflict,
    InvalidName,
    LatestEntry,
    LatestFeed,
    LatestStore,
    Layout,
    StreamKind,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def discovery(nc: NATS, streams: Layout) -> AsyncIterator[LatestStore]:
    store = LatestStore.discovery(nc, layout=streams)
    yield store
    await store.aclose()


@pytest.fixture
async def status(nc: NATS, streams: Layout) -> AsyncIterator[LatestStore]:
    store = LatestStore.status(nc, layout=streams)
    yield store
    await store.aclose()


async def _take(feed: LatestFeed, n: int) -> list[LatestEntry]:
    async def take() -> list[LatestEntry]:
        out = []
        async for entry in feed:
            out.append(entry)
            if len(out) == n:
                break
        return out

    return await asyncio.wait_for(take(), 10)


async def test_put_then_get_keeps_one_value_per_key(
    status: LatestStore, js: JetStreamContext, streams: Layout
) -> None:
    assert await status.get(("job-1",)) is None
    await status.put(("job-1",), b"pending")
    s2 = await status.put(("job-1",), b"running")
    await status.put(("job-2",), b"pending")
    entry = await status.get(("job-1",))
    assert entry is not None
    assert (entry.key, entry.seq, entry.payload) == (("job-1",), s2, b"running")
    assert (await js.stream_info(streams.status_stream)).state.messages == 2


async def test_subjects_are_the_contracts(discovery: LatestStore, streams: Layout) -> None:
    assert discovery.subject(("c1", "job-1")) == streams.discovery_subject("c1", "job-1")
    assert discovery.key_of(streams.discovery_subject("c1", "job-1")) == ("c1", "job-1")
    assert discovery.pattern(("c1",)) == f"{streams.root}.discovery.c1.*"
    assert discovery.kind is StreamKind.DISCOVERY


async def test_get_all_by_pattern(discovery: LatestStore) -> None:
    await discovery.put(("c1", "job-1"), b"a")
    await discovery.put(("c1", "job-2"), b"b")
    await discovery.put(("c2", "job-1"), b"c")
    await discovery.put(("c1", "job-1"), b"a2")
    assert {(e.key, e.payload) for e in await discovery.get_all(("c1",))} == {
        (("c1", "job-1"), b"a2"),
        (("c1", "job-2"), b"b"),
    }
    assert {e.key for e in await discovery.get_all(("*", "job-1"))} == {
        ("c1", "job-1"),
        ("c2", "job-1"),
    }
    assert len(await discovery.get_all()) == 3
    assert await discovery.get_all(("c3",)) == []


async def test_get_all_pages_past_a_thousand_keys(status: LatestStore) -> None:
    await asyncio.gather(*(status.put((f"job-{i}",), b"s") for i in range(2500)))
    entries = await status.get_all()
    assert len(entries) == 2500
    assert len({e.key for e in entries}) == 2500


async def test_put_with_expected_seq_never_overwrites_a_newer_value(status: LatestStore) -> None:
    s1 = await status.put(("job-1",), b"v1", expected_last_seq=0)
    with pytest.raises(ConcurrencyConflict) as info:
        await status.put(("job-1",), b"other", expected_last_seq=0)
    assert (info.value.job_id, info.value.expected, info.value.actual) == ("job-1", 0, s1)
    s2 = await status.put(("job-1",), b"v2", expected_last_seq=s1)
    with pytest.raises(ConcurrencyConflict):
        await status.put(("job-1",), b"stale", expected_last_seq=s1)
    entry = await status.get(("job-1",))
    assert entry is not None
    assert (entry.seq, entry.payload) == (s2, b"v2")


async def test_headers_travel_with_the_value(status: LatestStore) -> None:
    await status.put(("job-1",), b"v", headers={"Dispatch-Wake-At": "2026-01-01T00:00:00Z"})
    entry = await status.get(("job-1",))
    assert entry is not None
    assert entry.headers == {"Dispatch-Wake-At": "2026-01-01T00:00:00Z"}
    [listed] = await status.get_all()
    assert listed.headers == entry.headers
    with pytest.raises(InvalidName, match="reserved"):
        await status.put(("job-1",), b"v", headers={"Nats-Msg-Id": "x"})


async def test_watch_gives_current_values_then_changes(status: LatestStore) -> None:
    await status.put(("job-1",), b"a1")
    await status.put(("job-1",), b"a2")
    await status.put(("job-2",), b"b1")
    async with status.watch() as changes:
        initial = await _take(changes, 2)
        assert [(e.key, e.payload) for e in initial] == [(("job-1",), b"a2"), (("job-2",), b"b1")]
        s = await status.put(("job-2",), b"b2", headers={"H": "1"})
        [change] = await _take(changes, 1)
        assert (change.key, change.seq, change.payload, change.headers) == (
            ("job-2",),
            s,
            b"b2",
            {"H": "1"},
        )
    async with status.watch(("job-1",), initial=False) as only_new:
        await status.put(("job-2",), b"b3")
        await status.put(("job-1",), b"a3")
        [change] = await _take(only_new, 1)
        assert (change.key, change.payload) == (("job-1",), b"a3")


async def test_shared_discovery_changes_name_the_job(discovery: LatestStore) -> None:
    seq = await discovery.put(("c1", "job-7"), b"objects")
    async with discovery.shared("supervisor-discovery") as work:
        d = await asyncio.wait_for(anext(work), 5)
        assert (d.job_id, d.seq) == ("job-7", seq)
        await d.ack()


async def test_bad_keys_are_refused(discovery: LatestStore, nc: NATS) -> None:
    with pytest.raises(InvalidName, match="discovery key"):
        await discovery.put(("job-1",), b"x")
    with pytest.raises(InvalidName, match="cluster name"):
        await discovery.get(("C1", "job-1"))
    with pytest.raises(InvalidName, match="job id"):
        discovery.pattern(("c1", "job.1"))
    with pytest.raises(InvalidName, match="pattern"):
        discovery.pattern(("c1", "job-1", "x"))
    with pytest.raises(ValueError, match="not a latest-value stream"):
        LatestStore(nc, StreamKind.RECORD)

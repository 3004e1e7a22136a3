"""Following the record stream: every change to every follower (`follow`), or each change
to one of the replicas sharing a durable consumer (`shared`)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS

from dispatch_core import WriterKind
from dispatch_nats import (
    Delivery,
    Layout,
    RecordChange,
    RecordFeed,
    RecordStore,
    SharedFeed,
    ensure_streams,
)
from tests.integration.nats.support import Eventually, connect
from tests.servers.nats import NatsServer

pytestmark = pytest.mark.integration


async def _take(feed: RecordFeed, n: int, timeout_s: float = 10.0) -> list[RecordChange]:
    async def take() -> list[RecordChange]:
        out = []
        async for change in feed:
            out.append(change)
            if len(out) == n:
                break
        return out

    return await asyncio.wait_for(take(), timeout_s)


async def test_follow_yields_new_appends_across_jobs_in_order(store: RecordStore) -> None:
    old = await store.append("job-old", b"e", expected_last_seq=0, msg_id="old")
    async with store.follow() as changes:
        a = await store.append("job-a", b"e", expected_last_seq=0, msg_id="a1")
        b = await store.append("job-b", b"e", expected_last_seq=0, msg_id="b1")
        a2 = await store.append("job-a", b"e", expected_last_seq=a, msg_id="a2")
        got = await _take(changes, 3)
    assert got == [("job-a", a), ("job-b", b), ("job-a", a2)]
    assert old not in [c.seq for c in got]


async def test_follow_from_a_seq_replays_then_continues(store: RecordStore) -> None:
    s1 = await store.append("job-a", b"e", expected_last_seq=0, msg_id="a1")
    s2 = await store.append("job-b", b"e", expected_last_seq=0, msg_id="b1")
    async with store.follow(after_seq=0) as everything:
        assert await _take(everything, 2) == [("job-a", s1), ("job-b", s2)]
        s3 = await store.append("job-a", b"e", expected_last_seq=s1, msg_id="a2")
        assert await _take(everything, 1) == [("job-a", s3)]
    async with store.follow(after_seq=s1) as rest:
        assert await _take(rest, 2) == [("job-b", s2), ("job-a", s3)]


async def test_start_up_scan_then_follow_misses_nothing(store: RecordStore) -> None:
    await store.append("job-a", b"e", expected_last_seq=0, msg_id="a1")
    mark = await store.stream_last_seq()
    assert await store.list_jobs() == ["job-a"]  # the scan a supervisor does at start-up
    late = await store.append("job-b", b"e", expected_last_seq=0, msg_id="b1")  # during it
    async with store.follow(after_seq=mark) as changes:
        assert await _take(changes, 1) == [("job-b", late)]


async def test_closing_a_feed_from_another_task_ends_the_iteration(store: RecordStore) -> None:
    feed = store.follow()
    await feed.__aenter__()

    async def consume() -> list[RecordChange]:
        return [c async for c in feed]

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    await feed.aclose()
    assert await asyncio.wait_for(task, 5) == []


async def test_follow_survives_a_server_restart(
    private_nats_server: NatsServer, eventually: Eventually
) -> None:
    server = private_nats_server
    nc = await connect(server.url)
    await ensure_streams(nc)
    store = RecordStore(
        nc, writer=WriterKind.SUPERVISOR, follow_heartbeat_s=0.5, ack_timeout_s=1.0, attempts=10
    )
    try:
        async with store.follow(after_seq=0) as changes:
            s1 = await store.append("job-1", b"e1", expected_last_seq=0, msg_id="e1")
            assert await _take(changes, 1) == [("job-1", s1)]
            server.restart()

            async def appended() -> None:
                assert nc.is_connected
                await store.append("job-1", b"e2", expected_last_seq=s1, msg_id="e2")

            await eventually(appended, timeout_s=10)
            # The consumer was in the server's memory: the client re-creates it after missed
            # heartbeats, from the seq after the last one it delivered.
            assert await _take(changes, 1, timeout_s=15) == [("job-1", s1 + 1)]
    finally:
        await store.aclose()
        await nc.close()


# --- shared durable consumer ------------------------------------------------------------


async def _drain(feed: SharedFeed, into: list[Delivery], stop: asyncio.Event) -> None:
    async for d in feed:
        into.append(d)
        await d.ack()
        if stop.is_set():
            return


async def test_shared_consumer_hands_each_append_to_one_replica(
    nc: NATS, streams: Layout, eventually: Eventually
) -> None:
    store = RecordStore(nc, writer=WriterKind.SUPERVISOR, layout=streams)
    replicas = [store.shared("supervisor", batch=8) for _ in range(3)]
    got: list[list[Delivery]] = [[], [], []]
    stop = asyncio.Event()
    for r in replicas:
        await r.start()
    tasks = [asyncio.create_task(_drain(r, g, stop)) for r, g in zip(replicas, got, strict=True)]
    try:
        seqs = await asyncio.gather(
            *(
                store.append(f"job-{i}", b"e", expected_last_seq=0, msg_id=f"m{i}")
                for i in range(300)
            )
        )

        def all_delivered() -> None:
            assert sum(len(g) for g in got) == 300

        await eventually(all_delivered, timeout_s=15)
        delivered = [(d.job_id, d.seq) for g in got for d in g]
        assert sorted(delivered) == sorted((f"job-{i}", s) for i, s in enumerate(seqs))
        assert len(set(delivered)) == 300  # nobody got one twice
        assert sum(1 for g in got if g) >= 2  # the work was shared
        assert all(d.payload == b"" for g in got for d in g)  # headers only
    finally:
        stop.set()
        for r in replicas:
            await r.aclose()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.aclose()


async def test_unacked_delivery_goes_to_another_replica(nc: NATS, streams: Layout) -> None:
    store = RecordStore(nc, writer=WriterKind.SUPERVISOR, layout=streams)
    seq = await store.append("job-1", b"e", expected_last_seq=0, msg_id="m1")
    async with store.shared("sup", ack_wait_s=0.5, batch=1) as crashed:
        first = await asyncio.wait_for(anext(crashed), 5)
        assert (first.job_id, first.seq, first.num_delivered) == ("job-1", seq, 1)
        # ... the replica dies without acking.
    async with store.shared("sup", ack_wait_s=0.5, batch=1) as other:
        again = await asyncio.wait_for(anext(other), 5)
        assert (again.seq, again.num_delivered) == (seq, 2)
        await again.ack()
    await store.aclose()


async def test_nak_with_delay_redelivers_and_position_survives_restarts(
    nc: NATS, streams: Layout
) -> None:
    store = RecordStore(nc, writer=WriterKind.SUPERVISOR, layout=streams)
    s1 = await store.append("job-1", b"e", expected_last_seq=0, msg_id="m1")
    async with store.shared("sup", batch=1) as work:
        d = await asyncio.wait_for(anext(work), 5)
        await d.nak(delay_s=0.2)
        d2 = await asyncio.wait_for(anext(work), 5)
        assert (d2.seq, d2.num_delivered) == (s1, 2)
        await d2.ack()
    s2 = await store.append("job-2", b"e", expected_last_seq=0, msg_id="m2")
    async with store.shared("sup", batch=1) as restarted:
        d3 = await asyncio.wait_for(anext(restarted), 5)
        assert (d3.job_id, d3.seq, d3.num_delivered) == ("job-2", s2, 1)
        await d3.ack()
    await store.aclose()


async def test_a_fetch_that_finds_nothing_is_not_an_error_whichever_timeout_nats_py_raises(
    nc: NATS, streams: Layout
) -> None:
    """nats-py 2.16's fetch raises the builtin TimeoutError when its no-wait probe uses up
    the whole deadline (nats/js/client.py, fetch), and its own TimeoutError otherwise; on a
    loaded machine the notifier died of the first. A poll shorter than one round trip makes
    that path certain: the feed must keep waiting, never raise. (So short a poll also cuts
    off the probe's own answer, so nothing is delivered here; delivery is the other tests'.)"""
    from dispatch_nats.shared import SharedFeed

    feed = SharedFeed(
        nc,
        stream=streams.record_stream,
        durable="tiny-poll",
        filter_subject=streams.record_filter,
        job_of=streams.job_id_from_record_subject,
        api_prefix=streams.api_prefix,
        poll_s=0.000_001,
    )
    async with feed:
        waiting = asyncio.create_task(anext(feed))
        await asyncio.sleep(0.5)  # many empty fetches, each past its deadline at once
        assert not waiting.done(), waiting.exception() if waiting.done() else None
        # ... and a cancellation ends it, even one that nats-py's wait_for turned into a
        # TimeoutError (Python 3.11): a feed that swallowed it would never shut down.
        waiting.cancel()
        done, _ = await asyncio.wait({waiting}, timeout=10)
        assert waiting in done, "the feed did not honour its cancellation"
        with pytest.raises(asyncio.CancelledError):
            waiting.result()

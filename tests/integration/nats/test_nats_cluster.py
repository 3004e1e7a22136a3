"""dispatch_nats on a 3-server JetStream cluster (streams at replicas 3), with real faults:
a server killed (-9) while it leads, a follower frozen (SIGSTOP) so that it falls behind.

* `ensure_streams`, retried by the services' start-up helper, waits out a cluster with no
  quorum and one electing its meta leader.
* A read checked against the stream's leader never returns less than the leader holds,
  even when a lagging follower answers the direct gets; an unchecked one can.
* A shared durable consumer keeps delivering every message through kills of the meta
  leader and of the stream's leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from dispatch_core import WriterKind
from dispatch_nats import LatestStore, Layout, RecordStore, StreamKind, ensure_streams
from services.common.lifecycle import ensure_streams_until
from tests.servers.nats import NatsCluster
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

SUPERVISOR = WriterKind.SUPERVISOR
"""The writer kind of the opaque bytes these tests append."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three servers of this test's own."""
    c = NatsCluster(tmp_path / "cluster")
    c.start()
    yield c
    c.stop()


@pytest.fixture
def cluster_layout() -> Layout:
    return Layout(namespace=f"c{uuid.uuid4().hex[:10]}")


@contextlib.asynccontextmanager
async def _connect(urls: list[str]) -> AsyncIterator[NATS]:
    async def quiet(_: Exception) -> None:
        pass

    nc = await nats.connect(
        urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1, error_cb=quiet
    )
    try:
        yield nc
    finally:
        await nc.close()


async def _ensure(nc: NATS, layout: Layout) -> None:
    """The streams at replicas 3, as a service makes them (a cluster just started may still
    be settling its meta leader)."""
    assert await asyncio.wait_for(ensure_streams_until(nc, asyncio.Event(), 3, layout=layout), 90)


async def test_ensure_streams_waits_for_quorum_then_creates_r3_streams(
    cluster: NatsCluster, cluster_layout: Layout, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dispatch.service")
    for i in (1, 2):
        await asyncio.to_thread(cluster.kill, i)
    stop = asyncio.Event()
    async with _connect(cluster.urls) as nc:
        ensuring = asyncio.ensure_future(ensure_streams_until(nc, stop, 3, layout=cluster_layout))

        def retried() -> None:
            assert not ensuring.done(), "ensure_streams returned without a quorum"
            assert any(r.getMessage() == "startup.retry" for r in caplog.records)

        await assert_eventually(retried, timeout_s=60)
        for i in (1, 2):
            await asyncio.to_thread(cluster.start_server, i)
        assert await asyncio.wait_for(ensuring, 90) is True
        info = await nc.jetstream().stream_info(cluster_layout.record_stream)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        assert info.cluster.leader


async def test_ensure_streams_during_a_meta_leader_election(
    cluster: NatsCluster, cluster_layout: Layout
) -> None:
    """kill -9 of the meta leader, then ensure_streams at once: it waits out the election
    (no reply) and the placement of R3 streams while a peer is offline (10005), and creates
    them once the killed server is back."""
    leader = cluster.meta_leader()
    assert leader is not None
    victim = cluster.index(leader)
    survivors = [i for i in range(len(cluster.names)) if i != victim]
    async with _connect(cluster.urls) as nc:
        await asyncio.to_thread(cluster.kill, victim)
        ensuring = asyncio.ensure_future(
            ensure_streams_until(nc, asyncio.Event(), 3, layout=cluster_layout)
        )

        def elected() -> None:
            new = cluster.meta_leader(survivors)
            assert new is not None
            assert new != leader

        await assert_eventually(elected, timeout_s=60, interval_s=0.2)
        await asyncio.to_thread(cluster.start_server, victim)
        assert await asyncio.wait_for(ensuring, 90) is True
        await ensure_streams(nc, 3, layout=cluster_layout)  # idempotent on the new leader
        info = await nc.jetstream().stream_info(cluster_layout.record_stream)
        assert info.config.num_replicas == 3


async def test_a_read_checked_against_the_leader_never_misses_what_a_lagging_follower_lacks(
    cluster: NatsCluster, cluster_layout: Layout
) -> None:
    """A follower frozen with SIGSTOP misses appends; when it thaws, the direct gets its
    client sends it may be answered before it caught up. The unchecked reads of that
    moment can come back short; the checked ones never do."""
    async with _connect(cluster.urls) as setup:
        await _ensure(setup, cluster_layout)
    leader = cluster.stream_leader(cluster_layout.record_stream)
    assert leader is not None
    async with _connect(cluster.urls) as nc:
        assert await NatsCluster.stream_leader_via(nc, cluster_layout.record_stream) == leader
    # A server that leads neither stream the test writes to (there is one: 2 leaders, 3
    # servers), so freezing it leaves every write a leader and a quorum.
    leaders = {leader, cluster.stream_leader(cluster_layout.discovery_stream)}
    follower = next(i for i, name in enumerate(cluster.names) if name not in leaders)
    others = [url for i, url in enumerate(cluster.urls) if i != follower]
    job = "lagging-job"
    async with _connect(others) as writer_nc, _connect([cluster.urls[follower]]) as reader_nc:
        writer = RecordStore(writer_nc, writer=SUPERVISOR, layout=cluster_layout, ack_timeout_s=10)
        plain = RecordStore(reader_nc, writer=SUPERVISOR, layout=cluster_layout, read_timeout_s=20)
        checked = RecordStore(
            reader_nc, writer=SUPERVISOR, layout=cluster_layout, read_timeout_s=20, check_reads=True
        )
        discoveries = LatestStore(writer_nc, StreamKind.DISCOVERY, layout=cluster_layout)
        from_leader = LatestStore(
            reader_nc,
            StreamKind.DISCOVERY,
            layout=cluster_layout,
            read_timeout_s=20,
            read_from_leader=True,
        )
        key = ("c1", job)
        seq = await writer.append(job, b"first", expected_last_seq=0, msg_id="m-0")
        assert [e.seq for e in await plain.read(job)] == [seq]
        short = 0
        for round_ in range(40):
            cluster.pause(follower)
            try:
                for i in range(10):
                    seq = await writer.append(
                        job, b"x" * 100, expected_last_seq=seq, msg_id=f"m-{round_}-{i}"
                    )
                # Sent while the follower is frozen: answered the moment it thaws.
                probes = [asyncio.ensure_future(plain.last_seq(job)) for _ in range(3)]
                probes.append(asyncio.ensure_future(_last(plain, job)))
                latest = await discoveries.put(key, f"round {round_}".encode())
                verdict = asyncio.ensure_future(_last(checked, job))
                leader_view = asyncio.ensure_future(from_leader.get(key))
                await asyncio.sleep(0.05)  # let the requests reach the socket
            finally:
                cluster.resume(follower)
            got = await asyncio.gather(*probes)
            short += sum(1 for g in got if g < seq)
            assert await verdict == seq, f"round {round_}: a checked read missed events"
            entry = await leader_view
            assert entry is not None
            assert entry.seq == latest, f"round {round_}: the Discovery read is not the latest"
            if short and round_ >= 5:
                break
        assert short, "the frozen follower never answered behind the leader: no staleness shown"
        assert await checked.leader_last_seq(job) == seq
        await writer.aclose()
        await plain.aclose()
        await checked.aclose()
        await discoveries.aclose()
        await from_leader.aclose()


async def _last(store: RecordStore, job: str) -> int:
    entries = await store.read(job)
    return entries[-1].seq if entries else 0


async def test_a_latest_value_read_from_the_leader(
    cluster: NatsCluster, cluster_layout: Layout
) -> None:
    async with _connect(cluster.urls) as nc:
        await _ensure(nc, cluster_layout)
        store = LatestStore(nc, StreamKind.DISCOVERY, layout=cluster_layout)
        leader = LatestStore(nc, StreamKind.DISCOVERY, layout=cluster_layout, read_from_leader=True)
        assert await leader.get(("c1", "job-1")) is None
        seq = await store.put(("c1", "job-1"), b"v1", headers={"X-Test": "1"})
        entry = await leader.get(("c1", "job-1"))
        assert entry is not None
        assert (entry.key, entry.seq, entry.payload, entry.headers) == (
            ("c1", "job-1"),
            seq,
            b"v1",
            {"X-Test": "1"},
        )
        assert entry == await store.get(("c1", "job-1"))
        await store.aclose()
        await leader.aclose()


async def test_a_shared_consumer_delivers_everything_through_leader_kills(
    cluster: NatsCluster, cluster_layout: Layout
) -> None:
    async with _connect(cluster.urls) as nc:
        await _ensure(nc, cluster_layout)
        store = RecordStore(nc, writer=SUPERVISOR, layout=cluster_layout, ack_timeout_s=5)
        seen: set[int] = set()
        appended: set[int] = set()
        async with store.shared("workers", ack_wait_s=5) as feed:

            async def consume() -> None:
                async for delivery in feed:
                    seen.add(delivery.seq)
                    with contextlib.suppress(Exception):
                        await delivery.ack()

            consumer = asyncio.ensure_future(consume())

            async def append(n: int) -> None:
                for i in range(n):
                    job = f"job-{len(appended) % 7}"
                    while True:  # an election answers nobody for seconds: retry as services do
                        try:
                            last = await store.leader_last_seq(job)
                            appended.add(
                                await store.append(
                                    job, b"e", expected_last_seq=last, msg_id=f"{job}-{i}-{last}"
                                )
                            )
                            break
                        except Exception:
                            await asyncio.sleep(0.2)

            await append(20)
            stream = store.layout.record_stream
            for victim in (cluster.meta_leader(), cluster.stream_leader(stream)):
                assert victim is not None
                i = cluster.index(victim)
                await asyncio.to_thread(cluster.kill, i)
                await append(20)
                await asyncio.to_thread(cluster.start_server, i)
                await asyncio.to_thread(cluster.wait_healthy, i, 60.0)
            await append(10)

            def all_delivered() -> None:
                assert not consumer.done(), f"the consumer ended: {consumer}"
                assert appended <= seen, f"not delivered: {sorted(appended - seen)[:10]}"

            await assert_eventually(all_delivered, timeout_s=90, interval_s=0.2)
            await feed.aclose()
            await asyncio.wait_for(consumer, 30)
        await store.aclose()

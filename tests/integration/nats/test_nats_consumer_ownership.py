"""No identity can create, update or delete a consumer another identity owns; the ordered
feeds, which create consumers of their own, still follow their streams in order across a
consumer reset. Against a real nats-server locked by dispatch's rendered configuration.

The attack this closes (issue 10): nats-server accepts a ``name`` in the body of the legacy
ephemeral create request ``$JS.API.CONSUMER.CREATE.<stream>`` and then *updates* the consumer
of that name, so any identity allowed that subject (the read-only ``reader`` was) could give
the supervisor's ``supervisor-discovery`` durable a filter that matches nothing, and every
job would stay pending. Here every identity tries every form of that against every durable
it does not own, and the durable's configuration is checked unchanged afterwards.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from dispatch_core import WriterKind
from dispatch_nats import DEFAULT_LAYOUT, LatestStore, RecordStore, SharedFeed, StreamKind
from dispatch_nats import ensure_streams as ensure
from dispatch_nats.permissions import Identity, durables, service_identities
from tests.servers.locked_nats import LockedNats
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

LAYOUT = DEFAULT_LAYOUT
API = LAYOUT.api_prefix
CLUSTERS = ("local",)
DURABLES = durables(LAYOUT)
NOTHING = "nothing.matches.this"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LockedNats]:
    """One locked server: every service identity, the reader, and the test's own harness."""
    locked = LockedNats(
        tmp_path_factory.mktemp("owners"), clusters=CLUSTERS, harness=True, reader=True
    )
    locked.start()
    yield locked
    locked.stop()


@pytest.fixture
async def harness(site: LockedNats) -> AsyncIterator[NATS]:
    nc = await site.connect("harness")
    await ensure(nc, layout=LAYOUT)
    yield nc
    await nc.close()


async def _api(nc: NATS, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = await nc.request(subject, json.dumps(body or {}).encode(), timeout=10)
    out: dict[str, Any] = json.loads(msg.data)
    return out


async def _durable_config(harness: NATS, stream: str, name: str) -> dict[str, Any]:
    info = await _api(harness, f"{API}.CONSUMER.INFO.{stream}.{name}")
    assert "error" not in info, info
    config: dict[str, Any] = info["config"]
    return config


def _filter_of(stream: str) -> str:
    return {
        LAYOUT.record_stream: LAYOUT.record_filter,
        LAYOUT.discovery_stream: f"{LAYOUT.latest_prefix(StreamKind.DISCOVERY)}.*.*",
        LAYOUT.work_stream: LAYOUT.work_filter,
    }[stream]


async def _owners_create_their_durables(site: LockedNats) -> None:
    """Each durable created (or, if it exists, updated in place) by its owner, as the
    service does at start-up (SharedFeed), without a single violation."""
    for (stream, name), owner in DURABLES.items():
        errors: list[Exception] = []
        nc = await site.connect(owner.value, errors)
        try:
            feed = SharedFeed(
                nc,
                stream=stream,
                durable=name,
                filter_subject=_filter_of(stream),
                job_of=lambda s: s.rsplit(".", 1)[-1],
            )
            await feed.start()
            await feed.aclose()
            await nc.flush()
            assert errors == [], (owner, name, errors)
        finally:
            await nc.close()


def _attacks(stream: str, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every request that would create, update or delete durable ``name`` of ``stream``."""
    hostile = {"filter_subject": NOTHING, "ack_policy": "explicit", "deliver_policy": "all"}
    body = {"stream_name": stream}
    return [
        # the hole: the legacy ephemeral subject, the target named in the body
        (f"{API}.CONSUMER.CREATE.{stream}", {**body, "config": {**hostile, "name": name}}),
        (f"{API}.CONSUMER.CREATE.{stream}", {**body, "config": {**hostile, "durable_name": name}}),
        # the named forms, plain and filtered, as create and as update
        (f"{API}.CONSUMER.CREATE.{stream}.{name}", {**body, "config": {**hostile, "name": name}}),
        (
            f"{API}.CONSUMER.CREATE.{stream}.{name}",
            {**body, "config": {**hostile, "durable_name": name}, "action": "update"},
        ),
        (
            f"{API}.CONSUMER.CREATE.{stream}.{name}.{NOTHING}",
            {**body, "config": {**hostile, "durable_name": name}, "action": "create"},
        ),
        # the legacy durable subject
        (
            f"{API}.CONSUMER.DURABLE.CREATE.{stream}.{name}",
            {**body, "config": {**hostile, "durable_name": name}},
        ),
        (f"{API}.CONSUMER.DELETE.{stream}.{name}", {}),
    ]


@pytest.mark.parametrize("identity", [i.name for i in service_identities(CLUSTERS)])
async def test_no_identity_touches_a_durable_it_does_not_own(
    site: LockedNats, harness: NATS, identity: str
) -> None:
    await _owners_create_their_durables(site)
    role = Identity.parse(identity).role
    foreign = [(s, n) for (s, n), owner in DURABLES.items() if owner is not role]
    assert foreign, identity
    before = {(s, n): await _durable_config(harness, s, n) for s, n in foreign}
    errors: list[Exception] = []
    nc = await site.connect(identity, errors)
    try:
        tried = 0
        for stream, name in foreign:
            for subject, body in _attacks(stream, name):
                reply = nc.new_inbox()
                answers = await nc.subscribe(reply)
                await nc.publish(subject, json.dumps(body).encode(), reply=reply)
                await nc.flush()
                needle = f'permissions violation for publish to "{subject.lower()}"'

                def refused(subject: str = subject, needle: str = needle) -> None:
                    assert any(needle in str(e).lower() for e in errors), (
                        f"{identity}: {subject} was not refused"
                    )

                await assert_eventually(refused, timeout_s=15)
                # the server dropped the request: JetStream never answered it
                assert answers.pending_msgs == 0, f"{identity}: {subject} was answered"
                await answers.unsubscribe()
                tried += 1
        assert tried == 7 * len(foreign)
    finally:
        await nc.close()
    after = {(s, n): await _durable_config(harness, s, n) for s, n in foreign}
    assert after == before
    assert all(c["filter_subject"] != NOTHING for c in after.values())


async def test_the_hole_is_real_where_permissions_allow_it(site: LockedNats, harness: NATS) -> None:
    """Why the legacy subject is denied: for a user it is allowed to (the harness), the
    server does update a durable named in its body (if this ever fails, nats-server changed
    and the denial is belt and braces)."""
    stream = LAYOUT.discovery_stream
    name = f"victim-{uuid.uuid4().hex[:8]}"
    created = await _api(
        harness,
        f"{API}.CONSUMER.CREATE.{stream}.{name}",
        {"stream_name": stream, "config": {"durable_name": name, "ack_policy": "explicit"}},
    )
    assert "error" not in created, created
    hostile = {"name": name, "filter_subject": NOTHING, "ack_policy": "explicit"}
    answer = await _api(
        harness, f"{API}.CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": hostile}
    )
    assert "error" not in answer, answer
    assert (await _durable_config(harness, stream, name)).get("filter_subject") == NOTHING
    await _api(harness, f"{API}.CONSUMER.DELETE.{stream}.{name}")


async def test_owners_keep_their_own_durables(site: LockedNats, harness: NATS) -> None:
    """The supervisor and the notifier create their durables, and re-create them (an
    update in place, as a restarted service does), with their configuration."""
    await _owners_create_their_durables(site)
    await _owners_create_their_durables(site)
    for stream, name in DURABLES:
        assert (await _durable_config(harness, stream, name))["filter_subject"] == _filter_of(
            stream
        )


# -- ordered feeds across a consumer reset ----------------------------------------------------


async def _ordered_consumers(harness: NATS, stream: str) -> set[str]:
    names = await _api(harness, f"{API}.CONSUMER.NAMES.{stream}")
    return {n for n in names.get("consumers") or () if n.startswith("ordered-")}


class _Target:
    """One ordered feed of one identity, and how the harness extends its stream: each put
    to a key of its own (a discovery or status stream keeps one value per key, so values a
    reset's new consumer starts after would be gone if they shared one)."""

    def __init__(self, identity: str, kind: StreamKind) -> None:
        self.identity, self.kind = identity, kind
        self.stream = LAYOUT.stream(kind)
        self.prefix = f"job-{uuid.uuid4().hex[:10]}-"

    def feed(self, nc: NATS) -> Any:
        if self.kind is StreamKind.RECORD:
            records = RecordStore(nc, writer=WriterKind.API, follow_heartbeat_s=0.5)
            return records.follow(after_seq=0)
        store = LatestStore(nc, self.kind, layout=LAYOUT, watch_heartbeat_s=0.5)
        return store.watch(() if self.kind is StreamKind.STATUS else ("local",), initial=False)

    async def put(self, harness: NATS, i: int) -> int:
        js = harness.jetstream()
        job = f"{self.prefix}{i}"
        if self.kind is StreamKind.RECORD:
            subject = LAYOUT.record_subject(job, WriterKind.API)
        elif self.kind is StreamKind.STATUS:
            subject = LAYOUT.status_subject(job)
        else:
            subject = LAYOUT.discovery_subject("local", job)
        ack = await js.publish(subject, str(i).encode())
        return ack.seq

    def seq_of(self, item: Any) -> int | None:
        job = item.job_id if self.kind is StreamKind.RECORD else item.key[-1]
        return int(item.seq) if job.startswith(self.prefix) else None


@pytest.mark.parametrize(
    ("identity", "kind"),
    [
        ("reader", StreamKind.RECORD),
        ("reader", StreamKind.DISCOVERY),
        ("reader", StreamKind.STATUS),
        ("api", StreamKind.STATUS),
        ("supervisor", StreamKind.STATUS),
    ],
)
async def test_an_ordered_feed_follows_in_order_across_resets(
    site: LockedNats, harness: NATS, identity: str, kind: StreamKind
) -> None:
    """Two resets: the client away long enough to miss heartbeats while its consumer still
    exists (re-created under a fresh name: re-using the name would be an update the server
    refuses), then the consumer deleted on the server's side. Every put is delivered once,
    in order, with no refused request."""
    target = _Target(identity, kind)
    errors: list[Exception] = []
    nc = await site.connect(
        identity, errors, allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=2
    )
    seen: list[int] = []
    want: list[int] = []
    try:
        before = await _ordered_consumers(harness, target.stream)
        async with target.feed(nc) as feed:
            received: asyncio.Queue[int] = asyncio.Queue()

            async def pump() -> None:
                async for item in feed:
                    seq = target.seq_of(item)
                    if seq is not None:
                        await received.put(seq)

            async def put_and_receive(n: int) -> None:
                for _ in range(n):
                    want.append(await target.put(harness, len(want)))
                async with asyncio.timeout(60):
                    while len(seen) < len(want):
                        seen.append(await received.get())

            task = asyncio.create_task(pump())
            try:
                await put_and_receive(3)
                (first,) = await _ordered_consumers(harness, target.stream) - before
                assert first.startswith("ordered-")
                # 1. heartbeats lost while the consumer lives on (the server keeps it 5 s
                # without interest; the client is away 2 s): a reset under a fresh name
                await nc.force_reconnect()
                await put_and_receive(3)
                known = before | {first}
                await assert_eventually(
                    lambda: _newest(harness, target.stream, known), timeout_s=30
                )
                # 2. the consumer removed on the server's side: heartbeats stop, a reset
                for name in await _ordered_consumers(harness, target.stream) - before:
                    await _api(harness, f"{API}.CONSUMER.DELETE.{target.stream}.{name}")
                known = await _ordered_consumers(harness, target.stream) | before
                await put_and_receive(3)
                await assert_eventually(
                    lambda: _newest(harness, target.stream, known), timeout_s=30
                )
                assert seen == want
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        await nc.flush()
        assert errors == [], errors
    finally:
        await nc.close()


async def _newest(harness: NATS, stream: str, known: set[str]) -> str:
    """A consumer of the feed's not among ``known`` (a reset made it, under a new name)."""
    new = await _ordered_consumers(harness, stream) - known
    assert new, f"no new consumer beside {known}"
    return sorted(new)[0]

"""The supervisor's discovery store takes the value a FAKE delivery brought, once, instead
of reading the stream again (no NATS: the stream read is replaced by a FAKE that counts)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from nats.aio.client import Client as NATS

from dispatch_nats import LatestEntry, LatestStore, StreamKind
from services.supervisor.delivered import DeliveredLatest
from tests.unit.supervisor.deliveries import FakeDelivery

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _delivery(job: str, seq: int, payload: bytes) -> FakeDelivery:
    d = FakeDelivery(job, seq, subject=f"dispatch.discovery.c1.{job}", payload=payload)
    d.time = T0
    return d


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """FAKE stream reads: each ``LatestStore.get`` is recorded and finds nothing."""
    seen: list[tuple[str, ...]] = []

    async def fake_get(self: LatestStore, key: tuple[str, ...]) -> LatestEntry | None:
        seen.append(key)
        return None

    monkeypatch.setattr(LatestStore, "get", fake_get)
    return seen


async def test_a_delivered_value_is_taken_once_then_the_stream_is_read(
    reads: list[tuple[str, ...]],
) -> None:
    store = DeliveredLatest(NATS(), StreamKind.DISCOVERY)
    store.keep(_delivery("j", 5, b"five"))
    entry = await store.get(("c1", "j"))
    assert entry is not None
    assert (entry.key, entry.seq, entry.payload, entry.time) == (("c1", "j"), 5, b"five", T0)
    assert reads == []
    assert await store.get(("c1", "j")) is None
    assert reads == [("c1", "j")]


async def test_a_newer_delivery_replaces_the_kept_value_an_older_one_does_not(
    reads: list[tuple[str, ...]],
) -> None:
    store = DeliveredLatest(NATS(), StreamKind.DISCOVERY)
    store.keep(_delivery("j", 5, b"five"))
    store.keep(_delivery("j", 9, b"nine"))
    store.keep(_delivery("j", 7, b"seven"))
    entry = await store.get(("c1", "j"))
    assert entry is not None
    assert entry.payload == b"nine"


async def test_forget_drops_what_is_kept_for_a_job(reads: list[tuple[str, ...]]) -> None:
    store = DeliveredLatest(NATS(), StreamKind.DISCOVERY)
    store.keep(_delivery("a", 1, b"a"))
    store.keep(_delivery("b", 2, b"b"))
    store.forget("a")
    assert len(store) == 1
    assert await store.get(("c1", "a")) is None
    assert reads == [("c1", "a")]

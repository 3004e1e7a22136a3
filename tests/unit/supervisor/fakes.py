"""In-memory stand-ins for the pass executor's ports, with JetStream's rules: a latest-value
put honours its expected seq; and a scheduler whose calls the test can watch and delay. The
record store is the repository contract's fake (``tests/contract/record_fake.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime

from dispatch_backends import Snapshot
from dispatch_core import (
    Declarations,
    Launch,
    ObjectRef,
    ObservedObject,
)
from dispatch_nats import ConcurrencyConflict, LatestEntry

__all__ = ["FakeBackend", "FakeLatest"]


class FakeLatest:
    """A latest-value-per-key stream."""

    def __init__(self) -> None:
        self.seq = 0
        self.values: dict[tuple[str, ...], LatestEntry] = {}
        self.puts = 0
        self.published = 0
        """Values sent without an ack (``publish``), stored or not."""
        self.watchers: list[Callable[[LatestEntry], object]] = []
        """Called with every value stored, as a watch of the stream delivers them."""

    async def get(self, key: tuple[str, ...]) -> LatestEntry | None:
        await asyncio.sleep(0)
        return self.values.get(key)

    async def put(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        await asyncio.sleep(0)
        current = self.values.get(key)
        actual = 0 if current is None else current.seq
        if expected_last_seq is not None and expected_last_seq != actual:
            raise ConcurrencyConflict(key[-1], expected_last_seq, actual)
        self.seq += 1
        self.values[key] = LatestEntry(
            key=key,
            seq=self.seq,
            payload=payload,
            time=datetime.now(UTC),
            headers=dict(headers or {}),
        )
        self.puts += 1
        for watcher in self.watchers:
            asyncio.get_running_loop().call_soon(watcher, self.values[key])
        return self.seq

    async def publish(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``put`` whose refusal nobody hears of (JetStream's answer to a publish sent
        without a reply subject)."""
        self.published += 1
        with contextlib.suppress(ConcurrencyConflict):
            await self.put(key, payload, expected_last_seq=expected_last_seq, headers=headers)


class FakeBackend:
    """A scheduler that makes objects on ``start``; ``on_start`` runs inside the call."""

    def __init__(self, cluster: str = "fake") -> None:
        self._cluster = cluster
        self.started: list[Launch] = []
        self.opened: list[ObjectRef] = []
        self.stopped: list[ObjectRef] = []
        self.on_start: Callable[[Launch], Awaitable[None]] | None = None
        self.objects: dict[str, list[ObservedObject]] = {}

    @property
    def cluster(self) -> str:
        return self._cluster

    def declarations(self) -> Declarations:
        return Declarations(node_loss_window_s=60.0)

    async def start(self, launch: Launch) -> ObjectRef:
        if self.on_start is not None:
            await self.on_start(launch)
        self.started.append(launch)
        return ObjectRef(cluster=self._cluster, id=str(len(self.started)))

    async def open_gate(self, ref: ObjectRef) -> None:
        self.opened.append(ref)

    async def stop(self, ref: ObjectRef) -> None:
        self.stopped.append(ref)

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        return Snapshot(
            cluster=self._cluster,
            seen_at=datetime.now(UTC),
            objects={k: tuple(v) for k, v in self.objects.items()},
        )

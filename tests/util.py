"""Helpers shared by the test suites."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import msgspec
from nats.aio.client import Client as NATS

from dispatch_cli.client import ApiClient, SseMessage
from dispatch_core import JobEvent, RecordItem, Status, WriterKind, decode_event, writers_of
from dispatch_nats import Appended, Layout, RecordStore

__all__ = [
    "AsTheirWriters",
    "ReplayedStatusStream",
    "assert_eventually",
    "writer_of",
    "written",
]

T = TypeVar("T")


@overload
async def assert_eventually(
    check: Callable[[], Awaitable[T]], *, timeout_s: float = ..., interval_s: float = ...
) -> T: ...


@overload
async def assert_eventually(
    check: Callable[[], T], *, timeout_s: float = ..., interval_s: float = ...
) -> T: ...


async def assert_eventually(
    check: Callable[[], object], *, timeout_s: float = 10.0, interval_s: float = 0.05
) -> object:
    """Call ``check`` until it returns without raising ``AssertionError``; return its value.

    Use it instead of ``sleep``: the test waits only as long as the system needs, and a
    slow (noisy, 2-core) machine only makes it wait longer, up to ``timeout_s``.

    Args:
        check: sync or async; asserts what must eventually hold, and may return a value
            (e.g. the object it found) for the test to go on with.
        timeout_s: seconds to keep trying.
        interval_s: seconds between tries.

    Returns:
        What ``check`` returned the first time it did not raise.

    Raises:
        AssertionError: the last one ``check`` raised, once ``timeout_s`` has passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            return result
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(interval_s)


class ReplayedStatusStream(ApiClient):
    """TEST DOUBLE of the API for the CLI's ``Watcher``: its status stream sends the given
    Statuses, then ends (no server; nothing else of the client is used)."""

    def __init__(self, statuses: list[Status]) -> None:
        super().__init__("http://127.0.0.1:1", "t")
        self.statuses = statuses

    def stream(
        self, job_id: str, *, last_event_id: str | None = None, read_timeout_s: float = 60.0
    ) -> Iterator[SseMessage]:
        for s in self.statuses:
            yield SseMessage(event="status", id=str(s.seq), data=msgspec.json.encode(s).decode())


_PREFERENCE = (WriterKind.SUPERVISOR, WriterKind.API, WriterKind.NOTIFIER)


def writer_of(*events: JobEvent) -> WriterKind:
    """The kind of writer that appends ``events`` (together) in production: the supervisor
    when it may, else the API (what a person decided), else the notifier."""
    allowed = frozenset(WriterKind)
    for event in events:
        allowed &= writers_of(event)
    for kind in _PREFERENCE:
        if kind in allowed:
            return kind
    raise AssertionError(f"no writer may write all of {events!r}")


def written(record: Iterable[tuple[int, JobEvent]]) -> list[RecordItem]:
    """``(seq, event)`` pairs as ``fold`` takes them: each with the writer kind that appends
    it in production (:func:`writer_of`)."""
    return [(seq, event, writer_of(event)) for seq, event in record]


class AsTheirWriters(RecordStore):
    """A record store for tests that play every service: each append goes out as the writer
    kind that appends its event(s) in production (:func:`writer_of`), through a store of that
    kind on the same connection, or (``connections``) on that writer's own connection (its
    NATS identity, on a locked server); reads are the same for every kind, on ``nc``."""

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        connections: Mapping[WriterKind, NATS] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(nc, writer=WriterKind.API, layout=layout, **options)
        conns = connections or {}
        self.by_kind = {
            k: RecordStore(conns.get(k, nc), writer=k, layout=layout, **options) for k in WriterKind
        }

    async def append(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> int:
        store = self.by_kind[writer_of(decode_event(payload))]
        return await store.append(
            job_id, payload, expected_last_seq=expected_last_seq, msg_id=msg_id
        )

    async def append_outcome(
        self, job_id: str, payload: bytes, *, expected_last_seq: int, msg_id: str
    ) -> Appended:
        store = self.by_kind[writer_of(decode_event(payload))]
        return await store.append_outcome(
            job_id, payload, expected_last_seq=expected_last_seq, msg_id=msg_id
        )

    async def append_many(
        self,
        job_id: str,
        payloads: Sequence[bytes],
        *,
        expected_last_seq: int,
        msg_ids: Sequence[str],
    ) -> list[int]:
        store = self.by_kind[writer_of(*(decode_event(p) for p in payloads))]
        return await store.append_many(
            job_id, payloads, expected_last_seq=expected_last_seq, msg_ids=msg_ids
        )

    async def aclose(self) -> None:
        for store in self.by_kind.values():
            await store.aclose()
        await super().aclose()

"""Helpers shared by the test suites."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar, overload

import msgspec

from dispatch_cli.client import ApiClient, SseMessage
from dispatch_core import Status

__all__ = ["ReplayedStatusStream", "assert_eventually"]

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

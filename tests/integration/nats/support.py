"""Helpers for the nats integration tests (imported by the conftest and the tests)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client as NATS

Check = Callable[[], Awaitable[object] | object]
Eventually = Callable[..., Awaitable[None]]


async def assert_eventually(
    check: Check, *, timeout_s: float = 5.0, interval_s: float = 0.01
) -> None:
    """Call `check` until it returns without raising `AssertionError`, for up to `timeout_s`.

    `check` may be sync or async; the last `AssertionError` is re-raised at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result):
                await result
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(interval_s)


async def connect(url: str, errors: list[Exception] | None = None) -> NATS:
    """Connect to `url` with fast reconnects; client errors go to `errors` (not stderr)."""
    sink = errors if errors is not None else []

    async def error_cb(err: Exception) -> None:
        sink.append(err)

    return await nats.connect(
        url,
        error_cb=error_cb,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        connect_timeout=2,
    )

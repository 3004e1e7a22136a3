"""Helpers for the nats integration tests (imported by the conftest and the tests)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client as NATS

Eventually = Callable[..., Awaitable[Any]]
"""The type of `tests.util.assert_eventually`, as the `eventually` fixture hands it out."""


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

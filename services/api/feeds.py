"""Feeding an SSE response from a NATS feed: one pump shared by the API's routes and the web
page's (``/v1/jobs/{job}/stream``, ``/ui/api/changes``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable

from dispatch_nats import LatestEntry, NatsStoreError

__all__ = ["pump_feed"]

log = logging.getLogger("dispatch.api")


async def pump_feed(
    feed: AsyncIterable[LatestEntry], queue: asyncio.Queue[LatestEntry | None], *, what: str
) -> None:
    """Move the feed's entries into ``queue``, then None when the feed ends or fails (the
    response then ends; an SSE client reconnects, with ``Last-Event-ID`` where the route
    takes one). A failure is logged as ``feed_failed`` naming ``what``."""
    try:
        async for entry in feed:
            await queue.put(entry)
    except NatsStoreError as err:
        log.warning("feed_failed", extra={"route": what, "error": str(err)})
    finally:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)

"""Serving an SSE response from a NATS feed: one pump and one serving loop shared by the API's
routes and the web page's (``/v1/jobs/{job}/stream``, ``/ui/api/changes``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from aiohttp import web
from prometheus_client import Counter, Gauge

from dispatch_nats import LatestEntry, NatsStoreError

__all__ = ["FeedQueue", "SseCounters", "end_streams", "pump_feed", "serve_feed"]

log = logging.getLogger("dispatch.api")

FeedQueue = asyncio.Queue[LatestEntry | None]
"""What a feed's pump fills for its response: entries, then None when the response is to end."""

_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class SseCounters:
    """The metrics a served feed keeps: streams open now, and events written."""

    def __init__(self, streams: Gauge, events: Counter) -> None:
        """Count open streams on ``streams`` and written events on ``events``."""
        self.streams = streams
        self.events = events


async def pump_feed(feed: AsyncIterable[LatestEntry], queue: FeedQueue, *, what: str) -> None:
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


async def serve_feed(
    request: web.Request,
    watch: AbstractAsyncContextManager[AsyncIterable[LatestEntry]],
    frame: Callable[[LatestEntry], bytes | None],
    *,
    streams: set[FeedQueue],
    what: str,
    heartbeat_s: float,
    queue_size: int,
    opening: Callable[[web.StreamResponse, FeedQueue], Awaitable[bool]] | None = None,
    counters: SseCounters | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with an SSE stream of ``watch``'s feed.

    The feed is opened before the response starts (so no change after the opening is
    missed); ``opening`` then writes what the stream starts with and says whether it goes on.
    Each entry is written as ``frame`` makes it (None: skipped); an idle stream gets a
    heartbeat comment every ``heartbeat_s`` seconds. The stream ends when the client goes,
    the feed ends or fails, or the service stops (:func:`end_streams` on ``streams``).

    Args:
        request: the route's request (already authenticated).
        watch: opens the feed.
        frame: the SSE bytes of one entry (``event:``, ``data:``, a blank line), or None.
        streams: the application's open streams; this one's queue is in it while it runs.
        what: the route's name in logs.
        heartbeat_s: seconds between heartbeat comments, in seconds.
        queue_size: how many entries may wait for a slow client before the feed waits.
        opening: writes the stream's first bytes; False ends the stream there.
        counters: the streams-open gauge and events counter to keep, if any.
    """
    queue: FeedQueue = asyncio.Queue(maxsize=queue_size)
    response = web.StreamResponse(headers=_SSE_HEADERS)
    if counters is not None:
        counters.streams.inc()
    streams.add(queue)
    try:
        async with watch as feed:
            await response.prepare(request)
            pump = asyncio.create_task(pump_feed(feed, queue, what=what))
            try:
                if opening is None or await opening(response, queue):
                    await _serve(request, response, queue, frame, heartbeat_s, counters)
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
    except ConnectionResetError:
        log.debug("sse.client_gone", extra={"route": what})
    finally:
        streams.discard(queue)
        if counters is not None:
            counters.streams.dec()
    return response


async def _serve(
    request: web.Request,
    response: web.StreamResponse,
    queue: FeedQueue,
    frame: Callable[[LatestEntry], bytes | None],
    heartbeat_s: float,
    counters: SseCounters | None,
) -> None:
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        try:
            entry = await asyncio.wait_for(queue.get(), heartbeat_s)
        except TimeoutError:
            await response.write(b": heartbeat\n\n")
            continue
        if entry is None:  # the service is stopping, or the feed ended
            return
        data = frame(entry)
        if data is None:
            continue
        await response.write(data)
        if counters is not None:
            counters.events.inc()


def end_streams(streams: set[FeedQueue]) -> None:
    """End every stream served from ``streams`` (each one's serving loop returns on the None):
    at shutdown, so no response outlives the service."""
    for queue in tuple(streams):
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)

"""What every service's ``run`` does the same way: connect to NATS, run its loops until
``stop`` with a bounded shutdown, and drain the connection (STYLE.md, "Services")."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, Protocol, TypeVar

import nats
from nats.aio.client import Client as NATS

from dispatch_core.backoff import Backoff
from dispatch_nats import Layout, NatsStoreError, ensure_streams
from services.common.config import ConfigError
from services.common.logs import setup_logging
from services.common.nats_settings import NatsSettings, nats_options, redact_urls

__all__ = [
    "GC_THRESHOLDS",
    "START_BACKOFF",
    "closing_on_stop",
    "connect_nats",
    "drain",
    "ensure_streams_until",
    "open_nats",
    "retry_until_stopped",
    "run_until_stopped",
    "server_list",
    "service_main",
    "tune_gc",
    "wait_or_stop",
]

log = logging.getLogger("dispatch.service")

T = TypeVar("T")


_CONNECT_OPTIONS: Final[dict[str, Any]] = {
    "connect_timeout": 2,
    "max_reconnect_attempts": -1,  # reconnect for ever, across every known server
    "reconnect_time_wait": 0.5,  # nats-py types it int, but waits any number of seconds
    "pending_size": 64 * 1024 * 1024,
}

GC_THRESHOLDS: Final = (50_000, 20, 100)
"""The collector's thresholds in a service process (:func:`tune_gc`): a young collection
every 50,000 net allocations (Python's default is 700), a middle one every 20 young ones, an
old one every 100 middle ones (and then only once the long-lived objects grew by a quarter,
as always)."""

START_BACKOFF: Final = Backoff(base_s=0.1, max_s=2.0, jitter=0.2)
"""Pauses between start-up tries (connecting, creating the streams, binding consumers)."""


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile; return whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(seconds, 0.0))
    return stop.is_set()


def server_list(servers: str | tuple[str, ...] | list[str]) -> list[str]:
    """Return the server URLs of ``servers``: one URL, a comma list, or a sequence of either.

    nats-py takes a list; a comma list handed to it as one URL never connects.
    """
    items = [servers] if isinstance(servers, str) else list(servers)
    return [url.strip() for item in items for url in item.split(",") if url.strip()]


async def connect_nats(settings: NatsSettings, stop: asyncio.Event, *, name: str) -> NATS | None:
    """Connect to NATS, retrying until one of the settings' servers answers or ``stop`` is
    set (then return None, promptly: the attempt in progress is cancelled).

    nats-py's ``connect`` with unlimited reconnects retries the first connection too and
    never returns while no server answers, so each attempt is raced against ``stop``, and an
    attempt that failed (refused, bad handshake) is tried again after ``START_BACKOFF``.
    Once connected, the client reconnects by itself for ever across every server it knows
    (the list and what the cluster announces), so a restarted or failed-over server is found
    again without restarting the service.

    Args:
        settings: the servers (a comma list is split), the identity, TLS and inbox prefix
            (``<SVC>_NATS_*``).
        stop: give up once set.
        name: the connection's name (shown by the server's monitoring).

    Raises:
        ConfigError: a credentials or TLS file can't be read any more.
    """
    options = nats_options(settings)
    urls = server_list(options.pop("servers"))
    shown = redact_urls(urls)
    delays = START_BACKOFF.delays(random.random)
    connected = False

    async def on_error(err: Exception) -> None:
        # nats-py retries the first connection itself and reports each failure here.
        event = "nats.error" if connected else "nats.connect_failed"
        log.warning(event, extra={"error": repr(err)})

    while not stop.is_set():
        nc = NATS()
        connecting = asyncio.ensure_future(
            nc.connect(
                servers=urls,
                **options,
                name=name,
                error_cb=on_error,
                disconnected_cb=_disconnected,
                reconnected_cb=_reconnected,
                **_CONNECT_OPTIONS,
            )
        )
        if not await _done_before_stop(connecting, stop):
            await _close_quietly(nc)
            return None
        err = connecting.exception()
        if err is None:
            connected = True
            log.info("nats.connected", extra={"connection": name, "servers": shown})
            return nc
        await _close_quietly(nc)
        log.warning("nats.connect_failed", extra={"servers": shown, "error": repr(err)})
        await wait_or_stop(stop, next(delays))
    return None


async def _done_before_stop(work: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait until ``work`` is done or ``stop`` is set, whichever comes first; if ``stop``
    does, cancel ``work`` and wait for it to end, and return False."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if work.done():
        return True
    work.cancel()
    with contextlib.suppress(BaseException):
        await work
    return False


async def _close_quietly(nc: NATS) -> None:
    if not nc.is_closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2.0)


async def retry_until_stopped(
    stop: asyncio.Event, what: str, attempt: Callable[[], Awaitable[T]]
) -> T | None:
    """Run ``attempt`` until it succeeds or ``stop`` is set (then return None, at once).

    A store error that says trying again may succeed (``retryable``: a stream or consumer
    whose leader is being elected, no responders, a reply that did not come) is logged and
    tried again after ``START_BACKOFF``; any other error is raised. Each attempt is raced
    against ``stop``, so a SIGTERM is honoured while NATS is unreachable.

    Raises:
        NatsStoreError: a non-retryable store error (a stream that contradicts the contract).
    """
    delays = START_BACKOFF.delays(random.random)
    while not stop.is_set():
        task = asyncio.ensure_future(attempt())
        if not await _done_before_stop(task, stop):
            return None
        err = task.exception()
        if err is None:
            return task.result()
        if not (isinstance(err, NatsStoreError) and err.retryable):
            raise err
        delay = next(delays)
        log.warning(
            "startup.retry", extra={"what": what, "error": str(err), "retry_in_s": round(delay, 3)}
        )
        await wait_or_stop(stop, delay)
    return None


async def ensure_streams_until(
    nc: NATS, stop: asyncio.Event, replicas: int, *, layout: Layout
) -> bool:
    """``ensure_streams``, retried while the cluster can't answer (electing a meta or stream
    leader, a server down, no responders, a timeout) until it succeeds or ``stop`` is set.

    Returns:
        True once the streams are there; False if ``stop`` was set first.

    Raises:
        StreamConfigConflict: a stream contradicts the contract (a deployment error).
        JetStreamApiError: JetStream refused a request for good.
    """

    async def attempt() -> bool:
        await ensure_streams(nc, replicas, layout=layout)
        return True

    return bool(await retry_until_stopped(stop, "streams.ensure", attempt))


async def open_nats(
    stack: contextlib.AsyncExitStack,
    settings: NatsSettings,
    stop: asyncio.Event,
    *,
    name: str,
    replicas: int,
    layout: Layout,
    drain_s: float = 5.0,
) -> NATS | None:
    """Connect to NATS and make sure the streams exist, as every service starts.

    ``connect_nats`` then ``ensure_streams_until``, each retried until it succeeds or
    ``stop`` is set; the connection's ``drain`` (at most ``drain_s`` seconds) is pushed on
    ``stack`` as soon as it is up, so it is drained however the service ends.

    Returns:
        The connection, with the streams there; None if ``stop`` was set first.

    Raises:
        ConfigError: a credentials or TLS file can't be read any more.
        StreamConfigConflict: a stream contradicts the contract (a deployment error).
        JetStreamApiError: JetStream refused a request for good.
    """
    nc = await connect_nats(settings, stop, name=name)
    if nc is None:
        return None
    stack.push_async_callback(drain, nc, drain_s)
    if not await ensure_streams_until(nc, stop, replicas, layout=layout):
        return None
    return nc


class _Closable(Protocol):
    async def aclose(self) -> None: ...


@contextlib.asynccontextmanager
async def closing_on_stop(feed: _Closable, stop: asyncio.Event) -> AsyncIterator[None]:
    """While the block runs, close ``feed`` as soon as ``stop`` is set, so that a loop
    waiting on it ends promptly instead of at its next message.

    The closing task runs in a task group with the block: an error of either cancels the
    other and leaves as an ``ExceptionGroup``.
    """

    async def close() -> None:
        await stop.wait()
        await feed.aclose()

    async with asyncio.TaskGroup() as tg:
        closer = tg.create_task(close())
        try:
            yield
        finally:
            closer.cancel()


async def _disconnected() -> None:
    log.warning("nats.disconnected")


async def _reconnected() -> None:
    log.info("nats.reconnected")


async def drain(nc: NATS, timeout_s: float = 5.0) -> None:
    """Drain ``nc`` (flush what is buffered, end subscriptions), then close it; at most
    ``timeout_s`` seconds. A connection that is not up (NATS unreachable) is closed at once:
    there is nothing to flush to, and a drain would only wait out its timeout."""
    if nc.is_connected:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await asyncio.wait_for(nc.drain(), timeout_s)
    await _close_quietly(nc)


async def run_until_stopped(
    stop: asyncio.Event, grace_s: float, *loops: Coroutine[Any, Any, None]
) -> None:
    """Run ``loops`` in a task group; each returns once ``stop`` is set. Once it is, give
    them ``grace_s`` seconds, then cancel what is left.

    Raises:
        ExceptionGroup: a loop failed (the others were cancelled).
    """

    async def enforce_grace(tasks: list[asyncio.Task[None]]) -> None:
        waiting = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not stop.is_set():
            await asyncio.wait(tasks)
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            log.warning("service.shutdown_grace_exceeded", extra={"task": task.get_name()})
            task.cancel()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(loop) for loop in loops]
        tg.create_task(enforce_grace(tasks))


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Set a service process's garbage collection policy, once its code and configuration
    are loaded: freeze what is alive (modules, classes, functions, the config), and collect
    the young generation far less often.

    Why (issue 11, speed): a pass decodes, folds and encodes many small msgspec objects
    that live for the pass and are freed by reference counting as it ends; the core's
    Structs are frozen and built from values made before them, so they never form cycles:
    collecting often finds next to nothing. With Python's default threshold a young
    collection ran every 700 allocations, several times per pass, each walking every young
    object the passes in flight hold, and the old collections walked the whole heap, every
    job cached and every module and class loaded at start-up. In the 10,000-job synthetic
    mass preemption (``bench/mass_preemption.py``) the collector took about 10 s of CPU;
    with this policy, well under 1 s. Cycles still happen (asyncio's
    futures and exceptions with tracebacks) and are still collected, in fewer, larger
    batches. Frozen objects are never collected; what is alive at start-up lives as long as
    the process.

    Args:
        thresholds: ``gc.set_threshold``'s three thresholds.
    """
    gc.collect()  # what start-up left as garbage is not frozen with the rest
    gc.freeze()
    gc.set_threshold(*thresholds)


class _LoggedConfig(Protocol):
    @property
    def log_level(self) -> str: ...

    @property
    def log_json(self) -> bool: ...


C = TypeVar("C", bound=_LoggedConfig)


def service_main(
    name: str,
    load: Callable[[Mapping[str, str]], C],
    run: Callable[[C, asyncio.Event], Awaitable[None]],
    *,
    config_errors: tuple[type[Exception], ...] = (),
) -> int:
    """``python -m services.<name>``: build the config from the environment, set up logging
    and the GC policy (:func:`tune_gc`), run until SIGTERM or SIGINT, and return the exit
    status.

    Exit status: 0 after a clean stop; 2 for a configuration error (``ConfigError`` from
    ``load`` or ``run``, or one of ``config_errors`` from ``run``), said plainly on stderr
    as ``<name>: <error>`` since someone is starting the service; 1 for any other failure
    (logged with its traceback).

    Args:
        name: the service (the prefix of its messages and its log records).
        load: the config from the environment (raises ``ConfigError`` naming the variable).
        run: the service's run, given the config and the stop event.
        config_errors: more exceptions of ``run`` that mean a bad configuration.
    """
    errors: tuple[type[Exception], ...] = (ConfigError, *config_errors)
    try:
        cfg = load(os.environ)
    except ConfigError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    setup_logging(name, cfg.log_level, json=cfg.log_json)
    tune_gc()

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await run(cfg, stop)
        except errors as err:
            print(f"{name}: {err}", file=sys.stderr)
            return 2
        except Exception:
            logging.getLogger(f"dispatch.{name}").exception("%s.failed", name)
            return 1
        return 0

    return asyncio.run(main())

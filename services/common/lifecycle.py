"""What every service's ``run`` does the same way: connect to NATS, run its loops until
``stop`` with a bounded shutdown, and drain the connection (STYLE.md, "Services")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

import nats
from nats.aio.client import Client as NATS

from services.common.config import ConfigError
from services.common.logs import setup_logging
from services.common.nats_settings import NatsSettings, nats_options, redact_urls

__all__ = ["connect_nats", "drain", "run_until_stopped", "service_main"]

log = logging.getLogger("dispatch.service")


async def connect_nats(settings: NatsSettings, stop: asyncio.Event, *, name: str) -> NATS | None:
    """Connect to NATS, retrying until it answers or ``stop`` is set (then return None).

    The connection then reconnects by itself for ever (every 0.5 s), so a restarted server
    is found again without restarting the service.

    Args:
        settings: the servers, the identity, TLS and inbox prefix (``<SVC>_NATS_*``).
        stop: give up once set.
        name: the connection's name (shown by the server's monitoring).

    Raises:
        ConfigError: a credentials or TLS file can't be read any more.
    """
    options = nats_options(settings)
    servers = redact_urls(settings.nats_url)
    delay = 0.1
    while not stop.is_set():
        try:
            return await nats.connect(
                **options,
                name=name,
                connect_timeout=2,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=_error,
                pending_size=64 * 1024 * 1024,
            )
        except (OSError, TimeoutError, nats.errors.Error) as err:
            log.warning("nats.connect_failed", extra={"servers": servers, "error": repr(err)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 2.0)
    return None


async def _error(err: Exception) -> None:
    log.warning("nats.error", extra={"error": repr(err)})


async def drain(nc: NATS, timeout_s: float = 5.0) -> None:
    """Drain ``nc`` (flush what is buffered, end subscriptions), then close it; at most
    ``timeout_s`` seconds."""
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        await asyncio.wait_for(nc.drain(), timeout_s)
    if not nc.is_closed:
        await nc.close()


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
    """``python -m services.<name>``: build the config from the environment, set up logging,
    run until SIGTERM or SIGINT, and return the exit status.

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

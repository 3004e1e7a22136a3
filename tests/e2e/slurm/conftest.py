"""Fixtures of the Slurm walkthrough: one nats-server for the session and a
:class:`~tests.e2e.slurm.harness.SlurmRuntime` per test (closed at the end: services
stopped, the test's Slurm jobs cancelled, streams deleted)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.e2e.slurm.harness import SlurmRuntime
from tests.integration.slurm.test_slurm_support import require_cluster
from tests.servers.nats import NatsServer


@pytest.fixture(scope="session")
def slurm_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server (JetStream) for the session."""
    server = NatsServer(tmp_path_factory.mktemp("nats") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def srt(slurm_nats: NatsServer, tmp_path: Path) -> AsyncIterator[SlurmRuntime]:
    """A dispatch installation on the Slurm test cluster."""
    require_cluster()
    runtime = SlurmRuntime(slurm_nats.url, tmp_path / "rt")
    await runtime.open()
    try:
        yield runtime
    finally:
        await runtime.close()

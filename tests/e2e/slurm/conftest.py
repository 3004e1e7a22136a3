"""Fixtures of the Slurm walkthrough: each test starts on a whole cluster (leftover jobs
cancelled, nodes resumed: ``restore_cluster``); one nats-server for the session and a
:class:`~tests.e2e.slurm.harness.SlurmRuntime` per test (closed at the end: services
stopped, the test's Slurm jobs cancelled, streams deleted); for the failover test (issue 14
part 2), one S3 server (SeaweedFS, ``tests/servers/s3.py``) for the session with one bucket,
:data:`S3_BUCKET`, and a runtime whose clusters file also names a local cluster."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.e2e.slurm.harness import SlurmRuntime
from tests.integration.slurm.test_slurm_support import require_cluster, restore_cluster
from tests.servers.nats import NatsServer
from tests.servers.s3 import S3Server, SeaweedFS

S3_BUCKET = "dispatch-slurm-e2e"
"""The bucket the failover test's checkpoint roots live in (one prefix per job)."""


@pytest.fixture(autouse=True)
def whole_cluster() -> None:
    """Every test here starts on a whole cluster: a failed test's leftover jobs are cancelled
    and its nodes resumed (they would hold a later test's job pending), with a warning."""
    require_cluster()
    found = restore_cluster()
    if found:
        warnings.warn(f"the Slurm test cluster was not whole: {found}", stacklevel=1)


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


@pytest.fixture(scope="session")
def slurm_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS for the session, with the bucket :data:`S3_BUCKET`."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        server.client().create_bucket(Bucket=S3_BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
async def srt_local(slurm_nats: NatsServer, tmp_path: Path) -> AsyncIterator[SlurmRuntime]:
    """A dispatch installation with two clusters: the Slurm test cluster and a local one."""
    require_cluster()
    runtime = SlurmRuntime(slurm_nats.url, tmp_path / "rt", local=True)
    await runtime.open()
    try:
        yield runtime
    finally:
        await runtime.close()

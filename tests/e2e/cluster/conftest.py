"""Fixtures of the cluster end-to-end tests: a 3-server JetStream cluster of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.nats import NatsCluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-server processes clustered on loopback, JetStream meta leader elected."""
    cluster = NatsCluster(tmp_path / "nats-cluster")
    cluster.start()
    yield cluster
    cluster.stop()

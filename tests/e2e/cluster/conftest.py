"""Fixtures of the cluster end-to-end tests: a 3-server JetStream cluster of the test's own,
locked as a site locks it (issue 10): each server's config rendered by
``dispatch_nats.permissions`` with the services' identities, their permissions and the
cluster block; no anonymous user. The test's own connection is the site's harness user."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch_nats import Layout
from tests.servers.locked_nats import LockedNats
from tests.servers.nats import NatsCluster


def locked_site(root: Path, *, size: int = 1) -> LockedNats:
    """A locked site (not started) under a namespace of its own, admitting the harness."""
    layout = Layout(namespace=f"k{secrets.token_hex(5)}")
    return LockedNats(root, clusters=("local",), layout=layout, size=size, harness=True)


@pytest.fixture
def locked_cluster(tmp_path: Path) -> Iterator[LockedNats]:
    """Three locked nats-server processes clustered on loopback, meta leader elected."""
    site = locked_site(tmp_path / "site", size=3)
    site.start()
    yield site
    site.stop()


@pytest.fixture
def nats_cluster(locked_cluster: LockedNats) -> NatsCluster:
    """The servers of :func:`locked_cluster` (to kill, freeze and restart them)."""
    assert locked_cluster.cluster is not None
    return locked_cluster.cluster

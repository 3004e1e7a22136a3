"""Fixtures of the kubeflow backend's end-to-end tests: one nats-server and the real-apiserver
lane for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.nats import NatsServer
from tests.servers.pytest_kube_real import kube_dispatch_token, kube_lab

__all__ = ["kube_dispatch_token", "kube_lab", "nats_server"]


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One real nats-server (JetStream) for the session."""
    server = NatsServer(tmp_path_factory.mktemp("nats-kubeflow") / "store")
    server.start()
    yield server
    server.stop()

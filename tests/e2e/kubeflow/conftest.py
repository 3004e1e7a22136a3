"""Fixtures of the kubeflow backend's end-to-end tests: one nats-server for the session (the
real-apiserver lane comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.nats import NatsServer


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One real nats-server (JetStream) for the session."""
    server = NatsServer(tmp_path_factory.mktemp("nats-kubeflow") / "store")
    server.start()
    yield server
    server.stop()

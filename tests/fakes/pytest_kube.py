"""Pytest fixtures for the fake Kubernetes API server (TEST DOUBLE) and the cluster simulator.

Use them from a ``conftest.py``::

    from tests.fakes.pytest_kube import kube_api_client, kube_cluster, kube_server  # noqa: F401

* ``kube_server``: a started :class:`~tests.fakes.kube_apiserver.FakeKubeApiServer` on 127.0.0.1,
  one per test, stopped afterwards.
* ``kube_api_client``: a ``kubernetes.client.ApiClient`` configured for it, closed afterwards.
* ``kube_cluster``: a :class:`~tests.fakes.kube_controller.ClusterSimulator` on the same store
  (four Ready nodes, Trainer v2.3.0 behaviour), settled explicitly by the test or its scenario
  steps; call ``kube_cluster.start()`` to make it react to every change in the background.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.fakes.kube_controller import ClusterSimulator

__all__ = ["kube_api_client", "kube_cluster", "kube_server"]


@pytest.fixture
def kube_server() -> Iterator[FakeKubeApiServer]:
    """A fake API server for one test."""
    with FakeKubeApiServer() as server:
        yield server


@pytest.fixture
def kube_api_client(kube_server: FakeKubeApiServer) -> Iterator[Any]:
    """A real ``kubernetes.client.ApiClient`` pointed at ``kube_server``."""
    client = kube_server.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def kube_cluster(kube_server: FakeKubeApiServer) -> Iterator[ClusterSimulator]:
    """The scripted controllers over ``kube_server``'s store; background thread stopped after."""
    cluster = ClusterSimulator(kube_server.store)
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.errors, f"cluster simulator failed in the background: {cluster.errors!r}"

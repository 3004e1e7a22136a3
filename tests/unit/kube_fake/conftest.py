"""Fixtures of the fake Kubernetes API server's own tests (shared with backend tests)."""

from tests.fakes.pytest_kube import kube_api_client, kube_cluster, kube_server

__all__ = ["kube_api_client", "kube_cluster", "kube_server"]

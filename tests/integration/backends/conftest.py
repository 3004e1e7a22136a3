"""Fixtures of the backend tests: the real-apiserver lane (``tests/servers/pytest_kube_real``)."""

from tests.servers.pytest_kube_real import kube_dispatch_token, kube_lab, kube_ns

__all__ = ["kube_dispatch_token", "kube_lab", "kube_ns"]

"""Session fixtures shared across the test tree.

The real-apiserver lane (``tests/servers/pytest_kube_real.py``) is declared here once, so the
backend, deployment and end-to-end tests share ONE etcd + kube-apiserver per session (a fixture
imported into several conftests would start one per directory).
"""

from tests.servers.pytest_kube_real import kube_dispatch_token, kube_lab, kube_ns

__all__ = ["kube_dispatch_token", "kube_lab", "kube_ns"]

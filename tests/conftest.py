"""Session fixtures shared across the test tree.

The real-apiserver lane (``tests/servers/pytest_kube_real.py``) is declared here once, so the
backend, deployment and end-to-end tests share ONE etcd + kube-apiserver per session (a fixture
imported into several conftests would start one per directory).
"""

from hypothesis import HealthCheck, settings

from tests.servers.pytest_kube_real import kube_dispatch_token, kube_lab, kube_ns, kubelet

# Property tests run on shared 2-core machines and in CI beside real servers: a slow
# example or slow input generation is load, not a finding. Examples and shrinking unchanged.
settings.register_profile("dispatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dispatch")

__all__ = ["kube_dispatch_token", "kube_lab", "kube_ns", "kubelet"]

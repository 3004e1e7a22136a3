"""The backend contract suite, run on the kubeflow backend in both gate modes.

The real ``kubernetes`` client talks to the real-apiserver lane's kube-apiserver 1.20.2 (through
the lane's HTTP proxy, which can cut or refuse its connections: the contract's outage); the
cluster simulator plays the controllers, writing through the same server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatch_backends.kubeflow import GateMode
from tests.contract.backend_contract import BackendContract, BackendHarness
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import KubeflowHarness, real_kube_env

__all__ = ["real_kube_env"]

pytestmark = pytest.mark.integration


class TestKubeflowContract(BackendContract):
    @pytest.fixture(params=[GateMode.KUEUE, GateMode.SUSPEND], ids=["kueue-gate", "suspend-gate"])
    async def harness(
        self,
        request: pytest.FixtureRequest,
        real_kube_env: tuple[Any, ClusterSimulator],
    ) -> AsyncIterator[BackendHarness]:
        server, cluster = real_kube_env
        harness = KubeflowHarness(server, cluster, request.param)
        try:
            yield harness
        finally:
            await harness.cleanup()

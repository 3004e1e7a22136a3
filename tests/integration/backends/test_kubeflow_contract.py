"""The backend contract suite, run on the kubeflow backend in both gate modes.

The real ``kubernetes`` client talks to the fake API server (TEST DOUBLE) over HTTP; the cluster
simulator plays the controllers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatch_backends.kubeflow import GateMode
from tests.contract.backend_contract import BackendContract, BackendHarness
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import KubeflowHarness, kube_env

__all__ = ["kube_env"]

pytestmark = pytest.mark.integration


class TestKubeflowContract(BackendContract):
    @pytest.fixture(params=[GateMode.KUEUE, GateMode.SUSPEND], ids=["kueue-gate", "suspend-gate"])
    async def harness(
        self,
        request: pytest.FixtureRequest,
        kube_env: tuple[FakeKubeApiServer, ClusterSimulator],
    ) -> AsyncIterator[BackendHarness]:
        server, cluster = kube_env
        harness = KubeflowHarness(server, cluster, request.param)
        try:
            yield harness
        finally:
            await harness.cleanup()

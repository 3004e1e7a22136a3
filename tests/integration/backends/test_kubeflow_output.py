"""The kubeflow backend's output capability (``OutputReader``; ``dispatch logs``) on the real
kube-apiserver lane: a TrainJob whose trainer pod has not started reads empty and live; once
its pod runs, the backend asks the API server for that pod's log (the lane has no kubelet to
serve it, so the server's refusal comes back as the backend's error naming the pod); an
unknown TrainJob is not found. The byte slicing of a log: tests/unit/kubeflow/test_logs.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatch_backends import BackendError, OutputNotFound, OutputReader, OutputStream
from dispatch_backends.kubeflow import GateMode
from dispatch_core.state import ObjectPhase, ObjectRef
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import NS, KubeflowHarness, real_kube_env
from tests.servers.kube_lane import RealKube

__all__ = ["real_kube_env"]

pytestmark = pytest.mark.integration

OUT = OutputStream.STDOUT


@pytest.fixture
async def harness(
    real_kube_env: tuple[RealKube, ClusterSimulator],
) -> AsyncIterator[KubeflowHarness]:
    server, cluster = real_kube_env
    h = KubeflowHarness(server, cluster, GateMode.KUEUE)
    try:
        yield h
    finally:
        await h.cleanup()


async def test_the_trainer_pod_log_is_asked_of_the_api_server(harness: KubeflowHarness) -> None:
    backend = harness.backend
    assert isinstance(backend, OutputReader)
    job = new_job_id()
    ref = await backend.start(make_launch(job, harness.spec(Program.SLEEP)))
    harness.started.append(ref)
    waiting = await backend.read_output(ref, OUT, 0, 100)
    assert (waiting.data, waiting.size, waiting.live) == (b"", 0, True)
    assert "has not started" in waiting.where
    await backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    pod = next(
        p["metadata"]["name"]
        for p in harness.cluster.pods(NS, ref.id.partition("/")[2])
        if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0"
    )
    with pytest.raises(BackendError, match=f"read the log of pod {NS}/{pod}"):
        await backend.read_output(ref, OUT, 0, 100)


async def test_an_unknown_trainjob_has_no_output(harness: KubeflowHarness) -> None:
    backend = harness.backend
    for ref in (
        ObjectRef(cluster=backend.cluster, id=f"{NS}/dj-nosuch-1-1"),
        ObjectRef(cluster="elsewhere", id=f"{NS}/x"),
        ObjectRef(cluster=backend.cluster, id="no-slash"),
    ):
        with pytest.raises(OutputNotFound):
            await backend.read_output(ref, OUT, 0, 10)

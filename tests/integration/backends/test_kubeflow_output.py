"""The kubeflow backend's output capability (``OutputReader``; ``dispatch logs``) on the real
kube-apiserver lane, reading REAL log bytes: the backend (as the deploy/kubernetes
ServiceAccount, whose RBAC must grant ``pods/log``) asks the real apiserver for the trainer
node-0 pod's log; the apiserver finds the pod's node, that Node's kubelet address and port, and
reads the log from the fake kubelet (TEST DOUBLE, ``tests/servers/kubelet.py``) over mutual TLS,
exactly as it would from a real kubelet. The cluster simulator binds the pods to nodes pointing
at that kubelet and runs their containers there.

What is proved: the bytes read are the bytes the kubelet holds (any byte, a partial last line),
windows from an offset, new bytes read from where the last read ended, the end of the TrainJob
making the output complete; after a JobSet restart, the new node-0 pod's log; the kubelet's
answers as the apiserver relays them (its refusal, a pod it no longer holds) and a pod deleted
become errors naming the pod. The byte slicing alone: tests/unit/kubeflow/test_logs.py. The
observer, the API route and the CLI: tests/e2e/kubeflow/test_kubeflow_logs.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from dispatch_backends import OutputNotFound, OutputReader, OutputStream, Unreachable
from dispatch_backends.kubeflow import GateMode
from dispatch_core.state import ObjectPhase, ObjectRef
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import NS, KubeflowHarness, real_simulated
from tests.servers.kube import KubeApiServer
from tests.servers.kube_lane import RealKube
from tests.servers.kube_pki import APISERVER_CLIENT_CN
from tests.servers.kube_resources import PODS
from tests.servers.kubelet import FakeKubelet
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

OUT = OutputStream.STDOUT
CONTAINER = "node"  # the trainer container (KubeflowSettings.trainer_container)


@pytest.fixture
def env(
    kube_lab: KubeApiServer, kube_dispatch_token: str, kubelet: FakeKubelet
) -> Iterator[tuple[RealKube, ClusterSimulator]]:
    with real_simulated(
        kube_lab, token=kube_dispatch_token, kubelet=kubelet, max_restarts=1
    ) as pair:
        yield pair


@pytest.fixture
async def harness(env: tuple[RealKube, ClusterSimulator]) -> AsyncIterator[KubeflowHarness]:
    server, cluster = env
    h = KubeflowHarness(server, cluster, GateMode.KUEUE)
    try:
        yield h
    finally:
        await h.cleanup()


async def _running(harness: KubeflowHarness) -> tuple[str, ObjectRef, str]:
    """A TrainJob started and running; returns its job id, ref and TrainJob name."""
    job = new_job_id()
    ref = await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
    harness.started.append(ref)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    return job, ref, ref.id.partition("/")[2]


def _write(cluster: ClusterSimulator, name: str, data: bytes, index: int = 0) -> str:
    return cluster.write_log(NS, name, data, index=index)


async def test_the_trainer_node_0_log_is_read_byte_for_byte(
    harness: KubeflowHarness, kubelet: FakeKubelet
) -> None:
    backend = harness.backend
    cluster = harness.cluster
    assert isinstance(backend, OutputReader)
    job = new_job_id()
    ref = await backend.start(make_launch(job, harness.spec(Program.SLEEP)))
    harness.started.append(ref)
    waiting = await backend.read_output(ref, OUT, 0, 100)
    assert (waiting.data, waiting.size, waiting.live) == (b"", 0, True)
    assert "has not started" in waiting.where
    await backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    name = ref.id.partition("/")[2]

    first = b"epoch 1 loss=0.91\n\xff\xfe\x00 not UTF-8\r\nstep 2"  # a partial last line
    pod = await asyncio.to_thread(_write, cluster, name, first)
    await asyncio.to_thread(_write, cluster, name, b"node 1 talks too\n", 1)
    assert kubelet.log(NS, pod) == first

    whole = await backend.read_output(ref, OUT, 0, 1000)
    assert whole.data == first
    assert (whole.offset, whole.size, whole.live) == (0, len(first), True)
    assert whole.where == f"pod {NS}/{pod}"
    asked = kubelet.requests[-1]
    assert asked.path == f"/containerLogs/{NS}/{pod}/{CONTAINER}"
    assert asked.query == {"limitBytes": "1001"}
    assert asked.client == APISERVER_CLIENT_CN  # the apiserver's own kubelet client cert

    window = await backend.read_output(ref, OUT, 3, 5)
    assert window.data == first[3:8]
    assert window.size > window.next_offset  # more is there now
    past = await backend.read_output(ref, OUT, len(first) + 10, 5)
    assert (past.data, past.offset) == (b"", len(first) + 10)

    # the line goes on and more comes: read from where the last read ended
    later = b" loss=0.42\nepoch 2\n"
    await asyncio.to_thread(_write, cluster, name, later)
    more = await backend.read_output(ref, OUT, whole.next_offset, 1000)
    assert more.data == later
    assert more.size == len(first + later)
    assert more.live

    await asyncio.to_thread(cluster.succeed, NS, name)
    await harness.wait_phase(job, ref, ObjectPhase.ENDED)

    async def ended() -> None:
        final = await backend.read_output(ref, OUT, 0, 1000)
        assert final.data == first + later
        assert not final.live
        assert final.complete

    await assert_eventually(ended, timeout_s=60)


async def test_after_a_jobset_restart_the_new_node_0_pod_is_read(
    harness: KubeflowHarness,
) -> None:
    backend = harness.backend
    cluster = harness.cluster
    _, ref, name = await _running(harness)
    old = await asyncio.to_thread(_write, cluster, name, b"before the restart\n")
    assert (await backend.read_output(ref, OUT, 0, 100)).data == b"before the restart\n"

    await asyncio.to_thread(cluster.fail, NS, name, index=1)  # maxRestarts 1: JobSet restarts

    def restarted() -> str:
        pods = [
            p
            for p in cluster.pods(NS, name)
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/restart-attempt") == "1"
            and p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0"
            and p["status"].get("phase") == "Running"
        ]
        assert pods, "no node-0 pod of restart 1 runs yet"
        return str(pods[0]["metadata"]["name"])

    new = await assert_eventually(lambda: asyncio.to_thread(restarted), timeout_s=60)
    assert _write(cluster, name, b"after the restart\n") == new
    assert new != old
    chunk = await backend.read_output(ref, OUT, 0, 100)
    assert chunk.data == b"after the restart\n"
    assert chunk.where == f"pod {NS}/{new}"
    assert chunk.live


async def test_a_kubelet_that_refuses_is_an_error_naming_the_pod(
    harness: KubeflowHarness, kubelet: FakeKubelet
) -> None:
    backend = harness.backend
    _, ref, name = await _running(harness)
    pod = await asyncio.to_thread(_write, harness.cluster, name, b"hello\n")
    kubelet.refuse(1, status=500, message="failed to get container status: runtime is down")
    with pytest.raises(Unreachable) as refused:
        await backend.read_output(ref, OUT, 0, 100)
    words = str(refused.value)
    assert f"read the log of pod {NS}/{pod}" in words
    assert "runtime is down" in words  # the kubelet's own words, relayed by the apiserver
    # once the kubelet answers again, so does the backend
    assert (await backend.read_output(ref, OUT, 0, 100)).data == b"hello\n"


async def test_a_pod_gone_from_its_node_or_deleted_is_not_found_naming_it(
    harness: KubeflowHarness, kubelet: FakeKubelet
) -> None:
    backend = harness.backend
    cluster = harness.cluster
    job, ref, name = await _running(harness)
    pod = await asyncio.to_thread(_write, cluster, name, b"hello\n")
    await asyncio.to_thread(cluster.succeed, NS, name)
    await harness.wait_phase(job, ref, ObjectPhase.ENDED)

    kubelet.forget(NS, pod)  # the node removed the containers (the pod object remains)
    with pytest.raises(OutputNotFound) as gone:
        await backend.read_output(ref, OUT, 0, 100)
    assert f"pod {NS}/{pod} of TrainJob {ref.id}: gone" in str(gone.value)
    # (the apiserver relays a kubelet's 404 as its generic NotFound, without the words)

    # someone deletes the finished pods (the TrainJob stays): its log went with them
    for p in cluster.pods(NS, name):
        harness.server.store.delete(PODS, NS, p["metadata"]["name"], grace_period_seconds=0)
    with pytest.raises(OutputNotFound) as deleted:
        await backend.read_output(ref, OUT, 0, 100)
    assert f"TrainJob {ref.id}" in str(deleted.value)
    assert "gone" in str(deleted.value)


async def test_an_unknown_trainjob_has_no_output(harness: KubeflowHarness) -> None:
    backend = harness.backend
    for ref in (
        ObjectRef(cluster=backend.cluster, id=f"{NS}/dj-nosuch-1-1"),
        ObjectRef(cluster="elsewhere", id=f"{NS}/x"),
        ObjectRef(cluster=backend.cluster, id="no-slash"),
    ):
        with pytest.raises(OutputNotFound):
            await backend.read_output(ref, OUT, 0, 10)

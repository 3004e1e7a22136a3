"""The fake kubelet (TEST DOUBLE, tests/servers/kubelet.py) behind the REAL kube-apiserver of the
lane: ``GET /api/v1/namespaces/{ns}/pods/{pod}/log`` as any client sends it, resolved by the
apiserver to the pod's node and that Node's kubelet endpoint, reaches the fake over mutual TLS
with the query parameters the apiserver passes on (``tailLines``, ``limitBytes``,
``timestamps``, ``sinceSeconds``, ``follow``), each honoured as a kubelet does; the
apiserver's own checks (an unknown container) and the kubelet's refusals come back as the
apiserver's statuses."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.cli.support import eventually
from tests.fakes.kube_controller import ClusterSimulator
from tests.servers.kube import KubeApiServer
from tests.servers.kube_lane import RealKube
from tests.servers.kube_pki import APISERVER_CLIENT_CN
from tests.servers.kube_resources import PODS
from tests.servers.kubelet import FakeKubelet

pytestmark = pytest.mark.integration

NS = "team-a"
NODE = "kubelet-node"
POD = "talker"


@pytest.fixture
def core(kube_lab: KubeApiServer, kubelet: FakeKubelet) -> Iterator[Any]:
    """A pod bound to a node whose kubelet is the fake; the admin's CoreV1Api."""
    env = RealKube(kube_lab, NS)
    try:
        ClusterSimulator(env.store, nodes=(NODE,), kubelet=kubelet)  # registers the node
        env.store.create(
            PODS,
            NS,
            {
                "metadata": {"name": POD},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
            },
        )
        kubelet.run(NS, POD, ["main"])
        yield k8s.CoreV1Api(env.admin)
    finally:
        env.close()


def _log(core: Any, **options: Any) -> bytes:
    answer = core.read_namespaced_pod_log(
        POD, NS, container="main", _preload_content=False, **options
    )
    return bytes(answer.data)


def test_the_query_parameters_reach_the_kubelet_and_are_honoured(
    core: Any, kubelet: FakeKubelet
) -> None:
    old = datetime.now(UTC) - timedelta(hours=1)
    kubelet.write(NS, POD, b"one\ntwo\n", at=old)
    kubelet.write(NS, POD, b"three\nfour\n")
    assert _log(core) == b"one\ntwo\nthree\nfour\n"
    assert kubelet.requests[-1].path == f"/containerLogs/{NS}/{POD}/main"
    assert kubelet.requests[-1].client == APISERVER_CLIENT_CN

    assert _log(core, tail_lines=3) == b"two\nthree\nfour\n"
    assert kubelet.requests[-1].query == {"tailLines": "3"}
    assert _log(core, limit_bytes=6) == b"one\ntw"
    assert _log(core, since_seconds=600) == b"three\nfour\n"
    assert kubelet.requests[-1].query == {"sinceSeconds": "600"}
    stamped = _log(core, timestamps=True, tail_lines=1).decode()
    at, _, line = stamped.partition(" ")
    assert line == "four\n"
    assert datetime.fromisoformat(at.replace("Z", "+00:00")) > old
    assert len(at.split(".")[1]) == len("000000000Z")  # nanoseconds, as Go's RFC3339Nano


def test_follow_streams_what_is_written_later_and_ends_with_the_container(
    core: Any, kubelet: FakeKubelet
) -> None:
    kubelet.write(NS, POD, b"before\npart")
    answer = core.read_namespaced_pod_log(
        POD, NS, container="main", follow=True, _preload_content=False
    )
    got = bytearray()

    def read() -> None:
        for data in answer.stream(64, decode_content=False):
            got.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def has(want: bytes) -> None:
            assert bytes(got) == want

        eventually(lambda: has(b"before\npart"), timeout_s=30)
        kubelet.write(NS, POD, b"ial line\nafter\n")  # the partial line goes on
        eventually(lambda: has(b"before\npartial line\nafter\n"), timeout_s=30)
        assert reader.is_alive()
        kubelet.exit(NS, POD)  # the container ends: so does the follow
        reader.join(30)
        assert not reader.is_alive()
        assert bytes(got) == b"before\npartial line\nafter\n"
        assert kubelet.requests[-1].query == {"follow": "true"}
    finally:
        answer.release_conn()


def test_refusals_come_back_as_the_apiserver_s_statuses(core: Any, kubelet: FakeKubelet) -> None:
    with pytest.raises(k8s.ApiException) as unknown:
        core.read_namespaced_pod_log(POD, NS, container="nosuch")
    assert unknown.value.status == 400  # the apiserver's own check of the pod's containers
    asked = len(kubelet.requests)
    kubelet.refuse(1, status=500, message="runtime is down")
    with pytest.raises(k8s.ApiException) as refused:
        _log(core)
    assert refused.value.status == 500
    assert "runtime is down" in str(refused.value.body)
    assert len(kubelet.requests) == asked + 1
    kubelet.forget(NS, POD)  # the node no longer holds the pod
    with pytest.raises(k8s.ApiException) as gone:
        _log(core)
    assert gone.value.status == 404

"""End to end through the services on a real nats-server, with the kubeflow backend: the
observer and a supervisor replica run in-process (tasks of the test's event loop), each with its
own :class:`KubeflowBackend` on the real-apiserver lane's kube-apiserver 1.20.2 (the real
``kubernetes`` client, as the deploy/kubernetes ServiceAccount) while the cluster simulator plays
Trainer, JobSet, Job, Kueue and kubelet through the same server.

Most tests hand the backends to the services through their ``run(backend=...)`` /
``run(backends=...)`` parameters (no monkeypatching), to share the lane's clients; the last
builds them from a clusters file and a kubeconfig, as a deployment does.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dispatch_backends.kubeflow import KubeflowBackend, KubeflowSettings
from dispatch_core import (
    Action,
    CauseKind,
    ExecutionEnded,
    JobSpec,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
    epoch,
)
from dispatch_nats import Layout
from services.observer import service as observer_service
from services.observer.config import ObserverConfig
from services.supervisor import service as supervisor_service
from services.supervisor.config import SupervisorConfig
from tests.e2e.installation import Installation as E2EInstallation
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import NS, QUEUE, real_simulated
from tests.servers.kube import KubeApiServer
from tests.servers.kube_lane import RealKube
from tests.servers.nats import NatsServer
from tests.unit.kubeflow.records import container_env
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CLUSTER = "kf"


class Installation(E2EInstallation[KubeflowBackend]):
    """A namespace on the nats-server, the fake cluster, and the services, each handed its
    own backend (the clusters file is there for the configs; nothing reads it)."""

    def __init__(self, url: str, tmp: Path, server: RealKube, cluster: ClusterSimulator) -> None:
        self.server = server
        self.cluster = cluster
        self.settings = KubeflowSettings(
            namespaces=(NS,), queue=QUEUE, watch_timeout_s=5.0, evidence_wait_s=3.0
        )
        self.clients = [server.api_client(), server.api_client()]
        self.backends = [KubeflowBackend(CLUSTER, self.settings, c) for c in self.clients]
        super().__init__(
            url,
            tmp,
            self.backends[1],
            clusters_toml=(
                "[[clusters]]\n"
                f'name = "{CLUSTER}"\nbackend = "kubeflow"\nnamespaces = ["{NS}"]\n'
                f'queue = "{QUEUE}"\nwatch_timeout_s = 1.0\n'
            ),
            poll_interval_s=0.2,
        )

    async def open(self) -> None:
        await super().open()
        await self.observer(backend=self.backends[0])
        await self.supervisor(backends={CLUSTER: self.backends[1]})

    async def _clear_backend(self) -> None:
        for backend in self.backends:
            await backend.aclose()
        for api in self.clients:
            api.close()

    def running_env(self, name: str) -> dict[str, str]:
        """The DISPATCH_* environment of the running pods of TrainJob ``name``."""
        pods = [p for p in self.cluster.pods(NS, name) if p["status"].get("phase") == "Running"]
        assert pods, f"TrainJob {name} has no running pod"
        return {k: v for k, v in container_env(pods[0]).items() if k.startswith("DISPATCH_")}


@pytest.fixture
async def installation(
    nats_server: NatsServer, tmp_path: Path, kube_lab: KubeApiServer, kube_dispatch_token: str
) -> AsyncIterator[Installation]:
    with real_simulated(kube_lab, token=kube_dispatch_token) as (server, cluster):
        inst = Installation(nats_server.url, tmp_path / "inst", server, cluster)
        try:
            await inst.open()
            yield inst
        finally:
            await inst.close()


def running(submission: int) -> Callable[[Status], None]:
    def check(status: Status) -> None:
        assert status.state is State.RUNNING, status
        assert status.submission == submission, status

    return check


async def test_a_trainjob_preempted_by_kueue_is_resubmitted_with_a_higher_epoch_and_succeeds(
    installation: Installation,
) -> None:
    inst = installation
    job_id = f"kf-{secrets.token_hex(4)}"
    spec = JobSpec(
        cluster=CLUSTER,
        command=("python", "train.py"),
        checkpoint="s3://ckpt/" + job_id,
        options={"image": "ghcr.io/example/train:1", "nodes": "2"},
    )
    policy = RecoveryPolicy(
        rules=(RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),)
    )
    await inst.submit(job_id, spec, policy)

    first = await inst.wait_status(job_id, running(1))
    name1 = f"dj-{job_id}-1-1"
    env1 = await assert_eventually(lambda: inst.running_env(name1), timeout_s=30)
    assert int(env1["DISPATCH_EPOCH"]) == first.epoch == epoch(0, 1, 0)

    await asyncio.to_thread(inst.cluster.kueue_evict, NS, name1)

    second = await inst.wait_status(job_id, running(2))
    name2 = f"dj-{job_id}-2-1"
    env2 = await assert_eventually(lambda: inst.running_env(name2), timeout_s=30)
    assert int(env2["DISPATCH_EPOCH"]) == second.epoch == epoch(0, 2, 0)
    assert int(env2["DISPATCH_EPOCH"]) > int(env1["DISPATCH_EPOCH"])
    assert env2["DISPATCH_ATTEMPT"] != env1["DISPATCH_ATTEMPT"]
    assert env2["DISPATCH_CHECKPOINT"] == env1["DISPATCH_CHECKPOINT"] == spec.checkpoint
    workload = inst.cluster.workload(NS, name1)
    assert workload is not None
    assert workload["spec"]["active"] is False, "the evicted TrainJob must never run again"

    await asyncio.to_thread(inst.cluster.succeed, NS, name2)

    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status

    status = await inst.wait_status(job_id, succeeded)
    recoveries = [t for t in status.history if t.state is State.RECOVERING]
    assert [t.cause.kind for t in recoveries] == [CauseKind.PREEMPTED]
    assert "Evicted (Preempted)" in recoveries[0].cause.detail
    events = await inst.events(job_id)
    ended = [e for e in events if isinstance(e, ExecutionEnded)]
    assert [(e.submission, e.cause.kind) for e in ended] == [
        (1, CauseKind.PREEMPTED),
        (2, CauseKind.NONE),
    ]


async def test_services_built_from_a_clusters_file_stop_the_kubeflow_watches_they_started(
    nats_server: NatsServer, tmp_path: Path, kube_lab: KubeApiServer, kube_dispatch_token: str
) -> None:
    """An observer and a supervisor that build their KubeflowBackend from the clusters file
    (through a kubeconfig, as deployed) close it when they stop: no watch thread outlives
    them."""
    layout = Layout(namespace=f"kf{secrets.token_hex(4)}")
    with real_simulated(kube_lab, token=kube_dispatch_token) as (server, _cluster):
        # as deployed: a kubeconfig with the ServiceAccount's token (in a pod, in_cluster)
        kubeconfig = kube_lab.kubeconfig(tmp_path / "kubeconfig", token=kube_dispatch_token)
        assert server.namespace == NS
        clusters = tmp_path / "clusters.toml"
        clusters.write_text(
            "[[clusters]]\n"
            f'name = "{CLUSTER}"\nbackend = "kubeflow"\nnamespaces = ["{NS}"]\n'
            f'queue = "{QUEUE}"\nkubeconfig = "{kubeconfig}"\nwatch_timeout_s = 1.0\n'
        )

        def watch_threads() -> set[threading.Thread]:
            return {t for t in threading.enumerate() if t.name.startswith("kubeflow ")}

        before = watch_threads()
        runs: list[Callable[[asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]]] = [
            lambda stop, ready: observer_service.run(
                ObserverConfig(
                    cluster=CLUSTER,
                    clusters_file=str(clusters),
                    nats_url=(nats_server.url,),
                    namespace=layout.namespace,
                    poll_interval_s=0.2,
                    http_port=0,
                ),
                stop,
                registry=CollectorRegistry(),
                ready=ready,
            ),
            lambda stop, ready: supervisor_service.run(
                SupervisorConfig(
                    clusters_file=str(clusters),
                    nats_url=(nats_server.url,),
                    namespace=layout.namespace,
                    http_port=0,
                ),
                stop,
                registry=CollectorRegistry(),
                ready=ready,
            ),
        ]
        started_by: list[set[threading.Thread]] = []
        for run in runs:
            stop, ready = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(run(stop, ready))
            await asyncio.wait_for(ready.wait(), 30)
            started = watch_threads() - before
            started_by.append(started)
            stop.set()
            await asyncio.wait_for(task, 30)
            assert all(not t.is_alive() for t in started), [t.name for t in started]
        assert started_by[0], "the observer's first discovery started no watch"
        assert watch_threads() == before

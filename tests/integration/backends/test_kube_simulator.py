"""Each scenario step of the cluster simulator (TEST DOUBLE, ``tests/fakes/kube_controller.py``)
writes, through the lane's real kube-apiserver, the conditions the facts file describes.

TrainJobs are created through the real client (as the admin, straight to the server); the
simulator's steps are explicit; the checks read back through the real client
(CustomObjectsApi, CoreV1Api, BatchV1Api) and real watches.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from tests.fakes.kube_controller import (
    ADMISSION_GATED_BY,
    QUEUE_NAME_LABEL,
    ClusterSimulator,
    train_job_body,
)
from tests.servers.kube import KubeApiServer
from tests.servers.kube_lane import RealKube
from tests.servers.kube_resources import JOBSETS, PODS, TRAINJOBS
from tests.servers.kube_webhook import SiteWebhook

pytestmark = pytest.mark.integration

G, V, P = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
NS = "team-a"
Watch: Any = watch.Watch


@pytest.fixture
def kube_server(kube_lab: KubeApiServer) -> Iterator[RealKube]:
    """The lane's server for this test, namespace :data:`NS` emptied before and after."""
    env = RealKube(kube_lab, NS)
    try:
        yield env
    finally:
        env.close()


@pytest.fixture
def kube_cluster(kube_server: RealKube) -> Iterator[ClusterSimulator]:
    """The scripted controllers writing through the server; background thread stopped after."""
    cluster = ClusterSimulator(kube_server.store)
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.errors, f"cluster simulator failed in the background: {cluster.errors!r}"


@pytest.fixture
def apis(kube_server: RealKube) -> tuple[Any, Any, Any]:
    return (
        client.CustomObjectsApi(kube_server.admin),
        client.CoreV1Api(kube_server.admin),
        client.BatchV1Api(kube_server.admin),
    )


def _cond(obj: Any, kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == kind), None
    )


def _running(apis: tuple[Any, Any, Any], cluster: ClusterSimulator, name: str, **kw: Any) -> Any:
    custom, _, _ = apis
    custom.create_namespaced_custom_object(G, V, NS, P, train_job_body(name, **kw))
    cluster.settle()
    return custom.get_namespaced_custom_object(G, V, NS, P, name)


def test_created_trainjob_gets_jobset_job_and_running_pods(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, core, batch = apis
    tj = _running(apis, kube_cluster, "tj-1", num_nodes=3, env={"DISPATCH_ATTEMPT": "2"})
    js = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "tj-1")
    owner = js["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "TrainJob",
        tj["metadata"]["uid"],
        True,
    )
    jobs = batch.list_namespaced_job(NS, label_selector="jobset.sigs.k8s.io/jobset-name=tj-1")
    assert [j.metadata.name for j in jobs.items] == ["tj-1-node-0"]
    job = jobs.items[0]
    assert job.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert job.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    pods = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=tj-1").items
    assert len(pods) == 3
    assert {p.status.phase for p in pods} == {"Running"}
    assert {p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in pods} == {
        "0",
        "1",
        "2",
    }
    assert all(p.metadata.labels["batch.kubernetes.io/job-name"] == "tj-1-node-0" for p in pods)
    assert pods[0].spec.containers[0].env[0].name == "DISPATCH_ATTEMPT"
    assert tj["status"]["jobsStatus"] == [
        {"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
    ]
    assert _cond(tj, "Complete") is None
    assert _cond(tj, "Failed") is None


def test_succeed(apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator) -> None:
    custom, _, batch = apis
    _running(apis, kube_cluster, "tj-1")
    kube_cluster.succeed(NS, "tj-1")
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    complete = _cond(tj, "Complete")
    assert complete is not None
    assert (complete["status"], complete["reason"]) == ("True", "AllJobsCompleted")
    job = batch.read_namespaced_job("tj-1-node-0", NS)
    assert {c.type for c in job.status.conditions} >= {"SuccessCriteriaMet", "Complete"}


@pytest.mark.parametrize(
    ("step", "exit_code", "reason"), [("fail", 1, "Error"), ("oom", 137, "OOMKilled")]
)
def test_container_failure_fails_job_jobset_and_trainjob(
    apis: tuple[Any, Any, Any],
    kube_cluster: ClusterSimulator,
    kube_server: RealKube,
    step: str,
    exit_code: int,
    reason: str,
) -> None:
    custom, core, batch = apis
    _running(apis, kube_cluster, "tj-1", num_nodes=2)
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    if step == "oom":
        kube_cluster.oom_kill(NS, "tj-1")
    else:
        kube_cluster.fail(NS, "tj-1", exit_code=1)
    # the failed pod's termination state was visible to a pod watch before the pod went away
    terminated = [
        cs.state.terminated
        for e in Watch().stream(
            core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1
        )
        for cs in (e["object"].status.container_statuses or [])
        if cs.state.terminated is not None
        and e["object"].metadata.labels["batch.kubernetes.io/job-completion-index"] == "0"
    ]
    assert (terminated[0].exit_code, terminated[0].reason) == (exit_code, reason)
    job = batch.read_namespaced_job("tj-1-node-0", NS)
    failed_job = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed_job.reason == "BackoffLimitExceeded"
    js = kube_server.store.get(JOBSETS, NS, "tj-1")
    assert (_cond(js, "Failed") or {})["reason"] == "FailedJobs"
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    failed = _cond(tj, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"]) == ("True", "FailedJobs")
    assert failed["message"] == (_cond(js, "Failed") or {})["message"]


def test_deadline_exceeded(apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator) -> None:
    custom, core, _ = apis
    _running(apis, kube_cluster, "tj-1")
    kube_cluster.exceed_deadline(NS, "tj-1")
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    failed = _cond(tj, "Failed")
    assert failed is not None
    assert (failed["reason"], failed["message"]) == (
        "DeadlineExceeded",
        "TrainJob exceeded its active deadline",
    )
    assert kube_cluster.jobset(NS, "tj-1") is None
    assert core.list_namespaced_pod(NS).items == []


def test_scheduler_preemption_marks_the_pod_disruption_target(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, core, _ = apis
    _running(apis, kube_cluster, "tj-1")
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    kube_cluster.preempt_by_scheduler(NS, "tj-1")
    reasons = {
        c.reason
        for e in Watch().stream(
            core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1
        )
        for c in (e["object"].status.conditions or [])
        if c.type == "DisruptionTarget"
    }
    assert reasons == {"PreemptionByScheduler"}
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert (_cond(tj, "Failed") or {}).get("reason") == "FailedJobs"


def test_kueue_eviction_without_pod_reasons_suspends_the_trainjob(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator, kube_server: RealKube
) -> None:
    custom, core, _ = apis
    tj = _running(apis, kube_cluster, "tj-1", labels={QUEUE_NAME_LABEL: "lq"})
    assert tj["spec"]["suspend"] is False  # admitted: Kueue unsuspended it
    assert tj["spec"]["runtimePatches"][0]["manager"] == "kueue.x-k8s.io/manager"
    wl = kube_cluster.workload(NS, "tj-1")
    assert wl is not None
    assert (_cond(wl, "Admitted") or {})["status"] == "True"
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    kube_cluster.kueue_evict(NS, "tj-1")
    wl = kube_cluster.workload(NS, "tj-1")
    assert wl is not None
    assert ((_cond(wl, "Evicted") or {})["reason"], (_cond(wl, "Preempted") or {})["reason"]) == (
        "Preempted",
        "InClusterQueue",
    )
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert tj["spec"]["suspend"] is True
    assert ((_cond(tj, "Suspended") or {})["status"], (_cond(tj, "Suspended") or {})["reason"]) == (
        "True",
        "Suspended",
    )
    assert _cond(tj, "Failed") is None
    assert core.list_namespaced_pod(NS).items == []
    pod_events = list(
        Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1)
    )
    assert not [
        c
        for e in pod_events
        for c in (e["object"].status.conditions or [])
        if c.type == "DisruptionTarget"
    ]
    kube_cluster.admit(NS, "tj-1")
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert tj["spec"]["suspend"] is False
    assert ((_cond(tj, "Suspended") or {})["status"], (_cond(tj, "Suspended") or {})["reason"]) == (
        "False",
        "Resumed",
    )
    assert len(kube_server.store.list_objects(PODS, NS)[0]) == 2


def test_node_lost_leaves_the_known_hang(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, core, batch = apis
    _running(apis, kube_cluster, "tj-1", num_nodes=2)
    node = kube_cluster.nodes_of(NS, "tj-1")[0]
    kube_cluster.lose_node(node)
    n = core.read_node(node)
    assert next(c for c in n.status.conditions if c.type == "Ready").status == "Unknown"
    assert {(t.key, t.effect) for t in n.spec.taints} == {
        ("node.kubernetes.io/unreachable", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
    }
    stuck = core.list_namespaced_pod(NS, field_selector=f"spec.nodeName={node}").items
    assert len(stuck) == 1
    assert stuck[0].metadata.deletion_timestamp is not None
    assert stuck[0].status.phase == "Running"
    assert (
        next(c for c in stuck[0].status.conditions if c.type == "DisruptionTarget").reason
        == "DeletionByTaintManager"
    )
    job = batch.read_namespaced_job("tj-1-node-0", NS)
    kinds = {c.type for c in job.status.conditions}
    assert "FailureTarget" in kinds
    assert "Failed" not in kinds
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert _cond(tj, "Failed") is None
    assert _cond(tj, "Complete") is None
    # a force delete of the stuck pod (what an emergency stop does) lets the Job fail
    core.delete_namespaced_pod(stuck[0].metadata.name, NS, grace_period_seconds=0)
    kube_cluster.settle()
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert (_cond(tj, "Failed") or {}).get("reason") == "FailedJobs"


def test_foreground_stop_waits_for_pods_on_a_lost_node(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, core, _ = apis
    _running(apis, kube_cluster, "tj-1", num_nodes=2)
    node = kube_cluster.nodes_of(NS, "tj-1")[0]
    kube_cluster.lose_node(node, evict=False)
    custom.delete_namespaced_custom_object(G, V, NS, P, "tj-1", propagation_policy="Foreground")
    kube_cluster.settle()
    held = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert held["metadata"]["finalizers"] == ["foregroundDeletion"]
    stuck = core.list_namespaced_pod(NS).items
    assert [p.spec.node_name for p in stuck] == [node]
    core.delete_namespaced_pod(stuck[0].metadata.name, NS, grace_period_seconds=0)
    kube_cluster.settle()
    with pytest.raises(client.ApiException) as info:
        custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert info.value.status == 404


def test_admission_gate_holds_quota_until_removed_and_cannot_be_added(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator, kube_server: RealKube
) -> None:
    # Kueue's webhooks (default: a queued TrainJob is created suspended; validate: gates
    # are only removed) run as a real admission webhook of the server
    with SiteWebhook(
        kube_server.lab, NS, TRAINJOBS, kube_cluster.kueue_webhook, operations=("CREATE", "UPDATE")
    ):
        _gated_then_admitted(apis, kube_cluster)


def _gated_then_admitted(apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator) -> None:
    custom, core, _ = apis
    gates = "dispatch.example/start,admin.example/hold"
    tj = _running(
        apis,
        kube_cluster,
        "tj-1",
        labels={QUEUE_NAME_LABEL: "lq"},
        annotations={ADMISSION_GATED_BY: gates},
    )
    assert tj["spec"]["suspend"] is True
    wl = kube_cluster.workload(NS, "tj-1")
    assert wl is not None
    reserved = _cond(wl, "QuotaReserved") or {}
    assert (reserved["status"], reserved["reason"]) == ("False", "AdmissionGated")
    assert wl["metadata"]["annotations"][ADMISSION_GATED_BY] == gates
    assert core.list_namespaced_pod(NS).items == []
    # a gate cannot be added after creation
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object(
            G,
            V,
            NS,
            P,
            "tj-1",
            {"metadata": {"annotations": {ADMISSION_GATED_BY: gates + ",x.example/new"}}},
        )
    assert info.value.status == 422
    # removing our gate leaves the other one: still gated
    custom.patch_namespaced_custom_object(
        G,
        V,
        NS,
        P,
        "tj-1",
        {"metadata": {"annotations": {ADMISSION_GATED_BY: "admin.example/hold"}}},
    )
    kube_cluster.settle()
    wl = kube_cluster.workload(NS, "tj-1")
    assert wl is not None
    assert (_cond(wl, "QuotaReserved") or {})["reason"] == "AdmissionGated"
    # the last gate removed: admitted, unsuspended, pods run
    custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", {"metadata": {"annotations": {ADMISSION_GATED_BY: None}}}
    )
    kube_cluster.settle()
    wl = kube_cluster.workload(NS, "tj-1")
    assert wl is not None
    assert (_cond(wl, "QuotaReserved") or {})["status"] == "True"
    assert custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")["spec"]["suspend"] is False
    assert len(core.list_namespaced_pod(NS).items) == 2


def test_suspend_without_kueue(apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator) -> None:
    custom, core, _ = apis
    tj = _running(apis, kube_cluster, "tj-1", suspend=True)
    assert ((_cond(tj, "Suspended") or {})["status"], (_cond(tj, "Suspended") or {})["reason"]) == (
        "True",
        "Suspended",
    )
    assert core.list_namespaced_pod(NS).items == []
    custom.patch_namespaced_custom_object(G, V, NS, P, "tj-1", {"spec": {"suspend": False}})
    kube_cluster.settle()
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert (_cond(tj, "Suspended") or {})["reason"] == "Resumed"
    assert len(core.list_namespaced_pod(NS).items) == 2


def test_unmapped_reason_is_copied_verbatim(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, _, _ = apis
    _running(apis, kube_cluster, "tj-1")
    kube_cluster.fail_with_reason(
        NS, "tj-1", reason="SomeFutureReason", message="words kept as they are"
    )
    failed = _cond(custom.get_namespaced_custom_object(G, V, NS, P, "tj-1"), "Failed") or {}
    assert (failed["reason"], failed["message"]) == ("SomeFutureReason", "words kept as they are")


def test_trainer_v2_3_0_clears_failed_when_the_jobset_goes(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, core, _ = apis
    _running(apis, kube_cluster, "tj-1")
    kube_cluster.fail(NS, "tj-1", exit_code=1)
    assert _cond(custom.get_namespaced_custom_object(G, V, NS, P, "tj-1"), "Failed") is not None
    kube_cluster.expire_finished_jobset(NS, "tj-1")
    tj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert _cond(tj, "Failed") is None
    assert kube_cluster.jobset(NS, "tj-1") is not None
    assert {p.status.phase for p in core.list_namespaced_pod(NS).items} == {"Running"}


def test_trainer_main_keeps_failed(kube_server: RealKube) -> None:
    cluster = ClusterSimulator(kube_server.store, nodes=("n1",), trainer_version="main")
    custom = client.CustomObjectsApi(kube_server.admin)
    custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("tj-1", num_nodes=1))
    cluster.settle()
    cluster.fail(NS, "tj-1")
    cluster.expire_finished_jobset(NS, "tj-1")
    assert _cond(custom.get_namespaced_custom_object(G, V, NS, P, "tj-1"), "Failed") is not None
    assert cluster.jobset(NS, "tj-1") is None


def test_jobset_restarts_then_reaches_max_restarts(kube_server: RealKube) -> None:
    cluster = ClusterSimulator(kube_server.store, max_restarts=1)
    custom = client.CustomObjectsApi(kube_server.admin)
    custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("tj-1"))
    cluster.settle()
    cluster.fail(NS, "tj-1")
    js = kube_server.store.get(JOBSETS, NS, "tj-1")
    assert js["status"]["restarts"] == 1
    assert _cond(custom.get_namespaced_custom_object(G, V, NS, P, "tj-1"), "Failed") is None
    assert {
        p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]
        for p in cluster.pods(NS, "tj-1")
    } == {"1"}
    cluster.fail(NS, "tj-1")
    failed = _cond(custom.get_namespaced_custom_object(G, V, NS, P, "tj-1"), "Failed") or {}
    assert failed["reason"] == "ReachedMaxRestarts"


def test_background_mode_reacts_to_client_writes(
    apis: tuple[Any, Any, Any], kube_cluster: ClusterSimulator
) -> None:
    custom, core, _ = apis
    kube_cluster.start()
    custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("tj-1"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len([p for p in core.list_namespaced_pod(NS).items if p.status.phase == "Running"]) == 2:
            break
        time.sleep(0.02)
    else:
        pytest.fail("pods did not start in background mode")
    custom.delete_namespaced_custom_object(G, V, NS, P, "tj-1", propagation_policy="Foreground")
    deadline = time.monotonic() + 10
    while core.list_namespaced_pod(NS).items and time.monotonic() < deadline:
        time.sleep(0.02)
    assert core.list_namespaced_pod(NS).items == []

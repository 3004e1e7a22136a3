"""The fake API server answers the real ``kubernetes`` client as kube-apiserver would.

Every test goes through the real client over loopback HTTP; the expectations are the API
server's documented behaviour (codes, reasons, metadata rules), not the fake's internals.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client

from tests.fakes.kube_apiserver import JOBS, PODS, TRAINJOBS, FakeKubeApiServer
from tests.fakes.kube_controller import train_job_body

G, V, P = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
NS = "team-a"
JOBS_STATUS = {"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}


@pytest.fixture
def custom(kube_api_client: Any) -> Any:
    return client.CustomObjectsApi(kube_api_client)


@pytest.fixture
def core(kube_api_client: Any) -> Any:
    return client.CoreV1Api(kube_api_client)


@pytest.fixture
def batch(kube_api_client: Any) -> Any:
    return client.BatchV1Api(kube_api_client)


def _status(err: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or "")
    assert body["kind"] == "Status"
    assert body["status"] == "Failure"
    assert body["code"] == err.status
    return body


def _create(custom: Any, name: str, **kwargs: Any) -> dict[str, Any]:
    obj: dict[str, Any] = custom.create_namespaced_custom_object(
        G, V, NS, P, train_job_body(name, **kwargs)
    )
    return obj


def _pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "nodeName": "node-a"},
    }


def test_create_answers_201_with_the_object_and_server_metadata(custom: Any) -> None:
    data, status, _ = custom.create_namespaced_custom_object_with_http_info(
        G, V, NS, P, train_job_body("tj-1")
    )
    assert status == 201
    meta = data["metadata"]
    assert meta["name"] == "tj-1"
    assert meta["namespace"] == NS
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    # defaults from the CRD schema are applied, as the real server does
    assert data["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert data["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert data["spec"]["suspend"] is False


def test_create_twice_is_409_already_exists(custom: Any) -> None:
    _create(custom, "tj-1")
    with pytest.raises(client.ApiException) as info:
        _create(custom, "tj-1")
    assert info.value.status == 409
    body = _status(info.value)
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'trainjobs.trainer.kubeflow.org "tj-1" already exists'
    assert body["details"] == {"name": "tj-1", "group": G, "kind": "trainjobs"}


def test_get_missing_is_404_not_found(custom: Any, core: Any) -> None:
    with pytest.raises(client.ApiException) as info:
        custom.get_namespaced_custom_object(G, V, NS, P, "nope")
    assert info.value.status == 404
    assert _status(info.value)["reason"] == "NotFound"
    with pytest.raises(client.ApiException) as info:
        core.read_namespaced_pod("nope", NS)
    assert _status(info.value)["message"] == 'pods "nope" not found'


def test_resource_versions_increase_globally(custom: Any, core: Any) -> None:
    a = _create(custom, "tj-1")
    pod = core.create_namespaced_pod(NS, _pod("p-1"))
    b = _create(custom, "tj-2")
    rvs = [
        int(a["metadata"]["resourceVersion"]),
        int(pod.metadata.resource_version),
        int(b["metadata"]["resourceVersion"]),
    ]
    assert rvs == sorted(rvs)
    assert len(set(rvs)) == 3
    listed = custom.list_namespaced_custom_object(G, V, NS, P)
    assert int(listed["metadata"]["resourceVersion"]) >= rvs[-1]
    assert [i["metadata"]["name"] for i in listed["items"]] == ["tj-1", "tj-2"]


def test_stale_replace_is_409_conflict(custom: Any) -> None:
    obj = _create(custom, "tj-1")
    stale = json.loads(json.dumps(obj))
    obj["spec"]["suspend"] = True
    updated = custom.replace_namespaced_custom_object(G, V, NS, P, "tj-1", obj)
    assert int(updated["metadata"]["resourceVersion"]) > int(stale["metadata"]["resourceVersion"])
    stale["spec"]["suspend"] = False
    with pytest.raises(client.ApiException) as info:
        custom.replace_namespaced_custom_object(G, V, NS, P, "tj-1", stale)
    assert info.value.status == 409
    body = _status(info.value)
    assert body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]


def test_replace_of_a_custom_resource_needs_a_resource_version(custom: Any) -> None:
    obj = _create(custom, "tj-1")
    del obj["metadata"]["resourceVersion"]
    with pytest.raises(client.ApiException) as info:
        custom.replace_namespaced_custom_object(G, V, NS, P, "tj-1", obj)
    assert info.value.status == 422
    assert _status(info.value)["details"]["causes"][0]["field"] == "metadata.resourceVersion"


def test_generation_moves_on_spec_changes_only(custom: Any) -> None:
    _create(custom, "tj-1")
    labelled = custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", {"metadata": {"labels": {"x": "y"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    status = custom.patch_namespaced_custom_object_status(
        G,
        V,
        NS,
        P,
        "tj-1",
        {
            "status": {
                "conditions": [
                    {
                        "type": "Suspended",
                        "status": "False",
                        "reason": "Resumed",
                        "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        },
    )
    assert status["metadata"]["generation"] == 1
    suspended = custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", {"spec": {"suspend": True}}
    )
    assert suspended["metadata"]["generation"] == 2


def test_status_subresource_is_separate_from_the_main_resource(custom: Any) -> None:
    _create(custom, "tj-1")
    # a main-resource write ignores .status
    obj = custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", {"status": {"jobsStatus": [JOBS_STATUS]}}
    )
    assert "status" not in obj
    # a /status write changes only .status
    obj = custom.patch_namespaced_custom_object_status(
        G, V, NS, P, "tj-1", {"spec": {"suspend": True}, "status": {"jobsStatus": [JOBS_STATUS]}}
    )
    assert obj["status"]["jobsStatus"] == [JOBS_STATUS]
    assert obj["spec"]["suspend"] is False
    # and a main-resource PUT keeps the status it was not allowed to change
    obj["status"] = {}
    obj["spec"]["suspend"] = True
    obj = custom.replace_namespaced_custom_object(G, V, NS, P, "tj-1", obj)
    assert obj["status"]["jobsStatus"] == [JOBS_STATUS]
    assert obj["spec"]["suspend"] is True


def test_merge_patch_and_json_patch(custom: Any) -> None:
    _create(custom, "tj-1", annotations={"a": "1", "b": "2"})
    merged = custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", {"metadata": {"annotations": {"a": None, "c": "3"}}}
    )
    assert merged["metadata"]["annotations"] == {"b": "2", "c": "3"}
    ops = [
        {"op": "test", "path": "/spec/suspend", "value": False},
        {"op": "replace", "path": "/spec/suspend", "value": True},
        {"op": "add", "path": "/metadata/annotations/d~1e", "value": "4"},
        {"op": "remove", "path": "/metadata/annotations/b"},
        {"op": "copy", "from": "/metadata/annotations/c", "path": "/metadata/annotations/f"},
        {"op": "move", "from": "/metadata/annotations/f", "path": "/metadata/annotations/g"},
    ]
    patched = custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", ops, _content_type="application/json-patch+json"
    )
    assert patched["spec"]["suspend"] is True
    assert patched["metadata"]["annotations"] == {"c": "3", "d/e": "4", "g": "3"}
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object(
            G,
            V,
            NS,
            P,
            "tj-1",
            [{"op": "test", "path": "/spec/suspend", "value": False}],
            _content_type="application/json-patch+json",
        )
    assert info.value.status == 422
    assert _status(info.value)["reason"] == "Invalid"


def test_patch_carrying_a_stale_resource_version_is_409(custom: Any) -> None:
    obj = _create(custom, "tj-1")
    custom.patch_namespaced_custom_object(G, V, NS, P, "tj-1", {"spec": {"suspend": True}})
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object(
            G,
            V,
            NS,
            P,
            "tj-1",
            {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"suspend": False},
            },
        )
    assert info.value.status == 409


def test_strategic_merge_patch_is_415_on_custom_resources(custom: Any) -> None:
    _create(custom, "tj-1")
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object(
            G,
            V,
            NS,
            P,
            "tj-1",
            {"spec": {"suspend": True}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert info.value.status == 415
    assert _status(info.value)["reason"] == "UnsupportedMediaType"


def test_strategic_merge_patch_merges_keyed_lists_of_built_in_kinds(core: Any) -> None:
    pod = _pod("p-1")
    pod["spec"]["containers"].append({"name": "side", "image": "envoy"})
    core.create_namespaced_pod(NS, pod)
    # the client's default for a dict body on built-in kinds is strategic merge
    patched = core.patch_namespaced_pod(
        "p-1",
        NS,
        {
            "spec": {"containers": [{"name": "side", "image": "envoy:2"}]},
            "metadata": {"finalizers": ["x/y"]},
        },
    )
    assert [(c.name, c.image) for c in patched.spec.containers] == [
        ("main", "busybox"),
        ("side", "envoy:2"),
    ]
    patched = core.patch_namespaced_pod(
        "p-1",
        NS,
        {
            "spec": {"containers": [{"name": "side", "$patch": "delete"}]},
            "$deleteFromPrimitiveList/metadata": None,
        },
    )
    assert [c.name for c in patched.spec.containers] == ["main"]
    assert patched.metadata.finalizers == ["x/y"]


def test_label_selectors(core: Any) -> None:
    core.create_namespaced_pod(NS, _pod("p-1", {"app": "a", "tier": "web"}))
    core.create_namespaced_pod(NS, _pod("p-2", {"app": "b"}))
    core.create_namespaced_pod(NS, _pod("p-3", {"app": "c", "tier": "db"}))

    def names(selector: str) -> list[str]:
        return [
            p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=selector).items
        ]

    assert names("app=a") == ["p-1"]
    assert names("app==b") == ["p-2"]
    assert names("app!=a") == ["p-2", "p-3"]
    assert names("app in (a, c)") == ["p-1", "p-3"]
    assert names("app notin (a,c)") == ["p-2"]
    assert names("tier") == ["p-1", "p-3"]
    assert names("!tier") == ["p-2"]
    assert names("app in (a,b,c),tier!=db") == ["p-1", "p-2"]
    with pytest.raises(client.ApiException) as info:
        names("app in (a")
    assert info.value.status == 400


def test_field_selectors_and_cluster_wide_lists(core: Any, custom: Any) -> None:
    core.create_namespaced_pod(NS, _pod("p-1"))
    core.create_namespaced_pod("team-b", _pod("p-1"))
    everywhere = core.list_pod_for_all_namespaces(field_selector="metadata.name=p-1")
    assert sorted(p.metadata.namespace for p in everywhere.items) == ["team-a", "team-b"]
    only_b = core.list_pod_for_all_namespaces(field_selector="metadata.namespace=team-b")
    assert [p.metadata.namespace for p in only_b.items] == ["team-b"]
    _create(custom, "tj-1")
    assert len(custom.list_cluster_custom_object(G, V, P)["items"]) == 1
    with pytest.raises(client.ApiException) as info:
        custom.list_namespaced_custom_object(G, V, NS, P, field_selector="spec.suspend=true")
    assert info.value.status == 400


def test_list_pages_with_limit_and_continue(core: Any) -> None:
    for n in range(5):
        core.create_namespaced_pod(NS, _pod(f"p-{n}"))
    first = core.list_namespaced_pod(NS, limit=2)
    assert [p.metadata.name for p in first.items] == ["p-0", "p-1"]
    second = core.list_namespaced_pod(NS, limit=2, _continue=first.metadata._continue)
    assert [p.metadata.name for p in second.items] == ["p-2", "p-3"]


def test_finalizers_hold_deletion_until_removed(custom: Any) -> None:
    _create(custom, "tj-1")
    custom.patch_namespaced_custom_object(
        G, V, NS, P, "tj-1", {"metadata": {"finalizers": ["dispatch.example/guard"]}}
    )
    answer = custom.delete_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert answer["metadata"]["deletionTimestamp"]
    obj = custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert obj["metadata"]["deletionTimestamp"]
    assert obj["metadata"]["generation"] == 2
    with pytest.raises(client.ApiException) as info:  # no new finalizers while deleting
        custom.patch_namespaced_custom_object(
            G, V, NS, P, "tj-1", {"metadata": {"finalizers": ["dispatch.example/guard", "other/x"]}}
        )
    assert info.value.status == 422
    custom.patch_namespaced_custom_object(G, V, NS, P, "tj-1", {"metadata": {"finalizers": None}})
    with pytest.raises(client.ApiException) as info:
        custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert info.value.status == 404


def test_delete_without_finalizers_answers_a_success_status(custom: Any) -> None:
    _create(custom, "tj-1")
    answer = custom.delete_namespaced_custom_object(G, V, NS, P, "tj-1")
    assert answer["kind"] == "Status"
    assert answer["status"] == "Success"


def _owned_pod(name: str, owner: Any, kind: str = "Job") -> dict[str, Any]:
    pod = _pod(name)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": kind,
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return pod


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "m", "image": "x"}], "restartPolicy": "Never"}
            }
        },
    }


def test_propagation_background_cascades_and_orphan_keeps_dependents(
    batch: Any, core: Any, kube_server: FakeKubeApiServer
) -> None:
    job = batch.create_namespaced_job(NS, _job("j-bg"))
    core.create_namespaced_pod(NS, _owned_pod("p-bg", job))
    batch.delete_namespaced_job("j-bg", NS, propagation_policy="Background")
    pod = core.read_namespaced_pod("p-bg", NS)  # graceful: Terminating until the kubelet confirms
    assert pod.metadata.deletion_timestamp is not None
    core.delete_namespaced_pod("p-bg", NS, grace_period_seconds=0)  # force delete
    assert kube_server.store.find(PODS, NS, "p-bg") is None

    job = batch.create_namespaced_job(NS, _job("j-orphan"))
    core.create_namespaced_pod(NS, _owned_pod("p-orphan", job))
    batch.delete_namespaced_job("j-orphan", NS)  # batch/v1 defaults to orphaning its pods
    pod = core.read_namespaced_pod("p-orphan", NS)
    assert pod.metadata.deletion_timestamp is None
    assert not pod.metadata.owner_references


def test_foreground_deletion_keeps_the_owner_until_dependents_are_gone(
    batch: Any, core: Any, kube_server: FakeKubeApiServer
) -> None:
    job = batch.create_namespaced_job(NS, _job("j-fg"))
    core.create_namespaced_pod(NS, _owned_pod("p-fg", job))
    batch.delete_namespaced_job("j-fg", NS, propagation_policy="Foreground")
    held = batch.read_namespaced_job("j-fg", NS)
    assert held.metadata.deletion_timestamp is not None
    assert held.metadata.finalizers == ["foregroundDeletion"]
    assert core.read_namespaced_pod("p-fg", NS).metadata.deletion_timestamp is not None
    core.delete_namespaced_pod("p-fg", NS, grace_period_seconds=0)
    assert kube_server.store.find(JOBS, NS, "j-fg") is None


def test_pod_graceful_deletion_and_force_delete(core: Any) -> None:
    core.create_namespaced_pod(NS, _pod("p-1"))
    pending = core.delete_namespaced_pod("p-1", NS)
    assert pending.metadata.deletion_grace_period_seconds == 30
    assert core.read_namespaced_pod("p-1", NS).metadata.deletion_timestamp is not None
    gone = core.delete_namespaced_pod("p-1", NS, grace_period_seconds=0)
    assert gone.metadata.name == "p-1"  # pods answer with the deleted object
    with pytest.raises(client.ApiException) as info:
        core.read_namespaced_pod("p-1", NS)
    assert info.value.status == 404


def test_injected_500_then_success(custom: Any, kube_server: FakeKubeApiServer) -> None:
    kube_server.faults.fail_next(1, status=500, method="POST")
    with pytest.raises(client.ApiException) as info:
        _create(custom, "tj-1")
    assert info.value.status == 500
    assert _status(info.value)["reason"] == "InternalError"
    assert _create(custom, "tj-1")["metadata"]["name"] == "tj-1"
    assert kube_server.faults.pending == 0


def test_injected_429_carries_retry_after(custom: Any, kube_server: FakeKubeApiServer) -> None:
    kube_server.faults.throttle_next(1, retry_after=7, method="POST")
    with pytest.raises(client.ApiException) as info:
        _create(custom, "tj-1")
    assert info.value.status == 429
    assert info.value.headers is not None
    assert info.value.headers["Retry-After"] == "7"
    body = _status(info.value)
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["retryAfterSeconds"] == 7


def test_urllib3_retries_a_throttled_get_by_itself(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    """The client's default urllib3 ``Retry`` honours Retry-After on GET (a real-client fact)."""
    _create(custom, "tj-1")
    kube_server.faults.throttle_next(1, retry_after=1, method="GET")
    started = time.monotonic()
    assert custom.get_namespaced_custom_object(G, V, NS, P, "tj-1")["metadata"]["name"] == "tj-1"
    assert time.monotonic() - started >= 0.9
    assert [r.status for r in kube_server.requests if r.method == "GET"] == [429, 200]


def test_latency_is_added(custom: Any, kube_server: FakeKubeApiServer) -> None:
    kube_server.faults.set_latency(0.3)
    started = time.monotonic()
    custom.list_namespaced_custom_object(G, V, NS, P)
    assert time.monotonic() - started >= 0.3


def test_typed_built_in_kinds_round_trip(
    core: Any, batch: Any, kube_server: FakeKubeApiServer
) -> None:
    job = batch.create_namespaced_job(NS, _job("j-1"))
    assert job.metadata.uid
    assert job.metadata.generation == 1
    assert job.status is None or job.status.active is None  # create clears status
    kube_server.store.create(
        TRAINJOBS, NS, train_job_body("tj-store")
    )  # in-process writes are visible
    assert client.CustomObjectsApi(core.api_client).get_namespaced_custom_object(
        G, V, NS, P, "tj-store"
    )

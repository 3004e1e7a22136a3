"""TrainJob bodies are checked against the real Trainer v2.3.0 CRD, as a real API server would."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from tests.fakes.kube_apiserver import TRAINJOBS, FakeKubeApiServer
from tests.fakes.kube_controller import train_job_body

G, V, P = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
NS = "team-a"


@pytest.fixture
def custom(kube_api_client: Any) -> Any:
    return client.CustomObjectsApi(kube_api_client)


def _invalid(err: client.ApiException) -> dict[str, Any]:
    assert err.status == 422
    body: dict[str, Any] = json.loads(err.body or "")
    assert body["reason"] == "Invalid"
    return body


def test_every_cel_rule_of_the_v2_3_0_crd_is_enforced(kube_server: FakeKubeApiServer) -> None:
    schema = kube_server.store.schema(TRAINJOBS)
    assert schema is not None
    assert (schema.group, schema.version, schema.kind) == (G, V, "TrainJob")
    assert schema.unenforced_rules == []


def test_valid_trainjob_is_accepted(custom: Any) -> None:
    body = train_job_body("tj-ok", env={"DISPATCH_ATTEMPT": "1"})
    body["spec"]["activeDeadlineSeconds"] = 3600
    _, status, headers = custom.create_namespaced_custom_object_with_http_info(G, V, NS, P, body)
    assert status == 201
    assert "Warning" not in headers


def test_wrong_type_is_422_naming_the_field_path(custom: Any) -> None:
    body = train_job_body("tj-bad")
    body["spec"]["trainer"]["numNodes"] = "two"
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, body)
    status = _invalid(info.value)
    cause = status["details"]["causes"][0]
    assert cause == {
        "reason": "FieldValueTypeInvalid",
        "field": "spec.trainer.numNodes",
        "message": 'Invalid value: "two": spec.trainer.numNodes in body must be of type integer: '
        '"string"',
    }
    assert status["message"].startswith('TrainJob.trainer.kubeflow.org "tj-bad" is invalid: ')


def test_missing_required_field(custom: Any) -> None:
    body = train_job_body("tj-bad")
    del body["spec"]["runtimeRef"]
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, body)
    cause = _invalid(info.value)["details"]["causes"][0]
    assert (cause["reason"], cause["field"]) == ("FieldValueRequired", "spec.runtimeRef")


def test_max_length_and_enum_and_max_items(custom: Any, kube_server: FakeKubeApiServer) -> None:
    body = train_job_body("tj-bad")
    body["spec"]["runtimeRef"]["name"] = "x" * 254
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, body)
    assert _invalid(info.value)["details"]["causes"][0]["reason"] == "FieldValueTooLong"

    custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("tj-1"))
    condition = {
        "type": "Complete",
        "status": "Maybe",
        "reason": "X",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object_status(
            G, V, NS, P, "tj-1", {"status": {"conditions": [condition]}}
        )
    cause = _invalid(info.value)["details"]["causes"][0]
    assert (cause["reason"], cause["field"]) == (
        "FieldValueNotSupported",
        "status.conditions[0].status",
    )

    many = [{**condition, "status": "True", "type": f"T{n}"} for n in range(9)]
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object_status(
            G, V, NS, P, "tj-1", {"status": {"conditions": many}}
        )
    cause = _invalid(info.value)["details"]["causes"][0]
    assert (cause["reason"], cause["field"]) == ("FieldValueTooMany", "status.conditions")


def test_name_must_be_an_rfc1035_label_of_63_characters(custom: Any) -> None:
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("a" * 64))
    messages = [c["message"] for c in _invalid(info.value)["details"]["causes"]]
    assert 'Invalid value: "object": metadata.name must be no more than 63 characters' in messages
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("1-starts-with-digit"))
    messages = [c["message"] for c in _invalid(info.value)["details"]["causes"]]
    assert any("RFC 1035" in m for m in messages)


def test_label_values_are_checked(custom: Any) -> None:
    body = train_job_body("tj-1", labels={"dispatch/job-id": "x" * 64})
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, body)
    assert _invalid(info.value)["details"]["causes"][0]["field"] == "metadata.labels"


def test_immutable_fields_cannot_change(custom: Any) -> None:
    custom.create_namespaced_custom_object(G, V, NS, P, train_job_body("tj-1", num_nodes=2))
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object(
            G, V, NS, P, "tj-1", {"spec": {"trainer": {"numNodes": 4}}}
        )
    cause = _invalid(info.value)["details"]["causes"][0]
    assert cause["field"] == "spec.trainer"
    assert cause["message"] == 'Invalid value: "object": field is immutable'
    # suspend is not immutable
    custom.patch_namespaced_custom_object(G, V, NS, P, "tj-1", {"spec": {"suspend": True}})


def test_managed_by_only_takes_the_two_allowed_values(custom: Any) -> None:
    body = train_job_body("tj-1")
    body["spec"]["managedBy"] = "someone-else"
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, body)
    assert _invalid(info.value)["details"]["causes"][0]["field"] == "spec.managedBy"


def test_removed_field_is_dropped_with_a_warning_by_default(custom: Any) -> None:
    body = train_job_body("tj-1")
    body["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}]}]
    body["spec"]["labels"] = {"a": "b"}
    data, status, headers = custom.create_namespaced_custom_object_with_http_info(G, V, NS, P, body)
    assert status == 201
    assert "podTemplateOverrides" not in data["spec"]
    assert "labels" not in data["spec"]
    warning = headers["Warning"]
    assert 'unknown field \\"spec.podTemplateOverrides\\"' in warning
    assert 'unknown field \\"spec.labels\\"' in warning


def test_unknown_field_is_400_under_strict(custom: Any) -> None:
    body = train_job_body("tj-1")
    body["spec"]["podTemplateOverrides"] = []
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, body, field_validation="Strict")
    assert info.value.status == 400
    status = json.loads(info.value.body or "")
    assert status["reason"] == "BadRequest"
    assert 'strict decoding error: unknown field "spec.podTemplateOverrides"' in status["message"]


def test_unknown_field_is_dropped_silently_under_ignore(custom: Any) -> None:
    body = train_job_body("tj-1")
    body["spec"]["podTemplateOverrides"] = []
    data, _, headers = custom.create_namespaced_custom_object_with_http_info(
        G, V, NS, P, body, field_validation="Ignore"
    )
    assert "podTemplateOverrides" not in data["spec"]
    assert "Warning" not in headers


def test_runtime_patches_are_the_v2_2_way_to_reach_pods(custom: Any) -> None:
    body = train_job_body("tj-1")
    body["spec"]["runtimePatches"] = [
        {
            "manager": "dispatch.example/backend",
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "spec": {
                                        "template": {
                                            "metadata": {"labels": {"dispatch/attempt": "3"}},
                                            "spec": {
                                                "containers": [
                                                    {
                                                        "name": "node",
                                                        "env": [
                                                            {"name": "DISPATCH_EPOCH", "value": "2"}
                                                        ],
                                                    }
                                                ]
                                            },
                                        }
                                    }
                                },
                            }
                        ]
                    }
                }
            },
        }
    ]
    data, _, headers = custom.create_namespaced_custom_object_with_http_info(G, V, NS, P, body)
    assert "Warning" not in headers
    assert data["spec"]["runtimePatches"][0]["manager"] == "dispatch.example/backend"

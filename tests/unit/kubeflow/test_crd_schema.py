"""What kube-apiserver 1.20 (the real-apiserver lane) can't check, checked against the unchanged
Trainer v2.3.0 TrainJob CRD with ``tests/fakes/kube_schema.py``: its CEL rules
(``x-kubernetes-validations``, enforced from 1.25) and unknown fields refused under
``fieldValidation=Strict`` (from 1.25; 1.20 prunes them silently). The rest of the schema is the
real server's, on the lane."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fakes.kube_controller import train_job_body
from tests.fakes.kube_schema import TRAINJOB_SCHEMA, StrictDecodingError


def _errors(body: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    _, _, errors = TRAINJOB_SCHEMA.admit(body, old, field_validation="Strict")
    return [(e.field, e.body) for e in errors]


def test_every_cel_rule_of_the_v2_3_0_crd_is_enforced() -> None:
    schema = TRAINJOB_SCHEMA
    assert (schema.group, schema.version, schema.kind) == (
        "trainer.kubeflow.org",
        "v1alpha1",
        "TrainJob",
    )
    assert schema.unenforced_rules == []


def test_a_valid_trainjob_passes() -> None:
    body = train_job_body("tj-ok", env={"DISPATCH_ATTEMPT": "1"})
    obj, warnings, errors = TRAINJOB_SCHEMA.admit(body, None, field_validation="Strict")
    assert (warnings, errors) == ([], [])
    assert obj["metadata"]["name"] == "tj-ok"


def test_cel_managed_by_takes_only_the_two_allowed_values() -> None:
    body = train_job_body("tj-1")
    body["spec"]["managedBy"] = "someone-else"
    assert [f for f, _ in _errors(body)] == ["spec.managedBy"]


def test_cel_name_is_an_rfc1035_label_of_63_characters() -> None:
    too_long = _errors(train_job_body("a" * 64))
    assert any("must be no more than 63 characters" in m for _, m in too_long), too_long
    digit = _errors(train_job_body("1-starts-with-digit"))
    assert any("RFC 1035" in m for _, m in digit), digit


def test_cel_transition_rule_keeps_the_trainer_immutable() -> None:
    old, _, _ = TRAINJOB_SCHEMA.admit(
        train_job_body("tj-1", num_nodes=2), None, field_validation="Strict"
    )
    changed = copy.deepcopy(old)
    changed["spec"]["trainer"]["numNodes"] = 4
    assert ("spec.trainer", 'Invalid value: "object": field is immutable') in _errors(changed, old)
    suspended = copy.deepcopy(old)
    suspended["spec"]["suspend"] = True
    assert _errors(suspended, old) == []


def test_unknown_fields_are_refused_under_strict_and_pruned_with_a_warning_otherwise() -> None:
    body = train_job_body("tj-1")
    body["spec"]["podTemplateOverrides"] = []
    with pytest.raises(StrictDecodingError, match=r"spec\.podTemplateOverrides"):
        TRAINJOB_SCHEMA.admit(body, None, field_validation="Strict")
    obj, warnings, errors = TRAINJOB_SCHEMA.admit(body, None, field_validation="Warn")
    assert "podTemplateOverrides" not in obj["spec"]
    assert warnings == ['unknown field "spec.podTemplateOverrides"']
    assert errors == []

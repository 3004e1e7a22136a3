"""The start gate: Kueue's admission-gated-by annotation or spec.suspend (see
``dispatch_backends.kubeflow.gate``)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_backends.kubeflow.gate import gate_state, gates, open_patch
from dispatch_backends.kubeflow.names import ADMISSION_GATED_BY
from dispatch_backends.kubeflow.objects import TrainJob, decode
from dispatch_backends.kubeflow.settings import GateMode
from dispatch_core.state import GateState
from tests.fakes.kube_patch import apply_json_patch
from tests.unit.kubeflow.records import trainjob

OURS = "dispatch.dev/start-gate"


def gated(value: str | None, *, suspend: bool = True) -> dict[str, Any]:
    annotations = {} if value is None else {ADMISSION_GATED_BY: value}
    return trainjob(annotations=annotations, suspend=suspend)


@pytest.mark.parametrize(
    ("value", "state"),
    [
        (OURS, GateState.CLOSED),
        (f"{OURS},site.example/audit", GateState.ADMIN_HELD),
        ("site.example/audit", GateState.ADMIN_HELD),
        (None, GateState.OPEN),
        ("", GateState.OPEN),
    ],
)
def test_kueue_gate_state(value: str | None, state: GateState) -> None:
    found, words = gate_state(decode(TrainJob, gated(value)), GateMode.KUEUE, OURS)
    assert found is state
    if state is GateState.ADMIN_HELD:
        assert words == f"{ADMISSION_GATED_BY}: {value}"
    else:
        assert words == ""


@pytest.mark.parametrize(
    ("mark", "suspend", "state"),
    [
        ("closed", True, GateState.CLOSED),
        ("open", True, GateState.ADMIN_HELD),
        ("closed", False, GateState.OPEN),
        ("open", False, GateState.OPEN),
    ],
)
def test_suspend_gate_state(mark: str, suspend: bool, state: GateState) -> None:
    tj = trainjob(annotations={"dispatch.dev/gate": mark}, suspend=suspend)
    assert gate_state(decode(TrainJob, tj), GateMode.SUSPEND, OURS)[0] is state


def test_opening_removes_only_our_gate_guarded_by_a_test() -> None:
    tj = gated(f"site.example/a,{OURS},site.example/b")
    patch = open_patch(tj, GateMode.KUEUE, OURS)
    assert patch is not None
    assert patch[0] == {
        "op": "test",
        "path": "/metadata/annotations/kueue.x-k8s.io~1admission-gated-by",
        "value": f"site.example/a,{OURS},site.example/b",
    }
    opened = apply_json_patch(tj, patch)
    assert gates(opened["metadata"]["annotations"]) == ["site.example/a", "site.example/b"]
    only = apply_json_patch(gated(OURS), open_patch(gated(OURS), GateMode.KUEUE, OURS) or [])
    assert ADMISSION_GATED_BY not in only["metadata"]["annotations"]


def test_opening_an_open_gate_is_nothing() -> None:
    assert open_patch(gated(None), GateMode.KUEUE, OURS) is None
    assert open_patch(gated("site.example/a"), GateMode.KUEUE, OURS) is None
    tj = trainjob(annotations={"dispatch.dev/gate": "open"}, suspend=True)
    assert open_patch(tj, GateMode.SUSPEND, OURS) is None, "someone else's suspend stays"


def test_opening_in_suspend_mode_unsuspends() -> None:
    tj = trainjob(annotations={"dispatch.dev/gate": "closed"}, suspend=True)
    opened = apply_json_patch(tj, open_patch(tj, GateMode.SUSPEND, OURS) or [])
    assert opened["spec"]["suspend"] is False
    assert opened["metadata"]["annotations"]["dispatch.dev/gate"] == "open"

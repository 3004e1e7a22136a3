"""The start gate of a TrainJob: reading it, and the patch that opens dispatch's own.

**Kueue mode** (facts B4, KEP 6915): ``kueue.x-k8s.io/admission-gated-by`` is a
comma-separated list of gate names, settable only at creation and afterwards only
shortened. dispatch creates the TrainJob with its own gate (``dispatch.dev/start-gate``):

========================================  ============  ===================================
gates in the annotation                   GateState     why
========================================  ============  ===================================
only dispatch's                           ``closed``    dispatch's gate holds it
someone else's (with or without ours)     ``admin-held``  "another gate left there": dispatch
                                                        never removes it
none                                      ``open``      Kueue may admit it (quota permitting)
========================================  ============  ===================================

Opening removes only dispatch's name, with a JSON patch whose ``test`` operation guards the
value read, so a gate someone adds or removes meanwhile is never overwritten.

**Suspend mode** (no Kueue): the annotation ``dispatch.dev/gate`` says whether dispatch has
opened its gate; ``spec.suspend`` is what holds the TrainJob (facts B1, ``suspend``):

=====================  ==============  ============  =======================================
``dispatch.dev/gate``  ``spec.suspend``  GateState   why
=====================  ==============  ============  =======================================
``closed``             true            ``closed``    dispatch's gate holds it
``open``               true            ``admin-held``  someone else suspended it since
any                    false           ``open``      nothing holds it
=====================  ==============  ============  =======================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatch_backends.kubeflow.names import ADMISSION_GATED_BY, ANNOTATION_GATE
from dispatch_backends.kubeflow.objects import TrainJob
from dispatch_backends.kubeflow.settings import GateMode
from dispatch_core.state import GateState

__all__ = ["gate_state", "gates", "open_patch"]


def gates(annotations: Mapping[str, Any] | None) -> list[str]:
    """The gate names in ``kueue.x-k8s.io/admission-gated-by``, in order."""
    raw = (annotations or {}).get(ADMISSION_GATED_BY) or ""
    return [g.strip() for g in str(raw).split(",") if g.strip()]


def gate_state(trainjob: TrainJob, mode: GateMode, gate_name: str) -> tuple[GateState, str]:
    """Read the start gate of a TrainJob.

    Args:
        trainjob: the TrainJob as the API server returns it.
        mode: the backend's gate mode.
        gate_name: dispatch's own gate name (Kueue mode).

    Returns:
        The gate state and, for ``admin-held``, the scheduler's words saying who holds it
        (kept verbatim in the cause's detail), else ``""``.
    """
    annotations = trainjob.metadata.annotations or {}
    if mode is GateMode.KUEUE:
        names = gates(annotations)
        others = [g for g in names if g != gate_name]
        if others:
            return GateState.ADMIN_HELD, f"{ADMISSION_GATED_BY}: {annotations[ADMISSION_GATED_BY]}"
        if gate_name in names:
            return GateState.CLOSED, ""
        return GateState.OPEN, ""
    if not trainjob.suspended:
        return GateState.OPEN, ""
    if annotations.get(ANNOTATION_GATE) == "closed":
        return GateState.CLOSED, ""
    return GateState.ADMIN_HELD, f"spec.suspend: true ({ANNOTATION_GATE}: open)"


def open_patch(
    trainjob: Mapping[str, Any], mode: GateMode, gate_name: str
) -> list[dict[str, Any]] | None:
    """The JSON patch (RFC 6902) that opens dispatch's gate of ``trainjob``, or ``None`` when
    dispatch's gate is already open.

    The patch starts with a ``test`` of the value it was computed from: if anyone changed it
    meanwhile the server refuses the whole patch (422) and the caller reads again.
    """
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    if mode is GateMode.KUEUE:
        names = gates(annotations)
        if gate_name not in names:
            return None
        path = "/metadata/annotations/" + _escape(ADMISSION_GATED_BY)
        rest = [g for g in names if g != gate_name]
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": path, "value": annotations[ADMISSION_GATED_BY]}
        ]
        if rest:
            ops.append({"op": "replace", "path": path, "value": ",".join(rest)})
        else:
            ops.append({"op": "remove", "path": path})
        return ops
    if annotations.get(ANNOTATION_GATE) != "closed":
        return None
    path = "/metadata/annotations/" + _escape(ANNOTATION_GATE)
    return [
        {"op": "test", "path": path, "value": "closed"},
        {"op": "replace", "path": path, "value": "open"},
        {"op": "replace", "path": "/spec/suspend", "value": False},
    ]


def _escape(key: str) -> str:
    """Escape a map key for a JSON pointer (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")

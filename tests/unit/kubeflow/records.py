"""Recorded-looking Kubernetes objects for the kubeflow backend's unit tests (plain dicts).

Shapes and words follow what the API server returns for Trainer v2.3.0, JobSet v0.12,
batch/v1, core/v1 and Kueue v1beta2 (``shared/labs/kubeflow-facts.md``, B1-B5): conditions
with ``type``/``status``/``reason``/``message``/``lastTransitionTime``, the JobSet labels on
Jobs and pods, container ``state.terminated``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "T0",
    "T1",
    "T2",
    "container_env",
    "job",
    "jobset",
    "node",
    "pod",
    "trainjob",
    "workload",
]

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")

T0 = "2026-08-20T10:00:00Z"
T1 = "2026-08-20T10:00:05Z"
T2 = "2026-08-20T10:00:09Z"


def cond(
    kind: str, status: str = "True", reason: str = "", message: str = "", at: str = T1
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "status": status, "lastTransitionTime": at}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def trainjob(
    name: str = "dj-j1-1-1",
    *,
    job: str | None = "j1",
    submission: str | None = "1",
    attempt: str | None = "1",
    conditions: list[dict[str, Any]] | None = None,
    suspend: bool = False,
    annotations: dict[str, str] | None = None,
    rv: str = "100",
    deleting: bool = False,
    uid: str = "tj-uid",
) -> dict[str, Any]:
    labels = {}
    if job is not None:
        labels["dispatch.dev/job"] = job
    if submission is not None:
        labels["dispatch.dev/submission"] = submission
    if attempt is not None:
        labels["dispatch.dev/attempt"] = attempt
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "uid": uid,
        "resourceVersion": rv,
        "labels": labels,
        "annotations": dict(annotations or {}),
    }
    if deleting:
        meta["deletionTimestamp"] = T2
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend},
        "status": {"conditions": conditions or []},
    }


def jobset(
    name: str = "dj-j1-1-1",
    *,
    restarts: int = 0,
    owner: str = "tj-uid",
    rv: str = "90",
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": "js-uid",
            "resourceVersion": rv,
            "ownerReferences": [{"kind": "TrainJob", "uid": owner, "controller": True}],
        },
        "status": {"restarts": restarts, "conditions": conditions or []},
    }


def job(
    name: str = "dj-j1-1-1-node-0",
    *,
    restart: int = 0,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "dj-j1-1-1",
                "jobset.sigs.k8s.io/restart-attempt": str(restart),
            },
            "ownerReferences": [{"kind": "JobSet", "uid": "js-uid"}],
        },
        "status": {"conditions": conditions or []},
    }


def pod(
    name: str = "dj-j1-1-1-node-0-0-abcde",
    *,
    uid: str = "pod-0",
    node: str = "node-a",
    phase: str = "Running",
    restart: int = 0,
    deleting: bool = False,
    conditions: list[dict[str, Any]] | None = None,
    terminated: dict[str, Any] | None = None,
    rv: str = "50",
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "uid": uid,
        "resourceVersion": rv,
        "labels": {
            "jobset.sigs.k8s.io/jobset-name": "dj-j1-1-1",
            "jobset.sigs.k8s.io/jobset-uid": "js-uid",
            "jobset.sigs.k8s.io/restart-attempt": str(restart),
            "batch.kubernetes.io/job-completion-index": "0",
        },
    }
    if deleting:
        meta["deletionTimestamp"] = T2
    state: dict[str, Any] = {"running": {"startedAt": T0}}
    if terminated is not None:
        state = {"terminated": {"startedAt": T0, "finishedAt": T1, **terminated}}
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions or [],
        "containerStatuses": [{"name": "node", "state": state}],
    }
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "node"}]},
        "status": status,
    }


def node(
    name: str = "node-a",
    ready: str = "True",
    at: str = T0,
    *,
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    """A Node with its Ready condition (the node lifecycle controller's words for
    ``Unknown``, the kubelet's for ``True``, unless given)."""
    if not reason:
        reason, message = (
            ("KubeletReady", "kubelet is posting ready status")
            if ready == "True"
            else ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        )
    return {
        "metadata": {"name": name},
        "status": {"conditions": [cond("Ready", ready, reason, message, at)]},
    }


def workload(
    *,
    evicted: tuple[str, str] | None = None,
    preempted: str | None = None,
    active: bool | None = None,
    rv: str = "95",
) -> dict[str, Any]:
    conditions = []
    if evicted is not None:
        conditions.append(cond("Evicted", "True", evicted[0], evicted[1], T1))
    if preempted is not None:
        conditions.append(cond("Preempted", "True", preempted, evicted[1] if evicted else "", T1))
    spec: dict[str, Any] = {"queueName": "lq"}
    if active is not None:
        spec["active"] = active
    return {
        "metadata": {
            "name": "trainjob-dj-j1-1-1-3f2a1",
            "namespace": "team-a",
            "resourceVersion": rv,
            "ownerReferences": [{"kind": "TrainJob", "uid": "tj-uid"}],
        },
        "spec": spec,
        "status": {"conditions": conditions},
    }


def container_env(pod: Mapping[str, Any], container: int = 0) -> dict[str, str]:
    """The environment a container of ``pod`` gets, resolved as the kubelet does: downward-API
    ``fieldRef`` values from the pod, then ``$(VAR)`` references to variables defined before
    (``$$`` is a literal ``$``; an unresolvable reference stays as written)."""
    env: dict[str, str] = {}
    meta = pod.get("metadata") or {}
    for var in pod["spec"]["containers"][container].get("env") or ():
        if "valueFrom" in var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            match = _LABEL_REF.match(path)
            if match:
                value = str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
            elif path == "spec.nodeName":
                value = str(pod["spec"].get("nodeName") or "")
            else:
                value = str(meta.get(path.removeprefix("metadata."), ""))
        else:

            def expand(m: re.Match[str], known: Mapping[str, str] = dict(env)) -> str:
                if m.group(0) == "$$":
                    return "$"
                return known.get(m.group(1), m.group(0))

            value = _VAR.sub(expand, str(var.get("value", "")))
        env[var["name"]] = value
    return env

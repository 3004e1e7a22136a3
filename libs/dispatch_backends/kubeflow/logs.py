"""Reading a TrainJob's output (``dispatch logs``): the pod logs of its trainer node 0.

The Kubernetes API serves a container's log whole (or its first ``limitBytes``), with no
byte offset, so a read from offset B asks for the first ``B + limit + 1`` bytes and skips B
client-side: bounded, and the one byte more tells whether more is there now. The log is the
container's standard output and standard error together (Kubernetes keeps one log).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from dispatch_backends.kubeflow.names import JOBSET_RESTART_LABEL
from dispatch_backends.protocol import OutputChunk

__all__ = ["log_chunk", "trainer_pod"]

REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"


def _number(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return -1


def trainer_pod(pods: Iterable[Mapping[str, Any]], trainer_job: str) -> Mapping[str, Any] | None:
    """Node 0 of the trainer (replicated job ``trainer_job``, job index 0, completion index
    0) of the latest JobSet restart, among the TrainJob's pods; ``None`` when there is none
    yet."""
    found: list[tuple[int, str, Mapping[str, Any]]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if labels.get(REPLICATED_JOB_LABEL) != trainer_job:
            continue
        if labels.get(JOB_INDEX_LABEL, "0") != "0":
            continue
        index = labels.get(COMPLETION_INDEX, annotations.get(COMPLETION_INDEX, "0"))
        if index != "0":
            continue
        restart = _number(labels.get(JOBSET_RESTART_LABEL, "0"))
        found.append((restart, str(meta.get("creationTimestamp") or ""), pod))
    if not found:
        return None
    return max(found, key=lambda f: (f[0], f[1]))[2]


def log_chunk(
    data: bytes, offset: int, limit: int, *, asked: int, live: bool, where: str
) -> OutputChunk:
    """The chunk at ``offset`` of a log read as its first ``asked`` bytes (``data``)."""
    chunk = data[offset : offset + limit]
    size = len(data) if len(data) < asked else max(len(data), offset + len(chunk) + 1)
    return OutputChunk(data=chunk, offset=offset, size=max(size, offset), live=live, where=where)

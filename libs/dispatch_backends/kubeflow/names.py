"""Names, labels and annotations of dispatch's TrainJobs, and the Kubernetes words they use.

**Naming.** One TrainJob per launch attempt, named ``dj-<job>-<N>-<a>`` (N the submission,
a the attempt). A TrainJob name must be an RFC 1035 label of at most 63 characters (CEL
rules of the v2.3.0 CRD, facts B1) and a job id may itself be 63 characters, so when the
full name does not fit the job id is cut and an 8-hex-digit hash of the whole id keeps it
unique: ``dj-<job prefix>-<sha256(job)[:8]>-<N>-<a>``. Nothing is parsed from the name: the
job id, N and a are labels, and ``dj-<job>`` (up to 66 characters, too long for a label
value) is an annotation.

**Labels** (selectable; values are at most 63 characters):

* ``dispatch.dev/job``: the job id. Every TrainJob with it is reported, and one whose N/a
  labels are missing or unreadable is *foreign* (seed 002) and never touched.
* ``dispatch.dev/submission``, ``dispatch.dev/attempt``: N and a, decimal.

Pods and Jobs are found by the JobSet's own label ``jobset.sigs.k8s.io/jobset-name`` (the
JobSet is named like its TrainJob, facts B1), which a foreign TrainJob's pods carry too.

**Annotations**: ``dispatch.dev/name`` (``dj-<job>``), ``dispatch.dev/generation`` (G),
``dispatch.dev/token`` (the random part of ``DISPATCH_ATTEMPT``), ``dispatch.dev/gate``
(suspend mode: ``closed`` until dispatch opens it), ``dispatch.dev/observed`` (what
discovery decided, see :mod:`dispatch_backends.kubeflow.observe`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

__all__ = [
    "ADMISSION_GATED_BY",
    "ANNOTATION_GATE",
    "ANNOTATION_GENERATION",
    "ANNOTATION_NAME",
    "ANNOTATION_OBSERVED",
    "ANNOTATION_TOKEN",
    "JOBSET",
    "JOBSET_NAME_LABEL",
    "JOBSET_RESTART_LABEL",
    "JOBSET_UID_LABEL",
    "LABEL_ATTEMPT",
    "LABEL_JOB",
    "LABEL_SUBMISSION",
    "MANAGER",
    "MAX_NAME",
    "PRIORITY_CLASS_LABEL",
    "QUEUE_NAME_LABEL",
    "TRAINER",
    "WORKLOAD",
    "read_number",
    "trainjob_name",
]

MAX_NAME: Final = 63
"""TrainJob name limit (RFC 1035 label; CEL rule of the v2.3.0 CRD, facts B1)."""

LABEL_JOB: Final = "dispatch.dev/job"
LABEL_SUBMISSION: Final = "dispatch.dev/submission"
LABEL_ATTEMPT: Final = "dispatch.dev/attempt"
ANNOTATION_NAME: Final = "dispatch.dev/name"
ANNOTATION_GENERATION: Final = "dispatch.dev/generation"
ANNOTATION_TOKEN: Final = "dispatch.dev/token"
ANNOTATION_GATE: Final = "dispatch.dev/gate"
ANNOTATION_OBSERVED: Final = "dispatch.dev/observed"
MANAGER: Final = "dispatch.dev/backend"
"""dispatch's ``spec.runtimePatches[].manager`` (entries are keyed by manager, facts B1)."""

ADMISSION_GATED_BY: Final = "kueue.x-k8s.io/admission-gated-by"
"""Kueue's admission gate annotation: comma-separated gate names, settable at creation only,
afterwards only removable (facts B4, KEP 6915)."""
QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL: Final = "kueue.x-k8s.io/priority-class"
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL: Final = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RESTART_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"
"""Child Jobs and their pods carry the JobSet's ``status.restarts`` here (facts B2)."""

TRAINER: Final = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
"""Group, version and plural of TrainJob: only ``v1alpha1`` exists (facts B1)."""
JOBSET: Final = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
"""The JobSet API the Trainer v2.3.0 pins (facts B2)."""
WORKLOAD: Final = ("kueue.x-k8s.io", "v1beta2", "workloads")
"""Kueue's Workload, storage version since v0.16 (facts B4)."""

_NUMBER: Final = re.compile(r"^[1-9][0-9]{0,8}$")


def trainjob_name(job_id: str, submission: int, attempt: int) -> str:
    """Return the TrainJob name of one launch attempt (see the module docstring).

    Args:
        job_id: the job id (``JOB_ID_PATTERN``: at most 63 of ``[a-z0-9-]``).
        submission: N.
        attempt: a.

    Returns:
        ``dj-<job>-<N>-<a>``, or ``dj-<job prefix>-<hash8>-<N>-<a>`` when that would be
        longer than 63 characters; always an RFC 1035 label.
    """
    tail = f"-{submission}-{attempt}"
    full = f"dj-{job_id}{tail}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    room = MAX_NAME - len("dj-") - len(f"-{digest}{tail}")
    prefix = job_id[:room].rstrip("-")
    return f"dj-{prefix}-{digest}{tail}"


def read_number(mapping: dict[str, Any] | None, key: str) -> int | None:
    """Read a positive decimal (N or a) from labels, or ``None`` when missing or not one."""
    value = (mapping or {}).get(key)
    if not isinstance(value, str) or not _NUMBER.match(value):
        return None
    return int(value)

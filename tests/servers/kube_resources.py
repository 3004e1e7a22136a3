"""The Kubernetes resources the Kubeflow tests read and write, and the shapes their helpers share:
what the scripted cluster simulator (``tests/fakes/kube_controller.py``) and its store on the
real server (``tests/servers/kube_store_api.py``) name a resource by, and the error they raise
for a ``kind: Status`` answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "JOBS",
    "JOBSETS",
    "NODES",
    "PODS",
    "TRAINJOBS",
    "WORKLOADS",
    "AdmissionDenied",
    "ApiError",
    "JsonObject",
    "PatchType",
    "ResourceType",
    "format_time",
]

JsonObject = dict[str, Any]
PatchType = Literal["json", "merge", "strategic", "apply"]


def format_time(moment: datetime) -> str:
    """``moment`` as Kubernetes writes a timestamp (RFC 3339, UTC, whole seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error the API server answered with a ``kind: Status`` body (``code`` is the HTTP
    status, ``reason`` the Status reason, e.g. ``Conflict``)."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details or {})


class AdmissionDenied(Exception):
    """An admission webhook's refusal (``allowed: false``): the API server answers ``code``
    with ``message`` after its own words, ``admission webhook "<name>" denied the request``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass(frozen=True, kw_only=True)
class ResourceType:
    """One resource: where it is served and whether it has a ``/status`` subresource."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of objects of this resource."""
        return f"{self.group}/{self.version}" if self.group else self.version


TRAINJOBS = ResourceType(
    group="trainer.kubeflow.org", version="v1alpha1", plural="trainjobs", kind="TrainJob"
)
JOBSETS = ResourceType(group="jobset.x-k8s.io", version="v1alpha2", plural="jobsets", kind="JobSet")
WORKLOADS = ResourceType(
    group="kueue.x-k8s.io", version="v1beta2", plural="workloads", kind="Workload"
)
JOBS = ResourceType(group="batch", version="v1", plural="jobs", kind="Job")
PODS = ResourceType(group="", version="v1", plural="pods", kind="Pod")
NODES = ResourceType(group="", version="v1", plural="nodes", kind="Node", namespaced=False)

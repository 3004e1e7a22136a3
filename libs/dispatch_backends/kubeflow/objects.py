"""The Kubernetes objects the Kubeflow backend reads, as typed Structs (pure).

Each object the watches or a list deliver is decoded once, by :func:`decode`, into the Struct
of its kind, keeping only the fields the backend reads (msgspec skips every other field of the
JSON without building it). Field names are the API's, in snake case (``resourceVersion`` is
``resource_version``); what the API leaves out is the field's default.

========================  =====================================================================
kind                      what is read
========================  =====================================================================
:class:`TrainJob`         metadata; ``spec.suspend``; ``status.conditions``
:class:`JobSet`           metadata; ``status.restarts``, ``status.conditions``
:class:`Job`              metadata; ``status.conditions``
:class:`Pod`              metadata; ``spec.nodeName``; ``status.phase``/``reason``/``message``,
                          ``conditions``, ``(init)containerStatuses[].state/lastState.terminated``
:class:`Node`             metadata; ``status.conditions``
:class:`Workload`         metadata; ``spec.active``; ``status.conditions``
========================  =====================================================================

Timestamps stay text as the API wrote them (RFC 3339); :func:`parse_time` reads them, and an
unreadable one is "unknown", never an error.

Raises (:func:`decode`): :class:`msgspec.ValidationError` for an object whose fields have the
wrong JSON types; the API server's schemas rule that out for every kind above.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

import msgspec

__all__ = [
    "Condition",
    "ContainerState",
    "ContainerStatus",
    "Job",
    "JobSet",
    "Meta",
    "Node",
    "OwnerReference",
    "Pod",
    "Terminated",
    "TrainJob",
    "Workload",
    "decode",
    "parse_time",
    "reason_words",
]

_T = TypeVar("_T", bound=msgspec.Struct)


def parse_time(value: object) -> datetime | None:
    """Parse a Kubernetes timestamp (RFC 3339, ``Z``), or ``None``."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def reason_words(head: str, reason: str | None, message: str | None) -> str:
    """``<head> (<reason>): <message>``, each part only when the object says it."""
    text = head
    if reason:
        text += f" ({reason})"
    if message:
        text += f": {message}"
    return text


class _Object(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class Condition(_Object, frozen=True, kw_only=True):
    """One status condition, verbatim."""

    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None

    @property
    def true(self) -> bool:
        """Whether ``status`` is ``True``."""
        return self.status == "True"

    @property
    def at(self) -> datetime | None:
        """``lastTransitionTime``, or ``None``."""
        return parse_time(self.last_transition_time)

    def words(self, what: str) -> str:
        """``<what> <type> (<reason>): <message>`` with the condition's own words."""
        return reason_words(f"{what} {self.type}", self.reason, self.message)


class OwnerReference(_Object, frozen=True, kw_only=True):
    """An owner of an object."""

    kind: str = ""
    uid: str = ""


class Meta(_Object, frozen=True, kw_only=True):
    """The ``metadata`` fields the backend reads."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: tuple[OwnerReference, ...] | None = None

    @property
    def rv(self) -> int:
        """The resourceVersion as an integer (0 when absent or not a number)."""
        text = self.resource_version
        return int(text) if text.isdigit() else 0

    @property
    def deleting(self) -> bool:
        """Whether a ``deletionTimestamp`` is set."""
        return bool(self.deletion_timestamp)

    def label(self, key: str) -> str:
        """A label's value (``""`` when absent)."""
        return (self.labels or {}).get(key, "")

    def annotation(self, key: str) -> str:
        """An annotation's value (``""`` when absent)."""
        return (self.annotations or {}).get(key, "")

    def owned_by(self, uid: str) -> bool:
        """Whether an owner reference names ``uid``."""
        return any(r.uid == uid for r in self.owner_references or ())


class _Conditions(_Object, frozen=True, kw_only=True):
    conditions: tuple[Condition, ...] | None = None

    def condition(self, kind: str) -> Condition | None:
        """The condition of type ``kind`` (the first), or ``None``."""
        return next((c for c in self.conditions or () if c.type == kind), None)

    def true(self, kind: str) -> Condition | None:
        """The condition of type ``kind`` if it is ``True``, else ``None``."""
        found = self.condition(kind)
        return found if found is not None and found.true else None


class TrainJobSpec(_Object, frozen=True, kw_only=True):
    suspend: bool | None = None


class TrainJob(_Object, frozen=True, kw_only=True):
    """A ``trainer.kubeflow.org`` TrainJob."""

    metadata: Meta = Meta()
    spec: TrainJobSpec = TrainJobSpec()
    status: _Conditions = _Conditions()

    @property
    def suspended(self) -> bool:
        """``spec.suspend``."""
        return bool(self.spec.suspend)

    @property
    def finished(self) -> bool:
        """Whether it has a ``Complete`` or ``Failed`` condition (whatever its status: the
        Trainer writes them only when they hold, facts B1)."""
        return (
            self.status.condition("Complete") is not None
            or self.status.condition("Failed") is not None
        )


class JobSetStatus(_Conditions, frozen=True, kw_only=True):
    restarts: int | None = None


class JobSet(_Object, frozen=True, kw_only=True):
    """A ``jobset.x-k8s.io`` JobSet."""

    metadata: Meta = Meta()
    status: JobSetStatus = JobSetStatus()

    @property
    def restarts(self) -> int:
        """``status.restarts`` (R, facts B2)."""
        return self.status.restarts or 0


class Job(_Object, frozen=True, kw_only=True):
    """A ``batch/v1`` Job."""

    metadata: Meta = Meta()
    status: _Conditions = _Conditions()


class Terminated(_Object, frozen=True, kw_only=True):
    """A container state's ``terminated``."""

    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    finished_at: str | None = None


class ContainerState(_Object, frozen=True, kw_only=True):
    terminated: Terminated | None = None


class ContainerStatus(_Object, frozen=True, kw_only=True):
    """One container's status: its name and (last) state."""

    name: str = ""
    state: ContainerState | None = None
    last_state: ContainerState | None = None


class PodSpec(_Object, frozen=True, kw_only=True):
    node_name: str | None = None


class PodStatus(_Conditions, frozen=True, kw_only=True):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    init_container_statuses: tuple[ContainerStatus, ...] | None = None
    container_statuses: tuple[ContainerStatus, ...] | None = None


class Pod(_Object, frozen=True, kw_only=True):
    """A ``v1`` Pod."""

    metadata: Meta = Meta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()


class Node(_Object, frozen=True, kw_only=True):
    """A ``v1`` Node."""

    metadata: Meta = Meta()
    status: _Conditions = _Conditions()


class WorkloadSpec(_Object, frozen=True, kw_only=True):
    active: bool | None = None


class Workload(_Object, frozen=True, kw_only=True):
    """A ``kueue.x-k8s.io`` Workload."""

    metadata: Meta = Meta()
    spec: WorkloadSpec = WorkloadSpec()
    status: _Conditions = _Conditions()


def decode(kind: type[_T], obj: Mapping[str, Any]) -> _T:
    """``obj`` (as the API sent it, JSON-decoded) as the Struct ``kind``.

    Raises:
        msgspec.ValidationError: a field of the wrong JSON type.
    """
    return msgspec.convert(obj, kind)

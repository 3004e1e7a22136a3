"""The object store behind the fake Kubernetes API server (TEST DOUBLE, not a real API server).

It holds objects as JSON dicts and applies the registry rules of kube-apiserver that a supervisor
depends on: global integer ``resourceVersion``, ``uid``, ``creationTimestamp``, ``generation``
bumped on spec changes only, the ``status`` subresource split, optimistic concurrency, finalizers
and ``deletionTimestamp``, graceful pod deletion, ``propagationPolicy`` with a synchronous garbage
collector, CRD schema admission, and a bounded per-resource history that watches resume from.

Every mutation goes through here, from HTTP requests and from the scripted cluster simulator
(``kube_controller``) alike, so both produce the same watch events. The store is thread-safe
(one re-entrant lock); listeners are told after each commit.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from tests.fakes.kube_patch import (
    PatchError,
    PatchTestFailed,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from tests.fakes.kube_schema import CrdSchema, FieldError, StrictDecodingError
from tests.fakes.kube_selectors import FieldSelector, LabelSelector, SelectorError

__all__ = [
    "EVENTS",
    "JOBS",
    "JOBSETS",
    "NODES",
    "PODS",
    "RESOURCE_TYPES",
    "TRAINJOBS",
    "WORKLOADS",
    "ApiError",
    "JsonObject",
    "ResourceType",
    "Store",
    "StoredEvent",
    "format_time",
]

JsonObject = dict[str, Any]
Clock = Callable[[], datetime]
PatchType = Literal["json", "merge", "strategic", "apply"]

CRD_DIR = Path(__file__).resolve().parent.parent / "data" / "kubeflow-crds"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SYSTEM_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "namespace",
    "name",
    "selfLink",
)


def format_time(moment: datetime) -> str:
    """Render a timestamp as the API server does (RFC 3339, seconds, ``Z``)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error the API server answers with a ``kind: Status`` body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details or {})
        self.headers = dict(headers or {})

    def status(self) -> JsonObject:
        """Return the ``Status`` object of this error."""
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True, kw_only=True)
class ResourceType:
    """One resource the fake serves, with the registry strategy flags kube-apiserver uses."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = True
    custom: bool = False
    """A CRD-backed resource: no strategic merge patch, PUT needs ``resourceVersion``."""
    tracks_generation: bool = True
    drops_status_on_create: bool = True
    return_deleted_object: bool = False
    graceful_pod_deletion: bool = False
    default_propagation: str = "Background"
    field_selectors: frozenset[str] = frozenset({"metadata.name", "metadata.namespace"})
    schema_file: str | None = None
    """File name under ``tests/data/kubeflow-crds`` of the CRD that validates this resource."""

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of objects of this resource."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``plural.group`` as error messages print it (``pods`` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str, uid: str | None = None) -> JsonObject:
        """The ``details`` of a ``Status`` about one object."""
        out: JsonObject = {"name": name, "kind": self.plural}
        if self.group:
            out["group"] = self.group
        if uid:
            out["uid"] = uid
        return out


TRAINJOBS = ResourceType(
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    kind="TrainJob",
    custom=True,
    schema_file="trainer.kubeflow.org_trainjobs.yaml",
)
JOBSETS = ResourceType(
    group="jobset.x-k8s.io", version="v1alpha2", plural="jobsets", kind="JobSet", custom=True
)
WORKLOADS = ResourceType(
    group="kueue.x-k8s.io", version="v1beta2", plural="workloads", kind="Workload", custom=True
)
JOBS = ResourceType(
    group="batch",
    version="v1",
    plural="jobs",
    kind="Job",
    # batch/v1 keeps OrphanDependents as its default for backwards compatibility
    # (pkg/registry/batch/job/strategy.go DefaultGarbageCollectionPolicy).
    default_propagation="Orphan",
)
PODS = ResourceType(
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    return_deleted_object=True,
    graceful_pod_deletion=True,
    field_selectors=frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "status.phase",
            "spec.restartPolicy",
        }
    ),
)
EVENTS = ResourceType(
    group="",
    version="v1",
    plural="events",
    kind="Event",
    status_subresource=False,
    tracks_generation=False,
    drops_status_on_create=False,
    field_selectors=frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
        }
    ),
)
NODES = ResourceType(
    group="",
    version="v1",
    plural="nodes",
    kind="Node",
    namespaced=False,
    tracks_generation=False,
    drops_status_on_create=False,
)
RESOURCE_TYPES: tuple[ResourceType, ...] = (
    TRAINJOBS,
    JOBSETS,
    WORKLOADS,
    JOBS,
    PODS,
    EVENTS,
    NODES,
)


@functools.cache
def _schema(file_name: str) -> CrdSchema:
    return CrdSchema.load(CRD_DIR / file_name)


@dataclass(frozen=True, kw_only=True)
class StoredEvent:
    """One change in the history: what a watch sends (``prev`` is for selector transitions)."""

    rv: int
    type: str
    resource: ResourceType
    obj: JsonObject
    prev: JsonObject | None


def _meta(obj: Mapping[str, Any]) -> JsonObject:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _without(obj: Mapping[str, Any], *keys: str) -> JsonObject:
    return {k: v for k, v in obj.items() if k not in keys}


def _invalid(rt: ResourceType, name: str, errors: Iterable[FieldError]) -> ApiError:
    errs = list(errors)
    text = (
        "; ".join(str(e) for e in errs)
        if len(errs) == 1
        else "[" + ", ".join(str(e) for e in errs) + "]"
    )
    kind_group = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    return ApiError(
        422,
        "Invalid",
        f'{kind_group} "{name}" is invalid: {text}',
        details={
            "name": name,
            **({"group": rt.group} if rt.group else {}),
            "kind": rt.kind,
            "causes": [{"reason": e.reason, "message": e.body, "field": e.field} for e in errs],
        },
    )


@dataclass(kw_only=True)
class _TypeState:
    objects: dict[tuple[str, str], JsonObject] = field(default_factory=dict)
    history: deque[StoredEvent] = field(default_factory=deque)
    floor: int = 0
    """Watches may resume from any resourceVersion >= floor; older ones get 410 Expired."""


MutatingHook = Callable[[str, ResourceType, JsonObject, JsonObject | None], JsonObject]
ValidatingHook = Callable[[str, ResourceType, JsonObject, JsonObject | None], None]


class Store:
    """Objects, resourceVersions and history of the fake API server."""

    def __init__(
        self,
        *,
        types: Iterable[ResourceType] = RESOURCE_TYPES,
        watch_cache_size: int = 1000,
        clock: Clock | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._clock: Clock = clock or (lambda: datetime.now(UTC))
        self._rv = 1
        self._cache_size = watch_cache_size
        self._types = {(t.group, t.plural): t for t in types}
        self._state = {key: _TypeState() for key in self._types}
        self._listeners: list[Callable[[], None]] = []
        self.mutating_hooks: list[MutatingHook] = []
        """Admission hooks ``(operation, type, object, old) -> object`` run before validation."""
        self.validating_hooks: list[ValidatingHook] = []
        """Admission hooks ``(operation, type, object, old)`` that raise ApiError to refuse."""
        for t in self._types.values():
            if t.schema_file:
                _schema(t.schema_file)  # load once, at start, so a bad CRD fails early

    # -- lookup ---------------------------------------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        """The store's lock, for callers that need several reads to be consistent."""
        return self._lock

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock()

    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self._lock:
            return self._rv

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        """Find a served resource.

        Raises:
            ApiError: 404 when the group/version/plural is not served.
        """
        rt = self._types.get((group, plural))
        if rt is None or rt.version != version:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    def schema(self, rt: ResourceType) -> CrdSchema | None:
        """The CRD schema that validates ``rt``, if any."""
        return _schema(rt.schema_file) if rt.schema_file else None

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from the writing thread) after every commit."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``."""
        with self._lock:
            self._listeners.remove(listener)

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return (namespace or "" if rt.namespaced else "", name)

    def _current(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObject:
        obj = self._state[(rt.group, rt.plural)].objects.get(self._key(rt, namespace, name))
        if obj is None:
            raise ApiError(
                404, "NotFound", f'{rt.qualified} "{name}" not found', details=rt.details(name)
            )
        return obj

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObject:
        """Return a copy of one object.

        Raises:
            ApiError: 404 NotFound.
        """
        with self._lock:
            return copy.deepcopy(self._current(rt, namespace, name))

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObject | None:
        """Return a copy of one object, or None when it does not exist."""
        with self._lock:
            obj = self._state[(rt.group, rt.plural)].objects.get(self._key(rt, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list_objects(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[list[JsonObject], int, str | None]:
        """List objects sorted by namespace and name.

        Returns:
            The items, the list's resourceVersion, and a continue token when ``limit`` cut it.

        Raises:
            ApiError: 400 BadRequest for a bad selector or continue token.
        """
        labels, fields = self.selectors(rt, label_selector, field_selector)
        with self._lock:
            objects = self._state[(rt.group, rt.plural)].objects
            keys = sorted(k for k in objects if namespace is None or k[0] == namespace)
            start_after: list[str] | None = None
            if continue_token:
                try:
                    start_after = json.loads(base64.urlsafe_b64decode(continue_token))["start"]
                except (ValueError, KeyError, TypeError) as err:
                    raise ApiError(400, "BadRequest", "continue key is not valid") from err
            items: list[JsonObject] = []
            next_token: str | None = None
            for key in keys:
                if start_after is not None and list(key) <= start_after:
                    continue
                obj = objects[key]
                if labels.matches(_meta(obj).get("labels")) and fields.matches(obj):
                    if limit and len(items) == limit:
                        last = items[-1]["metadata"]
                        token = {"start": [last.get("namespace", ""), last["name"]]}
                        next_token = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
                        break
                    items.append(copy.deepcopy(obj))
            return items, self._rv, next_token

    def selectors(
        self, rt: ResourceType, label_selector: str | None, field_selector: str | None
    ) -> tuple[LabelSelector, FieldSelector]:
        """Parse selectors for ``rt``.

        Raises:
            ApiError: 400 BadRequest when a selector does not parse.
        """
        try:
            return (
                LabelSelector.parse(label_selector),
                FieldSelector.parse(field_selector, rt.field_selectors),
            )
        except SelectorError as err:
            raise ApiError(400, "BadRequest", str(err)) from err

    # -- history --------------------------------------------------------------------------------

    def events_since(self, rt: ResourceType, rv: int) -> tuple[list[StoredEvent], int]:
        """Return the events of ``rt`` after ``rv`` and the newest resourceVersion.

        Raises:
            ApiError: 410 Expired when ``rv`` is older than the retained history.
        """
        with self._lock:
            state = self._state[(rt.group, rt.plural)]
            if rv < state.floor:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({state.floor})")
            return [e for e in state.history if e.rv > rv], self._rv

    def compact(self, rt: ResourceType | None = None) -> None:
        """Forget the history (of one resource, or all): older resourceVersions give 410."""
        with self._lock:
            for key, state in self._state.items():
                if rt is None or key == (rt.group, rt.plural):
                    state.history.clear()
                    state.floor = self._rv

    def _commit(
        self,
        rt: ResourceType,
        event_type: str,
        obj: JsonObject,
        prev: JsonObject | None,
    ) -> JsonObject:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        state = self._state[(rt.group, rt.plural)]
        key = self._key(rt, _meta(obj).get("namespace"), obj["metadata"]["name"])
        if event_type == "DELETED":
            state.objects.pop(key, None)
        else:
            state.objects[key] = obj
        if len(state.history) >= self._cache_size:
            state.floor = state.history.popleft().rv
        state.history.append(
            StoredEvent(
                rv=self._rv,
                type=event_type,
                resource=rt,
                obj=copy.deepcopy(obj),
                prev=copy.deepcopy(prev) if prev is not None else None,
            )
        )
        for listener in list(self._listeners):
            listener()
        return obj

    # -- admission ------------------------------------------------------------------------------

    def _validate_meta(self, rt: ResourceType, obj: JsonObject) -> list[FieldError]:
        meta = _meta(obj)
        errors: list[FieldError] = []
        name = meta.get("name", "")
        if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            errors.append(
                FieldError(
                    reason="FieldValueInvalid",
                    field="metadata.name",
                    body=f"Invalid value: {json.dumps(name)}: a lowercase RFC 1123 subdomain must "
                    "consist of lower case alphanumeric characters, '-' or '.', and must start "
                    "and end with an alphanumeric character",
                )
            )
        for kind in ("labels", "annotations"):
            entries = meta.get(kind) or {}
            if not isinstance(entries, Mapping):
                errors.append(
                    FieldError(
                        reason="FieldValueTypeInvalid",
                        field=f"metadata.{kind}",
                        body="Invalid value: must be a map of strings",
                    )
                )
                continue
            for key, value in entries.items():
                prefix, _, local = key.rpartition("/")
                if (
                    len(local) > 63
                    or not _LABEL_NAME.match(local)
                    or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
                ):
                    errors.append(
                        FieldError(
                            reason="FieldValueInvalid",
                            field=f"metadata.{kind}",
                            body=f"Invalid value: {json.dumps(key)}: name part must consist of "
                            "alphanumeric characters, '-', '_' or '.', and must start and end "
                            "with an alphanumeric character (and be at most 63 characters)",
                        )
                    )
                if not isinstance(value, str):
                    errors.append(
                        FieldError(
                            reason="FieldValueTypeInvalid",
                            field=f"metadata.{kind}",
                            body=f"Invalid value: {json.dumps(value)}: must be a string",
                        )
                    )
                elif kind == "labels" and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                    errors.append(
                        FieldError(
                            reason="FieldValueInvalid",
                            field="metadata.labels",
                            body=f"Invalid value: {json.dumps(value)}: a valid label must be an "
                            "empty string or consist of alphanumeric characters, '-', '_' or '.', "
                            "and must start and end with an alphanumeric character (at most 63 "
                            "characters)",
                        )
                    )
        return errors

    def _admit(
        self,
        operation: str,
        rt: ResourceType,
        obj: JsonObject,
        old: JsonObject | None,
        field_validation: str,
    ) -> tuple[JsonObject, list[str]]:
        if field_validation not in ("Ignore", "Warn", "Strict"):
            raise ApiError(
                400,
                "BadRequest",
                'fieldValidation must be one of "Ignore", "Warn" or "Strict", '
                f'got "{field_validation}"',
            )
        warnings: list[str] = []
        errors: list[FieldError] = []
        name = _meta(obj).get("name", "")
        schema = self.schema(rt)
        if schema is not None:
            try:
                obj, warnings, errors = schema.admit(obj, old, field_validation=field_validation)
            except StrictDecodingError as err:
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {err}',
                ) from err
        for hook in self.mutating_hooks:
            obj = hook(operation, rt, obj, old)
        errors = self._validate_meta(rt, obj) + errors
        if errors:
            raise _invalid(rt, name, errors)
        for check in self.validating_hooks:
            check(operation, rt, obj, old)
        return obj, warnings

    # -- writes ---------------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Mapping[str, Any],
        *,
        field_validation: str = "Warn",
    ) -> tuple[JsonObject, list[str]]:
        """Create an object (POST).

        Returns:
            The stored object and the warnings for the ``Warning`` header.

        Raises:
            ApiError: 400 for a body that does not fit the request, 409 AlreadyExists,
                422 Invalid.
        """
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
        obj = copy.deepcopy(dict(body))
        self._check_type_meta(rt, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            else:
                raise _invalid(
                    rt,
                    "",
                    [
                        FieldError(
                            reason="FieldValueRequired",
                            field="metadata.name",
                            body="Required value: name or generateName is required",
                        )
                    ],
                )
        for key in (
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
            "managedFields",
        ):
            meta.pop(key, None)
        if rt.status_subresource and rt.drops_status_on_create:
            obj.pop("status", None)
        with self._lock:
            obj, warnings = self._admit("CREATE", rt, obj, None, field_validation)
            meta = obj["metadata"]
            if self.find(rt, namespace, meta["name"]) is not None:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{rt.qualified} "{meta["name"]}" already exists',
                    details=rt.details(meta["name"]),
                )
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = format_time(self.now())
            if rt.tracks_generation:
                meta["generation"] = 1
            if rt.kind == "Pod":
                obj.setdefault("status", {}).setdefault("phase", "Pending")
            self._commit(rt, "ADDED", obj, None)
            self._collect_garbage()
            return copy.deepcopy(obj), warnings

    def _check_type_meta(self, rt: ResourceType, obj: Mapping[str, Any]) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if rt.custom and (not api_version or not kind):
            missing = "Kind" if not kind else "apiVersion"
            raise ApiError(
                400, "BadRequest", f"Object '{missing}' is missing in '{json.dumps(obj)[:200]}'"
            )
        if api_version and api_version != rt.api_version:
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.api_version})",
            )
        if kind and kind != rt.kind:
            raise ApiError(
                400,
                "BadRequest",
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})",
            )

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
        field_validation: str = "Warn",
    ) -> tuple[JsonObject, list[str]]:
        """Replace an object or its status (PUT).

        Raises:
            ApiError: 404 NotFound, 409 Conflict on a stale resourceVersion, 422 Invalid,
                400 BadRequest.
        """
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
        with self._lock:
            old = self._current(rt, namespace, name)
            return self._update(rt, old, copy.deepcopy(dict(body)), subresource, field_validation)

    def _update(
        self,
        rt: ResourceType,
        old: JsonObject,
        body: JsonObject,
        subresource: str | None,
        field_validation: str,
    ) -> tuple[JsonObject, list[str]]:
        name = old["metadata"]["name"]
        self._check_type_meta(rt, body)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = body["metadata"] = {}
        if meta.get("name") not in (None, name):
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})",
            )
        given_rv = meta.get("resourceVersion")
        if not given_rv and rt.custom:
            raise _invalid(
                rt,
                name,
                [
                    FieldError(
                        reason="FieldValueInvalid",
                        field="metadata.resourceVersion",
                        body="Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        if given_rv and given_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                details=rt.details(name),
            )
        if subresource == "status":
            if not rt.status_subresource:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        else:
            new = body
            if rt.status_subresource:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            new_meta = new["metadata"]
            for key in _SYSTEM_META:
                if key in old["metadata"]:
                    new_meta[key] = copy.deepcopy(old["metadata"][key])
                else:
                    new_meta.pop(key, None)
            new_meta.pop("managedFields", None)
            if rt.kind == "Pod" and "nodeName" in old.get("spec", {}):
                new.setdefault("spec", {})["nodeName"] = old["spec"]["nodeName"]
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if old["metadata"].get("deletionTimestamp"):
            added = set(new["metadata"].get("finalizers") or ()) - set(
                old["metadata"].get("finalizers") or ()
            )
            if added:
                raise _invalid(
                    rt,
                    name,
                    [
                        FieldError(
                            reason="FieldValueForbidden",
                            field="metadata.finalizers",
                            body="Forbidden: no new finalizers can be added if the object is being "
                            "deleted, found new finalizers " + json.dumps(sorted(added)),
                        )
                    ],
                )
        new, warnings = self._admit("UPDATE", rt, new, old, field_validation)
        if new == old:
            return copy.deepcopy(old), warnings  # a no-op write keeps its resourceVersion
        if rt.tracks_generation and _without(new, "metadata", "status") != _without(
            old, "metadata", "status"
        ):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        prev = copy.deepcopy(old)
        self._commit(rt, "MODIFIED", new, prev)
        self._finalize_if_done(rt, new)
        self._collect_garbage()
        return copy.deepcopy(new), warnings

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: PatchType,
        patch: Any,
        *,
        subresource: str | None = None,
        field_validation: str = "Warn",
    ) -> tuple[JsonObject, list[str]]:
        """Patch an object or its status (PATCH).

        Raises:
            ApiError: 415 for strategic merge on custom resources (and for apply patches, which
                this fake does not implement), 400/422 for patches that do not apply,
                404, 409, 422 as for update.
        """
        if patch_type == "apply":
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "server-side apply (application/apply-patch+yaml) is not implemented by this fake "
                "API server",
            )
        if patch_type == "strategic" and rt.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        with self._lock:
            old = self._current(rt, namespace, name)
            try:
                if patch_type == "json":
                    patched = apply_json_patch(old, patch)
                elif patch_type == "merge":
                    if not isinstance(patch, Mapping):
                        raise PatchError("merge patch must be a JSON object")
                    patched = apply_merge_patch(old, patch)
                else:
                    patched = apply_strategic_merge_patch(old, patch, rt.kind)
            except PatchTestFailed as err:
                raise ApiError(422, "Invalid", str(err)) from err
            except PatchError as err:
                raise ApiError(400, "BadRequest", str(err)) from err
            if not isinstance(patched, dict):
                raise ApiError(400, "BadRequest", "the patched object is not a JSON object")
            meta = patched.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise ApiError(400, "BadRequest", "metadata must be an object")
            if not meta.get("resourceVersion"):
                meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self._update(rt, old, patched, subresource, field_validation)

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        """Delete an object (DELETE), honouring finalizers, grace and propagation.

        Returns:
            The object (still present with ``deletionTimestamp``, or just deleted for kinds that
            return it) or a ``Status`` of success.

        Raises:
            ApiError: 404 NotFound, 409 Conflict on failed preconditions, 400 BadRequest.
        """
        policy = propagation_policy or rt.default_propagation
        if policy not in ("Foreground", "Background", "Orphan"):
            raise ApiError(
                400,
                "BadRequest",
                f'propagationPolicy: Unsupported value: "{policy}": supported values: '
                '"Foreground", "Background", "Orphan"',
            )
        with self._lock:
            old = self._current(rt, namespace, name)
            meta = old["metadata"]
            for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = (preconditions or {}).get(key)
                if wanted and wanted != meta.get(key):
                    raise ApiError(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {rt.qualified} "{name}": Precondition '
                        f"failed: {label} in precondition: {wanted}, {label} in object meta: "
                        f"{meta.get(key)}",
                        details=rt.details(name),
                    )
            grace = 0
            if rt.graceful_pod_deletion:
                default = old.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                grace = default if grace_period_seconds is None else grace_period_seconds
                phase = old.get("status", {}).get("phase")
                if not old.get("spec", {}).get("nodeName") or phase in ("Succeeded", "Failed"):
                    grace = 0
            new = copy.deepcopy(old)
            new_meta = new["metadata"]
            if new_meta.get("deletionTimestamp"):
                current_grace = new_meta.get("deletionGracePeriodSeconds", 0)
                if rt.graceful_pod_deletion and grace < current_grace:
                    # A shorter grace period (the kubelet's final grace-0 delete, or a force
                    # delete) replaces the pending one; with no finalizers the pod goes at once.
                    new_meta["deletionGracePeriodSeconds"] = grace
                    new_meta["deletionTimestamp"] = format_time(
                        self.now() + timedelta(seconds=grace)
                    )
                    gone = grace == 0 and not new_meta.get("finalizers")
                    self._commit(rt, "DELETED" if gone else "MODIFIED", new, old)
                    self._collect_garbage()
                    return self._delete_answer(rt, new, deleted=gone)
                return self._delete_answer(rt, new)
            new_meta["deletionTimestamp"] = format_time(self.now() + timedelta(seconds=grace))
            new_meta["deletionGracePeriodSeconds"] = grace
            if rt.tracks_generation:
                new_meta["generation"] = new_meta.get("generation", 1) + 1
            finalizers = list(new_meta.get("finalizers") or ())
            extra = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(policy)
            if extra and extra not in finalizers:
                finalizers.append(extra)
            if finalizers:
                new_meta["finalizers"] = finalizers
            if not finalizers and grace == 0:
                self._commit(rt, "DELETED", new, old)
                self._collect_garbage()
                return self._delete_answer(rt, new, deleted=True)
            self._commit(rt, "MODIFIED", new, old)
            self._collect_garbage()
            gone = self.find(rt, namespace, name) is None
            return self._delete_answer(rt, new, deleted=gone)

    def _delete_answer(
        self, rt: ResourceType, obj: JsonObject, *, deleted: bool = False
    ) -> JsonObject:
        if deleted and not rt.return_deleted_object:
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": rt.details(obj["metadata"]["name"], obj["metadata"].get("uid")),
            }
        return copy.deepcopy(obj)

    def _finalize_if_done(self, rt: ResourceType, obj: JsonObject) -> None:
        meta = obj["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and meta.get("deletionGracePeriodSeconds", 0) == 0
        ):
            stored = self.find(rt, meta.get("namespace"), meta["name"])
            if stored is not None:
                self._commit(rt, "DELETED", stored, copy.deepcopy(stored))

    # -- garbage collection ---------------------------------------------------------------------

    def _all_objects(self) -> list[tuple[ResourceType, JsonObject]]:
        return [
            (self._types[key], obj)
            for key, state in self._state.items()
            for obj in list(state.objects.values())
        ]

    def _collect_garbage(self) -> None:
        """Run the garbage collector's rules to a fixed point, synchronously.

        The real garbage collector is an asynchronous controller; here its decisions happen
        inside the write that triggers them, in the same order (orphan, foreground, dangling).
        """
        for _ in range(10_000):
            if not self._gc_step():
                return
        raise AssertionError("garbage collector did not converge")

    def _gc_step(self) -> bool:
        objects = self._all_objects()
        uids = {obj["metadata"]["uid"] for _, obj in objects}
        dependents: dict[str, list[tuple[ResourceType, JsonObject, JsonObject]]] = {}
        for rt, obj in objects:
            for ref in obj["metadata"].get("ownerReferences") or ():
                dependents.setdefault(ref.get("uid", ""), []).append((rt, obj, ref))
        for rt, obj in objects:
            meta = obj["metadata"]
            finalizers = list(meta.get("finalizers") or ())
            if not meta.get("deletionTimestamp"):
                refs = meta.get("ownerReferences") or ()
                if refs and not any(ref.get("uid") in uids for ref in refs):
                    policy = "Foreground" if dependents.get(meta["uid"]) else "Background"
                    self.delete(rt, meta.get("namespace"), meta["name"], propagation_policy=policy)
                    return True
                continue
            if "orphan" in finalizers:
                for drt, dep, _ in dependents.get(meta["uid"], []):
                    new = copy.deepcopy(dep)
                    new["metadata"]["ownerReferences"] = [
                        r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != meta["uid"]
                    ]
                    if not new["metadata"]["ownerReferences"]:
                        del new["metadata"]["ownerReferences"]
                    self._commit(drt, "MODIFIED", new, dep)
                self._remove_finalizer(rt, obj, "orphan")
                return True
            if "foregroundDeletion" in finalizers:
                deps = dependents.get(meta["uid"], [])
                for drt, dep, _ in deps:
                    if not dep["metadata"].get("deletionTimestamp"):
                        policy = (
                            "Foreground" if dependents.get(dep["metadata"]["uid"]) else "Background"
                        )
                        self.delete(
                            drt,
                            dep["metadata"].get("namespace"),
                            dep["metadata"]["name"],
                            propagation_policy=policy,
                        )
                        return True
                if not any(ref.get("blockOwnerDeletion") for _, _, ref in deps):
                    self._remove_finalizer(rt, obj, "foregroundDeletion")
                    return True
        return False

    def _remove_finalizer(self, rt: ResourceType, obj: JsonObject, finalizer: str) -> None:
        new = copy.deepcopy(obj)
        rest = [f for f in new["metadata"].get("finalizers") or () if f != finalizer]
        if rest:
            new["metadata"]["finalizers"] = rest
        else:
            new["metadata"].pop("finalizers", None)
        self._commit(rt, "MODIFIED", new, obj)
        self._finalize_if_done(rt, new)

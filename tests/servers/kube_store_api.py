"""The scripted cluster simulator's window on a REAL kube-apiserver (the real-apiserver lane).

:class:`tests.fakes.kube_controller.ClusterSimulator` plays Trainer, JobSet, Job, Kueue and the
kubelets by reading and writing through a store. :class:`ApiStore` is that store, answered by
the real server over HTTP: every
write is a real POST/PUT (``/status`` for statuses)/PATCH/DELETE, carries the resourceVersion it
read (a stale one is the server's 409), and reaches the backend's watches as the server streams
it. The simulator's background thread wakes on real watches (one per resource, from
``resourceVersion`` onwards, re-listing after a 410).

What a lone kube-apiserver does not do, and this store does in :meth:`collect_garbage` (called
by the simulator once per reconcile pass): the garbage collector of kube-controller-manager
(foreground deletion: dependents deleted, then ``foregroundDeletion`` removed; ``orphan``;
dependents whose owners are all gone are deleted).

Isolation: the lane's server is shared by the session's tests, so a store works in ONE namespace
(lists with ``namespace=None`` mean that namespace) and sees only the nodes it created (label
:data:`NODE_OWNER_LABEL`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3

from tests.servers.kube_resources import (
    JOBS,
    JOBSETS,
    NODES,
    PODS,
    TRAINJOBS,
    WORKLOADS,
    ApiError,
    JsonObject,
    PatchType,
    ResourceType,
)

__all__ = ["NODE_OWNER_LABEL", "ApiStore"]

NODE_OWNER_LABEL = "lane.dispatch.dev/namespace"
_OWNED_KINDS = (TRAINJOBS, JOBSETS, WORKLOADS, JOBS, PODS)
_PATCH_TYPES = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


def _path(rt: ResourceType, namespace: str | None, name: str | None = None) -> str:
    base = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    if rt.namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{rt.plural}"
    if name:
        base += f"/{name}"
    return base


class ApiStore:
    """The simulator's store, answered by a real API server (see the module docstring)."""

    def __init__(self, url: str, token: str, ca_file: str, namespace: str) -> None:
        """Work on the server at ``url`` with bearer ``token`` (an admin's: it plays the
        controllers), verifying its certificate against ``ca_file``, in ``namespace``."""
        self._base = url.rstrip("/")
        self._token = token
        self._http = urllib3.PoolManager(maxsize=8, cert_reqs="CERT_REQUIRED", ca_certs=ca_file)
        self.namespace = namespace
        self._lock = threading.RLock()
        self._writes = 0
        self._listeners: list[Callable[[], None]] = []
        self._watchers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._pruned: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}

    # -- the Store surface the simulator uses ---------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        """Serialises the simulator's own passes (other writers meet the server's 409s)."""
        return self._lock

    def now(self) -> datetime:
        """Wall-clock time (the server's clock is the same machine's)."""
        return datetime.now(UTC)

    def resource_version(self) -> int:
        """How many writes through this store changed an object: the simulator settles when a
        pass makes none."""
        return self._writes

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        answer = self._request(method, path, body=body, query=query, content_type=content_type)
        data = answer.data
        try:
            result: JsonObject = json.loads(data) if data else {}
        except ValueError:
            result = {"message": data.decode(errors="replace")}
        if not 200 <= answer.status < 300:
            raise ApiError(
                answer.status,
                str(result.get("reason") or answer.reason or ""),
                str(result.get("message") or ""),
                details=result.get("details") or None,
            )
        return result

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout_s: float = 60.0,
    ) -> Any:
        url = self._base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return self._http.request(
            method,
            url,
            body=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
            preload_content=not stream,
            timeout=urllib3.Timeout(connect=10, read=timeout_s),
            retries=False,
        )

    def _ns(self, rt: ResourceType, namespace: str | None) -> str | None:
        return (namespace or self.namespace) if rt.namespaced else None

    def _typed(self, rt: ResourceType, obj: JsonObject) -> JsonObject:
        obj.setdefault("apiVersion", rt.api_version)
        obj.setdefault("kind", rt.kind)
        meta = obj.get("metadata") or {}
        kept = self._pruned.get((rt.plural, str(meta.get("namespace", "")), str(meta.get("name"))))
        for part, fields in (kept or {}).items():
            target = obj.setdefault(part, {})
            for key, value in fields.items():
                target.setdefault(key, value)
        return obj

    def _remember_pruned(self, rt: ResourceType, sent: JsonObject, got: JsonObject) -> None:
        """Keep what the server pruned from what the simulator wrote (top-level ``spec`` and
        ``status`` fields 1.20 does not know, e.g. a Job's ``suspend`` (1.21),
        ``status.ready`` (1.23), ``status.terminating`` (1.28)), so the simulator's own reads
        see them again. The backend, reading through the server, sees what 1.20 kept."""
        if rt not in (JOBS, PODS):
            return
        meta = got.get("metadata") or {}
        key = (rt.plural, str(meta.get("namespace", "")), str(meta.get("name")))
        kept = self._pruned.setdefault(key, {})
        for part in ("spec", "status"):
            if not isinstance(sent.get(part), dict):
                continue
            fields = kept.setdefault(part, {})
            for name, value in sent[part].items():
                if name not in (got.get(part) or {}):
                    fields[name] = value
                else:
                    fields.pop(name, None)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObject:
        """GET one object (ApiError 404 when missing)."""
        return self._typed(rt, self._call("GET", _path(rt, self._ns(rt, namespace), name)))

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObject | None:
        """GET one object, ``None`` when missing."""
        try:
            return self.get(rt, namespace, name)
        except ApiError as err:
            if err.code == 404:
                return None
            raise

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
        """LIST in this store's namespace (nodes: those it created), sorted by name."""
        query: list[tuple[str, Any]] = []
        selectors = [s for s in (label_selector,) if s]
        if rt is NODES or rt == NODES:
            selectors.append(f"{NODE_OWNER_LABEL}={self.namespace}")
        if selectors:
            query.append(("labelSelector", ",".join(selectors)))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if limit:
            query.append(("limit", limit))
        if continue_token:
            query.append(("continue", continue_token))
        answer = self._call("GET", _path(rt, self._ns(rt, namespace)), query=query)
        items = [self._typed(rt, i) for i in answer.get("items") or ()]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        meta = answer.get("metadata") or {}
        return items, int(meta.get("resourceVersion") or 0), meta.get("continue") or None

    def create(
        self, rt: ResourceType, namespace: str | None, body: Mapping[str, Any], **_: Any
    ) -> tuple[JsonObject, list[str]]:
        """POST; a node is labelled as this store's."""
        obj = json.loads(json.dumps(body))
        if rt == NODES:
            obj.setdefault("metadata", {}).setdefault("labels", {})[NODE_OWNER_LABEL] = (
                self.namespace
            )
        status = obj.get("status") if rt.status_subresource else None
        answer = self._call("POST", _path(rt, self._ns(rt, namespace)), body=obj)
        self._remember_pruned(rt, {"spec": obj.get("spec")}, answer)
        made = self._typed(rt, answer)
        self._writes += 1
        if rt == NODES and made["spec"].get("taints"):
            # the TaintNodesByCondition admission plugin registers every node with the
            # not-ready taint; the node lifecycle controller (kube-controller-manager, not
            # running here) lifts it once the kubelet reports Ready, as this does
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (status or {}).get("conditions") or ()
            )
            if ready:
                made["spec"]["taints"] = [
                    t
                    for t in made["spec"]["taints"]
                    if t.get("key") != "node.kubernetes.io/not-ready"
                ] or None
                made = self.update(rt, namespace, made["metadata"]["name"], made)[0]
        if status and made.get("status") != status:
            # the server drops (or resets) status on create: write it through /status, as the
            # controller that made the object would in its next step
            made["status"] = status
            made = self.update(rt, namespace, made["metadata"]["name"], made, subresource="status")[
                0
            ]
        return made, []

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> tuple[JsonObject, list[str]]:
        """PUT the object (or its ``/status``) with the resourceVersion it carries.

        A pod given a ``nodeName`` it did not have is bound instead (``pods/binding``, as the
        scheduler does: a pod's update may not set it)."""
        obj = self._typed(rt, json.loads(json.dumps(body)))
        node = (obj.get("spec") or {}).get("nodeName")
        if rt == PODS and not subresource and node:
            current = self.get(rt, namespace, name)
            if not current["spec"].get("nodeName"):
                binding = {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                }
                self._call(
                    "POST", _path(rt, self._ns(rt, namespace), name) + "/binding", body=binding
                )
                self._writes += 1
                return self.get(rt, namespace, name), []
        path = _path(rt, self._ns(rt, namespace), name) + ("/status" if subresource else "")
        before = str((body.get("metadata") or {}).get("resourceVersion") or "")
        answer = self._call("PUT", path, body=obj)
        part = "status" if subresource else "spec"
        self._remember_pruned(rt, {part: obj.get(part)}, answer)
        made = self._typed(rt, answer)
        if made["metadata"].get("resourceVersion") != before:
            self._writes += 1
        return made, []

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: PatchType,
        patch: Any,
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> tuple[JsonObject, list[str]]:
        """PATCH (json, merge or strategic) the object or its ``/status``."""
        path = _path(rt, self._ns(rt, namespace), name) + ("/status" if subresource else "")
        made = self._call("PATCH", path, body=patch, content_type=_PATCH_TYPES[patch_type])
        self._writes += 1
        return self._typed(rt, made), []

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
        """DELETE with the given options."""
        options: JsonObject = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = dict(preconditions)
        answer = self._call("DELETE", _path(rt, self._ns(rt, namespace), name), body=options)
        self._writes += 1
        return answer

    # -- the garbage collector a lone apiserver lacks -------------------------------------------

    def collect_garbage(self) -> None:
        """One pass of kube-controller-manager's garbage collector over this namespace."""
        objects: list[tuple[ResourceType, JsonObject]] = []
        for rt in _OWNED_KINDS:
            items, _, _ = self.list_objects(rt)
            objects.extend((rt, o) for o in items)
        uids = {o["metadata"]["uid"] for _, o in objects}
        dependents: dict[str, list[tuple[ResourceType, JsonObject]]] = {}
        for rt, obj in objects:
            for ref in obj["metadata"].get("ownerReferences") or ():
                dependents.setdefault(str(ref.get("uid")), []).append((rt, obj))
        for rt, obj in objects:
            meta = obj["metadata"]
            name = meta["name"]
            finalizers = list(meta.get("finalizers") or ())
            with contextlib.suppress(ApiError):
                owners = [str(r.get("uid")) for r in meta.get("ownerReferences") or ()]
                if (
                    owners
                    and not any(u in uids for u in owners)
                    and not meta.get("deletionTimestamp")
                ):
                    self.delete(rt, None, name, propagation_policy="Background")
                    continue
                if not meta.get("deletionTimestamp"):
                    continue
                mine = dependents.get(meta["uid"], [])
                if "orphan" in finalizers:
                    for drt, dep in mine:
                        refs = [
                            r
                            for r in dep["metadata"].get("ownerReferences") or ()
                            if r.get("uid") != meta["uid"]
                        ]
                        self.patch(
                            drt,
                            None,
                            dep["metadata"]["name"],
                            "merge",
                            {"metadata": {"ownerReferences": refs or None}},
                        )
                    self._drop_finalizer(rt, obj, "orphan")
                elif "foregroundDeletion" in finalizers:
                    blocking = [
                        (drt, dep)
                        for drt, dep in mine
                        if any(
                            r.get("uid") == meta["uid"] and r.get("blockOwnerDeletion")
                            for r in dep["metadata"].get("ownerReferences") or ()
                        )
                    ]
                    for drt, dep in mine:
                        if not dep["metadata"].get("deletionTimestamp"):
                            self.delete(
                                drt, None, dep["metadata"]["name"], propagation_policy="Foreground"
                            )
                    if not blocking:
                        self._drop_finalizer(rt, obj, "foregroundDeletion")

    def _drop_finalizer(self, rt: ResourceType, obj: JsonObject, finalizer: str) -> None:
        """Remove ``finalizer`` as the garbage collector does: a merge patch of the finalizers
        guarded by the resourceVersion read."""
        meta = obj["metadata"]
        left = [f for f in meta.get("finalizers") or () if f != finalizer]
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"], "finalizers": left or None}
        }
        with contextlib.suppress(ApiError):  # changed or gone meanwhile: the next pass sees it
            self.patch(rt, None, meta["name"], "merge", body)

    # -- real watches wake the simulator --------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` on every change the server streams (watches start with the first)."""
        self._listeners.append(listener)
        if not self._watchers:
            for rt in (*_OWNED_KINDS, NODES):
                thread = threading.Thread(
                    target=self._watch, args=(rt,), name=f"lane-watch-{rt.plural}", daemon=True
                )
                self._watchers.append(thread)
                thread.start()

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``; the watches end with the last listener."""
        self._listeners.remove(listener)
        if not self._listeners:
            self._stop.set()
            for thread in self._watchers:
                thread.join(30)
            self._watchers.clear()
            self._stop.clear()

    def _wake(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _watch(self, rt: ResourceType) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    _, list_rv, _ = self.list_objects(rt)
                    rv = str(list_rv)
                    self._wake()
                query: list[tuple[str, Any]] = [
                    ("watch", "true"),
                    ("resourceVersion", rv),
                    ("timeoutSeconds", 2),
                    ("allowWatchBookmarks", "true"),
                ]
                if rt == NODES:
                    query.append(("labelSelector", f"{NODE_OWNER_LABEL}={self.namespace}"))
                answer = self._request(
                    "GET", _path(rt, self._ns(rt, None)), query=query, stream=True, timeout_s=30
                )
                if answer.status != 200:
                    answer.release_conn()
                    raise ApiError(answer.status, str(answer.reason), "watch refused")
                buffer = b""
                try:
                    for chunk in answer.stream(decode_content=True):
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for raw in lines:
                            if not raw.strip():
                                continue
                            event = json.loads(raw)
                            if event.get("type") == "ERROR":
                                rv = ""  # 410 Expired (or another error): list again
                                break
                            rv = str(event["object"]["metadata"].get("resourceVersion") or rv)
                            if event.get("type") != "BOOKMARK":
                                self._wake()
                        if self._stop.is_set() or not rv:
                            break
                finally:
                    answer.release_conn()
            except (ApiError, OSError, ValueError, KeyError):
                rv = ""
                self._stop.wait(0.2)
            except Exception:  # urllib3 protocol errors when a stream is cut
                rv = ""
                self._stop.wait(0.2)
            else:
                if not rv:
                    time.sleep(0.05)

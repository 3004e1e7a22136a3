"""TEST DOUBLE: a fake Kubernetes API server, for tests only; it is not kube-apiserver.

The real ``kubernetes`` Python client talks to this aiohttp server over loopback HTTP. It serves
the paths, verbs, status codes, ``Status`` bodies and watch protocol that the backend relies on,
for:

- ``trainer.kubeflow.org/v1alpha1`` ``trainjobs`` (validated against the real v2.3.0 CRD,
  ``tests/data/kubeflow-crds``), ``jobset.x-k8s.io/v1alpha2`` ``jobsets``,
  ``kueue.x-k8s.io/v1beta2`` ``workloads``, ``batch/v1`` ``jobs``, and core ``v1`` ``pods``,
  ``events`` and (cluster-scoped) ``nodes``;
- ``/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/status]]`` (``/api/v1/...`` for the
  core group) and the cluster-wide ``/apis/{group}/{version}/{plural}`` list/watch paths;
  ``/version``. No discovery: the typed clients and ``CustomObjectsApi`` do not ask for it.

Behaviour kept faithful (the store's rules are in :mod:`tests.fakes.kube_store`): POST answers
201 (409 AlreadyExists); GET/LIST with ``labelSelector``, ``fieldSelector``, ``limit`` and
``continue``; PUT with optimistic concurrency (409 Conflict); PATCH as merge patch and JSON patch,
strategic merge refused with 415 on custom resources and applied (minimally, see
:mod:`tests.fakes.kube_patch`) on built-in kinds; the ``/status`` subresource split; DELETE with
finalizers, ``deletionTimestamp``, graceful pod deletion, ``gracePeriodSeconds=0`` force delete and
``propagationPolicy`` cascades; ``fieldValidation`` Ignore/Warn/Strict with ``Warning`` headers.

Watches (``?watch=true``) stream line-delimited JSON events after ``resourceVersion`` from a
bounded per-resource history, send ``BOOKMARK`` events when ``allowWatchBookmarks=true`` (every
``bookmark_interval`` seconds and just before the stream's timeout), close after
``timeoutSeconds``, and answer an expired ``resourceVersion`` with an ``ERROR`` event carrying a
``Status`` of code 410, reason ``Expired``: the three behaviours of the Python client's
``Watch.stream`` that the facts file lists (one retry on 410, then ``ApiException(410)``; no
reconnect when ``timeout_seconds`` is passed; no reconnect once no event carried a
``resourceVersion``) follow from that and are pinned by ``tests/unit/kube_fake``.

Fault injection is a Python API (:class:`Faults`, plus :meth:`FakeKubeApiServer.drop_watches` and
:meth:`FakeKubeApiServer.expire_watch_cache`), so a test states the fault where it happens: the
outages (500/429/503/504), a watch dropped after a chosen event. The Kubeflow backend's tests
run on a real kube-apiserver (``tests/servers/kube.py``, see ``tests/README.md``); this fake
stays for the faults that must hit one exact request or event, and for its own unit tests.
Credentials refused (401/403), RBAC, resourceVersions, watches and 410 Expired are the real
server's, on that lane.

Known deviations from a real API server:

- No authentication or authorization (the real-apiserver lane has both), admission
  webhooks (tests can add Python hooks to the store), API priority and fairness, or server-side
  apply (``application/apply-patch+yaml`` gets 415), no ``managedFields``, no ``dryRun`` (400),
  no ``deletecollection`` (405), no discovery.
- Namespaces exist implicitly; creating into any namespace works.
- The garbage collector runs synchronously inside the write that triggers it (the real one is an
  asynchronous controller), so cascades are complete when the DELETE returns, except for what
  waits on finalizers or on the kubelet (pods pending graceful deletion).
- Lists always come from the current state: ``resourceVersion``/``resourceVersionMatch`` on a
  list do not select an older snapshot, and ``continue`` pages are not snapshot-consistent.
- A watch from a ``resourceVersion`` newer than the store's answers an ``ERROR`` event 504
  (the real server first waits up to 3 s for it to appear).
- Only TrainJobs are schema-validated (the Trainer CRD is the one we ship); JobSets, Workloads and
  the built-in kinds are checked for ``metadata`` (name, labels, annotations) only.
- CEL rules: see :mod:`tests.fakes.kube_schema` (all 17 of the v2.3.0 TrainJob CRD are enforced).
- Validation messages follow the API server's ``field.Error`` wording closely, not byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from aiohttp import web
from multidict import CIMultiDict

from tests.fakes.kube_store import (
    EVENTS,
    JOBS,
    JOBSETS,
    NODES,
    PODS,
    RESOURCE_TYPES,
    TRAINJOBS,
    WORKLOADS,
    ApiError,
    Clock,
    JsonObject,
    PatchType,
    ResourceType,
    Store,
    StoredEvent,
)

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
    "FakeKubeApiServer",
    "Faults",
    "RecordedRequest",
    "ResourceType",
    "Store",
]

_PATCH_TYPES: dict[str, PatchType] = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}
_T = TypeVar("_T")

_FAULT_REASONS = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: fault injected by the test double"),
    503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
    504: ("Timeout", "The server was unable to return a response in the time allotted"),
}


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One request the fake answered, for assertions in tests."""

    method: str
    path: str
    query: Mapping[str, str]
    status: int
    content_type: str | None


@dataclass(kw_only=True)
class _FailRule:
    remaining: int
    status: int
    retry_after: int | None
    method: str | None
    path_contains: str | None
    watch: bool | None

    def applies(self, method: str, path: str, is_watch: bool) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.path_contains is None or self.path_contains in path)
            and (self.watch is None or self.watch == is_watch)
        )


@dataclass(kw_only=True)
class _WatchDrop:
    after_events: int
    abrupt: bool
    resource: ResourceType | None


class Faults:
    """Faults the next requests meet; every method is safe to call from the test's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_FailRule] = []
        self._drops: list[_WatchDrop] = []
        self._latency = 0.0

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 500,
        retry_after: int | None = None,
        method: str | None = None,
        path_contains: str | None = None,
        watch: bool | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with ``status`` and a ``Status`` body.

        Args:
            count: how many requests get the error.
            status: 500 (InternalError), 429 (TooManyRequests), 503, 504 (the outages).
                Credentials refused (401/403) are the real server's, on the real-apiserver
                lane (tests/integration/backends/test_kubeflow_real_credentials.py).
            retry_after: seconds for a ``Retry-After`` header (and ``details.retryAfterSeconds``).
            method: only requests with this HTTP method (``GET``, ``POST``, ...).
            path_contains: only requests whose path contains this text (``/trainjobs``).
            watch: only watch requests (True), only non-watch requests (False), or both (None).
        """
        if status not in _FAULT_REASONS:
            raise ValueError(f"fail_next: status {status} is not one of {sorted(_FAULT_REASONS)}")
        with self._lock:
            self._rules.append(
                _FailRule(
                    remaining=count,
                    status=status,
                    retry_after=retry_after,
                    method=method,
                    path_contains=path_contains,
                    watch=watch,
                )
            )

    def throttle_next(
        self,
        count: int = 1,
        *,
        retry_after: int = 1,
        method: str | None = None,
        path_contains: str | None = None,
        watch: bool | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with 429 TooManyRequests + Retry-After."""
        self.fail_next(
            count,
            status=429,
            retry_after=retry_after,
            method=method,
            path_contains=path_contains,
            watch=watch,
        )

    def set_latency(self, seconds: float) -> None:
        """Delay every answer (and the start of every watch) by ``seconds``."""
        with self._lock:
            self._latency = seconds

    def drop_next_watch(
        self, *, after_events: int = 0, abrupt: bool = False, resource: ResourceType | None = None
    ) -> None:
        """Cut the next watch (of ``resource``, or any) once it has sent ``after_events`` events.

        A clean drop ends the chunked response as the server does on its own timeout; an abrupt
        one resets the connection, as an API server restart or a load balancer would.
        """
        with self._lock:
            self._drops.append(
                _WatchDrop(after_events=after_events, abrupt=abrupt, resource=resource)
            )

    def clear(self) -> None:
        """Remove every pending fault and the latency."""
        with self._lock:
            self._rules.clear()
            self._drops.clear()
            self._latency = 0.0

    @property
    def pending(self) -> int:
        """How many injected error answers are still to be given."""
        with self._lock:
            return sum(r.remaining for r in self._rules)

    def _latency_now(self) -> float:
        with self._lock:
            return self._latency

    def _take_failure(self, method: str, path: str, is_watch: bool) -> _FailRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.remaining > 0 and rule.applies(method, path, is_watch):
                    rule.remaining -= 1
                    return rule
            self._rules = [r for r in self._rules if r.remaining > 0]
            return None

    def _take_drop(self, rt: ResourceType) -> _WatchDrop | None:
        with self._lock:
            for n, drop in enumerate(self._drops):
                if drop.resource is None or drop.resource == rt:
                    return self._drops.pop(n)
            return None


@dataclass(kw_only=True, eq=False)
class _Watcher:
    resource: ResourceType
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    drop: str | None = None  # "clean" or "abrupt"


@dataclass(frozen=True, kw_only=True)
class _Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _status_response(err: ApiError) -> web.Response:
    headers = CIMultiDict(err.headers)
    return web.json_response(err.status(), status=err.code, headers=headers)


def _warning_header(text: str) -> str:
    return "299 - " + json.dumps(text)


def _bool(value: str | None) -> bool:
    return value in ("true", "1", "True")


class FakeKubeApiServer:
    """The fake API server: an aiohttp app on 127.0.0.1, run in a background thread.

    Example::

        with FakeKubeApiServer() as server:
            api = kubernetes.client.CustomObjectsApi(server.api_client())
            server.faults.fail_next(1, status=500)
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        watch_cache_size: int = 1000,
        bookmark_interval: float = 60.0,
        default_watch_timeout: float = 1800.0,
        clock: Clock | None = None,
    ) -> None:
        """Prepare the server (not started).

        Args:
            host: address to bind; loopback only.
            port: port to bind; 0 picks a free one.
            watch_cache_size: events kept per resource for watches to resume from.
            bookmark_interval: seconds between BOOKMARK events (the real server: about 60).
            default_watch_timeout: stream lifetime when ``timeoutSeconds`` is absent (the real
                server picks 30-60 minutes).
            clock: source of timestamps (timezone-aware), for tests that move time.
        """
        self.store = Store(watch_cache_size=watch_cache_size, clock=clock)
        self.faults = Faults()
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self._host, self._port = host, port
        self._requests: list[RecordedRequest] = []
        self._requests_lock = threading.Lock()
        self._watchers: set[_Watcher] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._bound_port = 0

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        if not self._bound_port:
            raise RuntimeError("FakeKubeApiServer is not started")
        return f"http://{self._host}:{self._bound_port}"

    def start(self) -> Self:
        """Start the server thread and wait until it listens."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as err:  # reported to start()'s caller
                failure.append(err)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fake-kube-apiserver", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise RuntimeError("fake API server failed to start") from failure[0]
        self.store.add_listener(self._on_commit)
        return self

    def stop(self) -> None:
        """End the watches, stop the server and join its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(ValueError):
            self.store.remove_listener(self._on_commit)
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self._bound_port = sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        for watcher in list(self._watchers):
            watcher.drop = "clean"
            watcher.wake.set()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- client side helpers --------------------------------------------------------------------

    def client_configuration(self) -> Any:
        """A ``kubernetes.client.Configuration`` pointing at this server."""
        from kubernetes import client  # the test tree's only kubernetes import at module use

        config = client.Configuration()
        config.host = self.url
        return config

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for this server; close it when done."""
        from kubernetes import client

        return client.ApiClient(self.client_configuration())

    # -- test controls --------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """The requests answered so far, oldest first."""
        with self._requests_lock:
            return list(self._requests)

    def active_watches(self, resource: ResourceType | None = None) -> int:
        """How many watch streams are open (of ``resource``, or all)."""
        return self._call(
            lambda: sum(1 for w in self._watchers if resource is None or w.resource == resource)
        )

    def wait_for_watches(
        self, count: int, resource: ResourceType | None = None, timeout: float = 10.0
    ) -> None:
        """Block until at least ``count`` watches are open.

        Raises:
            TimeoutError: they did not open in time.
        """
        deadline = time.monotonic() + timeout
        while self.active_watches(resource) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"expected {count} open watches, have {self.active_watches(resource)}"
                )
            time.sleep(0.01)

    def drop_watches(self, *, abrupt: bool = False, resource: ResourceType | None = None) -> int:
        """Cut the open watch streams now (of ``resource``, or all); returns how many."""

        def drop() -> int:
            hit = [w for w in self._watchers if resource is None or w.resource == resource]
            for watcher in hit:
                watcher.drop = "abrupt" if abrupt else "clean"
                watcher.wake.set()
            return len(hit)

        return self._call(drop)

    def expire_watch_cache(self, resource: ResourceType | None = None) -> None:
        """Compact the history: watches from an older resourceVersion now get 410 Expired."""
        self.store.compact(resource)

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the server's loop (which owns the watch registry); return its result."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("FakeKubeApiServer is not started")

        async def run() -> _T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(30)

    def _on_commit(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for watcher in self._watchers:
            watcher.wake.set()

    # -- HTTP -----------------------------------------------------------------------------------

    def _record(self, request: web.Request, status: int) -> None:
        with self._requests_lock:
            self._requests.append(
                RecordedRequest(
                    method=request.method,
                    path=request.path,
                    query=dict(request.query),
                    status=status,
                    content_type=request.headers.get("Content-Type"),
                )
            )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        is_watch = request.method == "GET" and _bool(request.query.get("watch"))
        latency = self.faults._latency_now()
        if latency:
            await asyncio.sleep(latency)
        rule = self.faults._take_failure(request.method, request.path, is_watch)
        if rule is not None:
            reason, message = _FAULT_REASONS[rule.status]
            headers: dict[str, str] = {}
            details: dict[str, Any] = {}
            if rule.retry_after is not None:
                headers["Retry-After"] = str(rule.retry_after)
                details["retryAfterSeconds"] = rule.retry_after
            self._record(request, rule.status)
            return _status_response(
                ApiError(rule.status, reason, message, details=details, headers=headers)
            )
        try:
            response = await self._dispatch(request, is_watch)
        except ApiError as err:
            response = _status_response(err)
        if isinstance(response, web.Response):  # a watch stream recorded itself when it opened
            self._record(request, response.status)
        return response

    def _target(self, request: web.Request) -> _Target | web.Response:
        parts = [p for p in request.path.split("/") if p]
        not_found = ApiError(404, "NotFound", "the server could not find the requested resource")
        if parts == ["version"]:
            return web.json_response(
                {
                    "major": "1",
                    "minor": "36",
                    "gitVersion": "v1.36.0-fake",
                    "platform": "linux/amd64",
                }
            )
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise not_found
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        rt = self.store.resource(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if len(rest) > 3 or (sub is not None and sub != "status"):
            raise not_found
        if namespace is not None and not rt.namespaced:
            raise not_found
        if namespace is None and rt.namespaced and name is not None:
            raise not_found
        return _Target(rt=rt, namespace=namespace, name=name, subresource=sub)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise ApiError(400, "BadRequest", f"invalid JSON in the request body: {err}") from err

    async def _dispatch(self, request: web.Request, is_watch: bool) -> web.StreamResponse:
        target = self._target(request)
        if isinstance(target, web.Response):
            return target
        rt, ns, name, sub = target.rt, target.namespace, target.name, target.subresource
        query = request.query
        if query.get("dryRun"):
            raise ApiError(400, "BadRequest", "dryRun is not implemented by this fake API server")
        validation = query.get("fieldValidation") or "Warn"
        method = request.method
        store = self.store
        if name is None:
            if method == "GET":
                if is_watch:
                    return await self._watch(request, rt, ns)
                limit = int(query["limit"]) if query.get("limit") else None
                items, rv, token = store.list_objects(
                    rt,
                    ns,
                    label_selector=query.get("labelSelector"),
                    field_selector=query.get("fieldSelector"),
                    limit=limit,
                    continue_token=query.get("continue"),
                )
                meta: JsonObject = {"resourceVersion": str(rv)}
                if token:
                    meta["continue"] = token
                return web.json_response(
                    {
                        "kind": f"{rt.kind}List",
                        "apiVersion": rt.api_version,
                        "metadata": meta,
                        "items": items,
                    }
                )
            if method == "POST":
                if ns is None and rt.namespaced:
                    raise ApiError(
                        405,
                        "MethodNotAllowed",
                        "the server does not allow this method on the requested resource",
                    )
                self._require_json(request)
                obj, warnings = store.create(
                    rt, ns, await self._body(request), field_validation=validation
                )
                return self._object_response(obj, 201, warnings)
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        if method == "GET":
            return web.json_response(store.get(rt, ns, name))
        if method == "PUT":
            self._require_json(request)
            obj, warnings = store.update(
                rt,
                ns,
                name,
                await self._body(request),
                subresource=sub,
                field_validation=validation,
            )
            return self._object_response(obj, 200, warnings)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            patch_type = _PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    "include: "
                    f"{', '.join(_PATCH_TYPES)}",
                )
            obj, warnings = store.patch(
                rt,
                ns,
                name,
                patch_type,
                await self._body(request),
                subresource=sub,
                field_validation=validation,
            )
            return self._object_response(obj, 200, warnings)
        if method == "DELETE" and sub is None:
            options = await self._body(request) or {}
            if not isinstance(options, Mapping):
                raise ApiError(400, "BadRequest", "DeleteOptions must be a JSON object")
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            policy = query.get("propagationPolicy", options.get("propagationPolicy"))
            if policy is None and options.get("orphanDependents") is not None:
                policy = "Orphan" if options["orphanDependents"] else "Background"
            result = store.delete(
                rt,
                ns,
                name,
                grace_period_seconds=int(grace) if grace is not None else None,
                propagation_policy=policy,
                preconditions=options.get("preconditions"),
            )
            return web.json_response(result)
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    @staticmethod
    def _require_json(request: web.Request) -> None:
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if content_type not in ("application/json", ""):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: "
                f"application/json, application/yaml, application/vnd.kubernetes.protobuf "
                f'(got "{content_type}")',
            )

    @staticmethod
    def _object_response(obj: JsonObject, status: int, warnings: list[str]) -> web.Response:
        headers: CIMultiDict[str] = CIMultiDict()
        for text in warnings:
            headers.add("Warning", _warning_header(text))
        return web.json_response(obj, status=status, headers=headers)

    # -- watch ----------------------------------------------------------------------------------

    def _event_for(
        self, event: StoredEvent, namespace: str | None, labels: Any, fields: Any
    ) -> JsonObject | None:
        """What this watcher sees of one stored event (selector transitions included)."""
        obj = event.obj
        if namespace is not None and obj["metadata"].get("namespace") != namespace:
            return None

        def matches(candidate: JsonObject | None) -> bool:
            return (
                candidate is not None
                and labels.matches(candidate["metadata"].get("labels"))
                and fields.matches(candidate)
            )

        now = matches(obj)
        before = matches(event.prev) if event.type == "MODIFIED" else now
        if event.type == "MODIFIED":
            if now and before:
                return {"type": "MODIFIED", "object": obj}
            if now:
                return {"type": "ADDED", "object": obj}
            if before:
                return {"type": "DELETED", "object": obj}
            return None
        return {"type": event.type, "object": obj} if now else None

    async def _watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.StreamResponse:
        query = request.query
        labels, fields = self.store.selectors(
            rt, query.get("labelSelector"), query.get("fieldSelector")
        )
        timeout = float(query.get("timeoutSeconds") or self.default_watch_timeout)
        bookmarks = _bool(query.get("allowWatchBookmarks"))
        raw_rv = query.get("resourceVersion") or ""
        try:
            start_rv = int(raw_rv) if raw_rv else 0
        except ValueError as err:
            raise ApiError(400, "BadRequest", f"invalid resource version: {raw_rv!r}") from err

        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._record(request, response.status)
        watcher = _Watcher(resource=rt)
        drop_rule = self.faults._take_drop(rt)
        self._watchers.add(watcher)
        sent = 0

        async def send(payload: JsonObject) -> None:
            await response.write(json.dumps(payload).encode() + b"\n")

        async def send_error(err: ApiError) -> None:
            await send({"type": "ERROR", "object": err.status()})

        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            with self.store.lock:
                current = self.store.resource_version()
                if start_rv == 0:
                    initial, _, _ = self.store.list_objects(
                        rt,
                        namespace,
                        label_selector=query.get("labelSelector"),
                        field_selector=query.get("fieldSelector"),
                    )
                    cursor = current
                elif start_rv > current:
                    initial, cursor = [], -1
                else:
                    initial, cursor = [], start_rv
            if cursor < 0:
                await send_error(
                    ApiError(
                        504,
                        "Timeout",
                        f"Too large resource version: {start_rv}, current: {current}",
                    )
                )
                return response
            for obj in initial:
                await send({"type": "ADDED", "object": obj})
                sent += 1
            next_bookmark = loop.time() + self.bookmark_interval
            while True:
                watcher.wake.clear()
                try:
                    events, newest = self.store.events_since(rt, cursor)
                except ApiError as err:
                    await send_error(err)
                    return response
                for event in events:
                    if drop_rule is not None and sent >= drop_rule.after_events:
                        watcher.drop = "abrupt" if drop_rule.abrupt else "clean"
                        break
                    payload = self._event_for(event, namespace, labels, fields)
                    cursor = event.rv
                    if payload is not None:
                        await send(payload)
                        sent += 1
                else:
                    cursor = max(cursor, newest)
                if drop_rule is not None and sent >= drop_rule.after_events:
                    watcher.drop = watcher.drop or ("abrupt" if drop_rule.abrupt else "clean")
                if watcher.drop is not None:
                    break
                now = loop.time()
                if bookmarks and now >= next_bookmark:
                    await send(self._bookmark(rt, cursor))
                    next_bookmark = now + self.bookmark_interval
                if now >= deadline:
                    if bookmarks:
                        await send(self._bookmark(rt, cursor))
                    break
                wait = min(deadline, next_bookmark if bookmarks else deadline) - now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watcher.wake.wait(), timeout=max(wait, 0.0))
            if watcher.drop == "abrupt":
                transport = request.transport
                if transport is not None:
                    transport.abort()
                raise asyncio.CancelledError  # nothing more can be written on this connection
            return response
        finally:
            self._watchers.discard(watcher)

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int) -> JsonObject:
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": rt.kind,
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(rv)},
            },
        }

"""One list-then-watch per resource and namespace, in its own thread (client-go's reflector).

A :class:`Reflector` lists its resource once (paged, by label selector), then watches from
the list's resourceVersion with bookmarks, for ``watch_timeout_s`` at a time; when a stream
ends (its timeout, a dropped connection, an API server restart) it watches again from the
last resourceVersion it saw, so no event is missed; when that resourceVersion has expired
(410 ``Expired``, as an ``ERROR`` event or an error answer) it lists again. Every object
version it receives goes to ``on_object`` (and ``on_deleted`` for deletions, including
objects a relist no longer shows), so the backend can keep evidence that a later list
would not show any more (a preempted pod's ``DisruptionTarget``).

``progress`` is the highest resourceVersion the reflector knows it has seen everything up
to: raised by each event, by each bookmark, and by each list. On a quiet stream only
bookmarks raise it: a recent kube-apiserver sends one from its watch cache about once a
minute and about 2 s before a watch's timeout (facts file, Part A); 1.20.2 sent none at all
(measured on the real-apiserver lane), nor does any server for a resource it serves without
a watch cache; the backend bounds its wait with ``evidence_wait_s``. The backend decides an
end only once every reflector's progress has reached the resourceVersion of the objects
showing it (or that bound has passed).

The blocking ``kubernetes`` client runs here, outside the event loop, on the reflector's own
``ApiClient`` (so a long watch never holds a connection the backend's calls need).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

__all__ = ["ListFn", "Reflector", "status_words"]

log = logging.getLogger("dispatch_backends.kubeflow")

ListFn = Callable[..., Any]
"""A generated client's list method (``list_namespaced_pod``, a bound
``list_namespaced_custom_object`` with group/version/namespace/plural, ...)."""

T = TypeVar("T")

_PAGE: Final = 500
_BACKOFF_S: Final = (0.2, 0.5, 1.0, 2.0, 5.0)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Reflector(Generic[T]):
    """List-then-watch of one resource (see the module docstring), each object decoded once,
    as it arrives, into a ``T``."""

    def __init__(
        self,
        name: str,
        list_fn: ListFn,
        *,
        decode: Callable[[Mapping[str, Any]], T],
        label_selector: str | None,
        on_object: Callable[[T], None],
        on_deleted: Callable[[T, bool], None],
        on_relisted: Callable[[int], None] | None = None,
        watch_timeout_s: float,
        request_timeout_s: float,
    ) -> None:
        """Prepare the reflector (not started).

        Args:
            name: for logs (``pods team-a``).
            list_fn: the list method; called with ``watch=True`` for watches.
            decode: what an object (JSON-decoded) is kept as (:func:`.objects.decode` of its
                kind), called once per version received.
            label_selector: the selector of every list and watch.
            on_object: called with each object version received (under no lock of ours).
            on_deleted: called with the last version of a deleted object, and whether its
                deletion was seen (``False``: a relist no longer shows it).
            on_relisted: called after each list with its resourceVersion.
            watch_timeout_s: lifetime of one watch request.
            request_timeout_s: read timeout of a list.
        """
        self.name = name
        self._list = list_fn
        self._decode = decode
        self._selector = label_selector
        self._on_object = on_object
        self._on_deleted = on_deleted
        self._on_relisted = on_relisted
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._objects: dict[str, T] = {}
        self._progress = 0
        self._resp: Any = None
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        """The last error, while the reflector can't list or watch (``None`` when healthy)."""
        self.error_status: int | None = None
        """The HTTP status of that error, when the API server answered one."""
        self.lists = 0
        """How many lists it made (the first, and one per 410)."""
        self.watches = 0
        """How many watch requests it made."""

    # -- control --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"kubeflow {self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop: shut the socket of the stream it reads (a blocked read
        returns at once; closing alone would wait for the read's lock). See :meth:`join`."""
        self._stop.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            _shutdown(resp)

    def join(self, timeout_s: float = 10.0) -> None:
        """Wait for the thread to end after :meth:`stop`."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until the first list is in; return whether it is."""
        return self._synced.wait(timeout_s)

    @property
    def synced(self) -> bool:
        """Whether the first list is in."""
        return self._synced.is_set()

    @property
    def progress(self) -> int:
        """The resourceVersion up to which every change has been received."""
        with self._lock:
            return self._progress

    def objects(self) -> list[T]:
        """The objects as last received (not deleted)."""
        with self._lock:
            return list(self._objects.values())

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                    self._healthy()
                self._watch()
                failures = 0
                self.error = None
                self.error_status = None
            except _Expired:
                log.info("kubeflow.watch.expired", extra={"reflector": self.name})
                need_list = True
            except Exception as err:  # any failure: back off, then go on (list again if needed)
                if self._stop.is_set():
                    return
                self.error = (
                    status_words(err)
                    if isinstance(err, ApiException)
                    else f"{type(err).__name__}: {err}"
                )
                self.error_status = err.status if isinstance(err, ApiException) else None
                if isinstance(err, ApiException) and err.status == 410:
                    need_list = True
                    continue
                delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
                failures += 1
                log.warning(
                    "kubeflow.watch.failed",
                    extra={"reflector": self.name, "error": self.error, "retry_in_s": delay},
                )
                self._stop.wait(delay)

    def _healthy(self) -> None:
        self.error = None
        self.error_status = None

    def _relist(self) -> None:
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        rv = 0
        while True:
            kwargs: dict[str, Any] = {"limit": _PAGE, "_preload_content": False}
            if self._selector:
                kwargs["label_selector"] = self._selector
            if token:
                kwargs["_continue"] = token
            resp = self._list(**kwargs, _request_timeout=self._request_timeout_s)
            self.lists += 1
            page = json.loads(resp.data)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                rv = _rv(meta.get("resourceVersion"))
                break
        fresh = {_uid(o): self._decode(o) for o in items}
        with self._lock:
            gone = [o for uid, o in self._objects.items() if uid not in fresh]
            self._objects = fresh
        # The evidence first, then the progress that vouches for it.
        for obj in gone:
            self._on_deleted(obj, False)
        for obj in fresh.values():
            self._on_object(obj)
        if self._on_relisted is not None:
            self._on_relisted(rv)
        with self._lock:
            self._progress = max(self._progress, rv)
        self._synced.set()

    def _watch(self) -> None:
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "resource_version": str(self.progress),
            "timeout_seconds": max(1, round(self._watch_timeout_s)),
            "_preload_content": False,
            # A dead connection shows as a read timeout: a little over the watch's lifetime.
            "_request_timeout": (self._request_timeout_s, self._watch_timeout_s + 15.0),
        }
        if self._selector:
            kwargs["label_selector"] = self._selector
        resp = self._list(**kwargs)
        self.watches += 1
        # Answered: a past error (a refused credential) is over now, not when this watch
        # ends (up to ``watch_timeout_s`` later).
        self._healthy()
        with self._lock:
            self._resp = resp
        received = False
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if line:
                    self._event(json.loads(line))
                    received = True
        except (urllib3.exceptions.HTTPError, OSError) as err:
            if not received:
                raise
            # Cut after progress (an API server restart, a load balancer): resume at once
            # from the last resourceVersion; only a stream that breaks before any event
            # backs off.
            log.info("kubeflow.watch.dropped", extra={"reflector": self.name, "error": str(err)})
        finally:
            with self._lock:
                self._resp = None
            _close(resp)

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired
            raise ApiException(status=obj.get("code") or 0, reason=obj.get("message") or "")
        rv = _rv((obj.get("metadata") or {}).get("resourceVersion"))
        if kind == "BOOKMARK":
            with self._lock:
                self._progress = max(self._progress, rv)
            return
        uid, decoded = _uid(obj), self._decode(obj)
        if kind == "DELETED":
            with self._lock:
                self._objects.pop(uid, None)
            self._on_deleted(decoded, True)
        else:
            with self._lock:
                self._objects[uid] = decoded
            self._on_object(decoded)
        with self._lock:
            self._progress = max(self._progress, rv)


def status_words(err: ApiException) -> str:
    """``<code> <reason>: <message>`` from the API server's ``Status`` body, verbatim."""
    reason, message = err.reason or "", ""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict):
        reason = body.get("reason") or reason
        message = body.get("message") or ""
    text = f"{err.status} {reason}".strip()
    return f"{text}: {message}" if message else text


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _rv(value: Any) -> int:
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def _shutdown(resp: Any) -> None:
    """Shut down the socket under a streaming response (the ``kubernetes`` client's own
    ``Watch.stop`` does the same, for the same reason)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            log.debug("kubeflow.watch.shutdown_failed", exc_info=True)


def _close(resp: Any) -> None:
    for method in ("close", "release_conn"):
        fn = getattr(resp, method, None)
        if fn is not None:
            try:
                fn()
            except Exception:  # closing a broken stream: nothing to do about it
                log.debug("kubeflow.watch.close_failed", exc_info=True)

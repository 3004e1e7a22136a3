"""TEST DOUBLE: a fake kubelet serving container logs to the lane's REAL kube-apiserver.

No kubelet (nor container runtime) runs here, and pod logs are a kubelet's to serve: the
apiserver's ``GET /api/v1/namespaces/{ns}/pods/{pod}/log`` looks the pod's ``spec.nodeName``
up, takes that Node's address (``status.addresses``, by ``--kubelet-preferred-address-types``)
and kubelet port (``status.daemonEndpoints.kubeletEndpoint.Port``), and proxies the request to
``https://<address>:<port>/containerLogs/{ns}/{pod}/{container}`` with the query parameters
``follow``, ``previous``, ``timestamps``, ``sinceSeconds``, ``sinceTime``, ``tailLines`` and
``limitBytes`` (kubernetes ``pkg/registry/core/pod/strategy.go`` ``LogLocation``), streaming
the answer back (a non-2xx answer becomes the apiserver's error status with the kubelet's
words). This fake is that kubelet's log endpoint, and nothing else of a kubelet:

- an HTTPS server on 127.0.0.1 (aiohttp, in a thread of its own), its serving certificate
  issued by the lane's kubelet CA, requiring the apiserver's client certificate
  (``tests/servers/kube_pki.py``: the mutual TLS of a kubeadm cluster); it does not ask the
  apiserver to authorize the caller (a real kubelet's SubjectAccessReview on ``nodes/proxy``);
- the log of each container is what a test (or the cluster simulator) :meth:`write`-s, kept
  as timestamped lines, as the CRI log file keeps them; ``tailLines``, ``sinceSeconds``/
  ``sinceTime``, ``timestamps`` (RFC 3339 with nanoseconds, then a space) and ``limitBytes``
  (bytes of the answer) are honoured as the kubelet's log reader does, in that order;
  ``follow`` streams what is written later until the container is no longer running
  (:meth:`exit`); ``previous`` is refused (400), as for a container that never restarted;
- a pod it does not hold (never run here, or :meth:`forget`-ed) is ``404 pod "<name>" does
  not exist``, an unknown container ``404 container "<c>" not found in pod "<name>"``, as the
  kubelet answers; :meth:`refuse` makes the next requests fail with a status of the test's;
- every request is recorded (:attr:`requests`: path, query, the client certificate's CN).

    kubelet = FakeKubelet(lab.kubelet_pki).start()
    kubelet.run("team-a", "pod-0", ["node"])        # the container started
    kubelet.write("team-a", "pod-0", b"step 1\\n")    # it printed
    kubelet.exit("team-a", "pod-0")                   # it ended: follows end
    kubelet.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Self

from aiohttp import web

from tests.servers.kube_pki import KubeletPki

__all__ = ["FakeKubelet", "KubeletRequest"]


@dataclass(frozen=True)
class KubeletRequest:
    """One request the fake kubelet answered."""

    path: str
    query: dict[str, str]
    client: str
    """The common name of the client certificate the caller presented."""


@dataclass
class _Container:
    lines: list[tuple[datetime, bytes]] = field(default_factory=list)
    running: bool = True


class _Refusal:
    def __init__(self, count: int, status: int, message: str) -> None:
        self.count = count
        self.status = status
        self.message = message


def _format_time(at: datetime) -> bytes:
    """The kubelet's ``timestamps`` prefix: RFC 3339 with nanoseconds (Go's
    ``2006-01-02T15:04:05.000000000Z07:00``), in UTC."""
    at = at.astimezone(UTC)
    return (at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond * 1000:09d}Z").encode()


class _Options:
    """The query of one ``/containerLogs`` request, as the kubelet decodes and validates it
    (``ValidatePodLogOptions``: a negative ``tailLines``, a ``limitBytes`` or
    ``sinceSeconds`` below 1, or both ``sinceSeconds`` and ``sinceTime``, are invalid)."""

    def __init__(self, query: dict[str, str]) -> None:
        self.follow = query.get("follow") == "true"
        self.previous = query.get("previous") == "true"
        self.timestamps = query.get("timestamps") == "true"
        self.tail = int(query["tailLines"]) if "tailLines" in query else None
        self.limit = int(query["limitBytes"]) if "limitBytes" in query else None
        self.since: datetime | None = None
        if "sinceSeconds" in query:
            seconds = int(query["sinceSeconds"])
            if seconds < 1 or "sinceTime" in query:
                raise ValueError("sinceSeconds")
            self.since = datetime.now(UTC) - timedelta(seconds=seconds)
        elif "sinceTime" in query:
            self.since = datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00"))
        if (self.tail is not None and self.tail < 0) or (self.limit is not None and self.limit < 1):
            raise ValueError("tailLines/limitBytes")

    def select(self, lines: list[tuple[datetime, bytes]]) -> list[tuple[datetime, bytes]]:
        chosen = [(t, b) for t, b in lines if self.since is None or t >= self.since]
        if self.tail is not None:
            chosen = chosen[len(chosen) - self.tail :] if self.tail else []
        return chosen

    def render(self, at: datetime, data: bytes) -> bytes:
        return _format_time(at) + b" " + data if self.timestamps else data


class FakeKubelet:
    """The container-log endpoint of a kubelet (see the module docstring)."""

    host = "127.0.0.1"

    def __init__(self, pki: KubeletPki) -> None:
        """A kubelet trusting ``pki``'s CA for its callers, with a serving certificate from it
        (not started: :meth:`start`)."""
        self._pki = pki
        self._dir = tempfile.TemporaryDirectory(prefix="fake-kubelet-")
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, _Container]] = {}
        self._refusals: list[_Refusal] = []
        self.requests: list[KubeletRequest] = []
        """Every request answered, oldest first."""
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._changed: asyncio.Event | None = None

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> Self:
        """Serve on a free port of 127.0.0.1 (:attr:`port`) in a thread of its own."""
        cert, key = self._pki.issue_serving(Path(self._dir.name), self.host)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(cert), str(key))
        tls.verify_mode = ssl.CERT_REQUIRED
        tls.load_verify_locations(str(self._pki.ca_file))
        loop = asyncio.new_event_loop()
        self._loop = loop
        started = threading.Event()
        failed: list[BaseException] = []

        async def serve() -> None:
            self._changed = asyncio.Event()
            app = web.Application()
            app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
            self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, 0, ssl_context=tls)
            await site.start()
            self.port = int(self._runner.addresses[0][1])

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(serve())
            except BaseException as err:
                failed.append(err)
                started.set()
                return
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=main, name="fake-kubelet", daemon=True)
        self._thread.start()
        started.wait(30)
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        """Stop serving (open follows are cut)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        runner = self._runner

        async def shut() -> None:
            if runner is None:
                return
            # The apiserver keeps its connections alive: cut them (a TLS close would wait for
            # the peer's close_notify past this loop's end), then let them close.
            if runner.server is not None:
                for conn in list(runner.server.connections):
                    if conn.transport is not None:
                        conn.transport.abort()
            await runner.cleanup()
            for _ in range(3):
                await asyncio.sleep(0)  # the aborted transports' connection_lost callbacks

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        self._loop = self._thread = None
        self._dir.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what runs on the node ------------------------------------------------------------------

    def run(self, namespace: str, pod: str, containers: Iterable[str]) -> None:
        """The pod's ``containers`` started on this node (their logs are kept from now)."""
        with self._lock:
            held = self._pods.setdefault((namespace, pod), {})
            for name in containers:
                held.setdefault(name, _Container()).running = True
        self._notify()

    def write(
        self,
        namespace: str,
        pod: str,
        data: bytes,
        *,
        container: str | None = None,
        at: datetime | None = None,
    ) -> None:
        """The container printed ``data`` (at ``at``, now by default). ``container`` may be
        left out when the pod has one.

        Raises:
            KeyError: the pod or container is not on this node.
        """
        at = at or datetime.now(UTC)
        with self._lock:
            held = self._container(namespace, pod, container)
            pieces = data.splitlines(keepends=True)
            if pieces and held.lines and not held.lines[-1][1].endswith(b"\n"):
                # a partial line goes on (the CRI log's "P" entries, read back joined)
                last_at, last = held.lines[-1]
                held.lines[-1] = (last_at, last + pieces.pop(0))
            held.lines.extend((at, piece) for piece in pieces)
        self._notify()

    def exit(self, namespace: str, pod: str) -> None:
        """The pod's containers are no longer running (their logs stay; follows end)."""
        with self._lock:
            for held in self._pods.get((namespace, pod), {}).values():
                held.running = False
        self._notify()

    def forget(self, namespace: str, pod: str) -> None:
        """The pod is gone from the node (its containers and logs removed)."""
        with self._lock:
            self._pods.pop((namespace, pod), None)
        self._notify()

    def log(self, namespace: str, pod: str, container: str | None = None) -> bytes:
        """The whole log the container holds."""
        with self._lock:
            return b"".join(b for _, b in self._container(namespace, pod, container).lines)

    def refuse(self, count: int = 1, *, status: int = 500, message: str = "") -> None:
        """Answer the next ``count`` log requests ``status`` with ``message`` (as a kubelet
        whose runtime fails: ``500 failed to get container status``)."""
        text = message or "failed to get container status: rpc error: code = Unavailable"
        with self._lock:
            self._refusals.append(_Refusal(count, status, text))

    def _container(self, namespace: str, pod: str, container: str | None) -> _Container:
        held = self._pods[(namespace, pod)]
        if container is None:
            if len(held) != 1:
                raise KeyError(f"pod {namespace}/{pod} has containers {sorted(held)}: name one")
            return next(iter(held.values()))
        return held[container]

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        if changed is not None:
            changed.set()

    # -- the endpoint ---------------------------------------------------------------------------

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        pod = request.match_info["pod"]
        name = request.match_info["container"]
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        client = ""
        for rdn in (peer or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    client = value
        query = dict(request.query)
        with self._lock:
            self.requests.append(KubeletRequest(request.path, query, client))
            refusal = next((r for r in self._refusals if r.count > 0), None)
            if refusal is not None:
                refusal.count -= 1
                return web.Response(status=refusal.status, text=refusal.message)
        try:
            options = _Options(query)
        except ValueError:
            return web.Response(status=422, text='{"message": "Invalid request."}')
        with self._lock:
            held = self._pods.get((namespace, pod))
            if held is None:
                return web.Response(status=404, text=f'pod "{pod}" does not exist\n')
            if name not in held:
                return web.Response(
                    status=404, text=f'container "{name}" not found in pod "{pod}"\n'
                )
            container = held[name]
            lines = list(container.lines)
        if options.previous:
            return web.Response(
                status=400,
                text=f'previous terminated container "{name}" in pod "{pod}" not found',
            )
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        writer = _Writer(response, options)
        for at, data in options.select(lines):
            if not await writer.line(at, data):
                return response
        if options.follow:
            # from where the read ended: the next line, or the rest of a partial last one
            index, offset = (len(lines) - 1, len(lines[-1][1])) if lines else (0, 0)
            if lines and lines[-1][1].endswith(b"\n"):
                index, offset = len(lines), 0
            while True:
                changed = self._changed
                assert changed is not None
                with self._lock:
                    current = (self._pods.get((namespace, pod)) or {}).get(name)
                    fresh = list(current.lines[index:]) if current is not None else []
                    running = current is not None and current.running
                for at, data in fresh:
                    if offset:
                        ok = await writer.rest(data[offset:])
                    elif options.since is not None and at < options.since:
                        ok = True
                    else:
                        ok = await writer.line(at, data)
                    if not ok:
                        return response
                    offset = 0
                if fresh:
                    index += len(fresh) - 1
                    offset = len(fresh[-1][1])
                    if fresh[-1][1].endswith(b"\n"):
                        index, offset = index + 1, 0
                if not running:
                    break
                await changed.wait()
        await response.write_eof()
        return response


class _Writer:
    """Writes the lines of one answer, ``limitBytes`` counted."""

    def __init__(self, response: web.StreamResponse, options: _Options) -> None:
        self._response = response
        self._options = options
        self._left = options.limit

    async def line(self, at: datetime, data: bytes) -> bool:
        """Write one line (with its timestamp if asked); False once the limit is reached."""
        return await self.rest(self._options.render(at, data))

    async def rest(self, out: bytes) -> bool:
        """Write ``out`` as it is; False once the limit is reached."""
        if self._left is not None:
            out = out[: self._left]
            self._left -= len(out)
        if out:
            await self._response.write(out)
        return self._left != 0

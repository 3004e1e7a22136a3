"""An HTTP proxy in front of the lane's kube-apiserver, for faults a real cluster has, injected
at an exact request or an exact event of a watch.

It terminates TLS with the apiserver's own serving certificate and key (so the client still
verifies against the lane's CA bundle), reads each HTTP/1.1 request, forwards it on its own
upstream TLS connection (one per client connection, keep-alive mirrored) and streams the answer
back, watches included. What it adds, each on purpose and on the wire:

- :meth:`KubeProxy.cut`: every open connection closed now (a load balancer's idle reset, an
  apiserver rollout: the watches drop mid-stream); :meth:`KubeProxy.refusing`: connections
  closed as soon as accepted, for a while (an outage).
- :meth:`KubeProxy.fail_next`: the next matching requests answered with a ``Status`` error
  (500, 503, ...) instead of being forwarded (a real apiserver's overload or etcd trouble).
- :meth:`KubeProxy.drop_next_watch`: the next matching watch cut after exactly N events,
  cleanly (the terminating chunk, as the server's own timeout) or abruptly (the connection
  reset); :meth:`KubeProxy.drop_watches`: the open watches of a resource cut now.
- :attr:`KubeProxy.requests`: every request seen, for "dispatch never wrote X" assertions.

    proxy = KubeProxy(("127.0.0.1", lab.port), lab.cert_file, lab.key_file, lab.ca_file).start()
    proxy.url                     # https://127.0.0.1:<proxy port>
    proxy.fail_next(3, status=500, path_contains="/pods", watch=True)
    proxy.drop_next_watch(after_events=1, abrupt=True, path_contains="/pods")
    proxy.stop()
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KubeProxy", "ProxiedRequest"]

_REASONS = {
    429: ("TooManyRequests", "Too Many Requests"),
    500: ("InternalError", "Internal Server Error"),
    503: ("ServiceUnavailable", "Service Unavailable"),
    504: ("Timeout", "Gateway Timeout"),
}
_MAX_LINE = 65536


@dataclass(frozen=True, kw_only=True)
class ProxiedRequest:
    """One request the proxy saw: ``status`` is the answer's (``0`` when the connection died
    first), ``injected`` when the proxy answered instead of the server."""

    method: str
    path: str
    query: dict[str, str]
    watch: bool
    status: int
    injected: bool


@dataclass(kw_only=True)
class _FailRule:
    remaining: int
    status: int
    method: str | None
    path_contains: str | None
    watch: bool | None

    def applies(self, method: str, path: str, watch: bool) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.path_contains is None or self.path_contains in path)
            and (self.watch is None or self.watch == watch)
        )


@dataclass(kw_only=True)
class _WatchDrop:
    after_events: int
    abrupt: bool
    path_contains: str | None


@dataclass(kw_only=True, eq=False)
class _Stream:
    """One watch being relayed; ``drop`` set by the test thread ("clean" or "abrupt")."""

    path: str
    client: socket.socket
    upstream: socket.socket
    drop: str | None = None


class _Cut(Exception):
    """The relay of one connection ends (closed, cut, or a watch dropped on purpose)."""


class KubeProxy:
    """A threaded HTTP/1.1 proxy on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self, target: tuple[str, int], cert_file: Path, key_file: Path, ca_file: Path
    ) -> None:
        """Args:
        target: the apiserver's (host, port).
        cert_file, key_file: the apiserver's serving certificate and key (presented to clients).
        ca_file: what the upstream connection verifies the apiserver against.
        """
        self.target = target
        self._server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_tls.load_cert_chain(str(cert_file), str(key_file))
        self._client_tls = ssl.create_default_context(cafile=str(ca_file))
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._streams: set[_Stream] = set()
        self._rules: list[_FailRule] = []
        self._drops: list[_WatchDrop] = []
        self._requests: list[ProxiedRequest] = []
        self._refusing = threading.Event()
        self._stopped = threading.Event()
        self.accepted = 0
        self.cuts = 0
        self.watches_dropped = 0
        """Watches cut by :meth:`drop_next_watch` (at their event) or :meth:`drop_watches`."""

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.port}"

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> KubeProxy:
        """Accept connections in a background thread."""
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="kube-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    # -- faults -------------------------------------------------------------------------------

    def cut(self) -> int:
        """Close every open connection (both sides) now; return how many were open."""
        with self._lock:
            socks = list(self._open)
            self._open.clear()
        for sock in socks:
            _close(sock)
        self.cuts += 1
        return len(socks) // 2

    @contextlib.contextmanager
    def refusing(self) -> Iterator[None]:
        """Cut every connection, and close new ones at once, for the block's duration."""
        self._refusing.set()
        self.cut()
        try:
            yield
        finally:
            self._refusing.clear()

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 500,
        method: str | None = None,
        path_contains: str | None = None,
        watch: bool | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with ``status`` and a ``Status`` body,
        without forwarding them.

        Args:
            count: how many requests get the error.
            status: 429, 500, 503 or 504.
            method: only requests with this HTTP method.
            path_contains: only requests whose path contains this text (``/pods``).
            watch: only watch requests (True), only others (False), or both (None).

        Raises:
            ValueError: an unsupported status.
        """
        if status not in _REASONS:
            raise ValueError(f"fail_next: status {status} is not one of {sorted(_REASONS)}")
        with self._lock:
            self._rules.append(
                _FailRule(
                    remaining=count,
                    status=status,
                    method=method,
                    path_contains=path_contains,
                    watch=watch,
                )
            )

    def drop_next_watch(
        self, *, after_events: int = 0, abrupt: bool = False, path_contains: str | None = None
    ) -> None:
        """Cut the next watch (whose path contains ``path_contains``, or any) once it has
        relayed ``after_events`` events: cleanly (the terminating chunk) or abruptly (reset).
        A watch that ends before that passes the cut on to the next one."""
        with self._lock:
            self._drops.append(
                _WatchDrop(after_events=after_events, abrupt=abrupt, path_contains=path_contains)
            )

    def drop_watches(self, *, abrupt: bool = False, path_contains: str | None = None) -> int:
        """Cut the open watches (whose path contains ``path_contains``, or all) now; returns
        how many."""
        with self._lock:
            hit = [s for s in self._streams if path_contains is None or path_contains in s.path]
            for stream in hit:
                stream.drop = "abrupt" if abrupt else "clean"
        for stream in hit:
            # the relay thread, blocked reading the upstream, wakes on this and ends the stream
            with contextlib.suppress(OSError):
                stream.upstream.shutdown(socket.SHUT_RDWR)
        return len(hit)

    def clear(self) -> None:
        """Forget every pending fault."""
        with self._lock:
            self._rules.clear()
            self._drops.clear()

    # -- what happened ------------------------------------------------------------------------

    @property
    def requests(self) -> list[ProxiedRequest]:
        """Every request answered so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def active_watches(self, path_contains: str | None = None) -> int:
        """Watches being relayed now (whose path contains ``path_contains``, or all)."""
        with self._lock:
            return sum(1 for s in self._streams if path_contains is None or path_contains in s.path)

    def connections(self) -> int:
        """Client connections open now."""
        with self._lock:
            return len(self._open) // 2

    # -- relay --------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing.is_set():
                _close(client)
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        client: socket.socket | None = None
        upstream: socket.socket | None = None
        try:
            raw.settimeout(30)
            client = self._server_tls.wrap_socket(raw, server_side=True)
            client.settimeout(None)
            plain = socket.create_connection(self.target, timeout=10)
            upstream = self._client_tls.wrap_socket(plain, server_hostname=self.target[0])
            upstream.settimeout(None)
            with self._lock:
                if self._refusing.is_set() or self._stopped.is_set():
                    raise _Cut
                self._open.update((client, upstream))
                self.accepted += 1
            self._relay(client, upstream)
        except (_Cut, OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._open.discard(raw)
                if client is not None:
                    self._open.discard(client)
                if upstream is not None:
                    self._open.discard(upstream)
            for sock in (client, upstream, raw):
                if sock is not None:
                    _close(sock)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        from_client = client.makefile("rb")
        from_upstream = upstream.makefile("rb")
        while True:
            head = _read_head(from_client)
            if head is None:
                return
            request_line, headers = head
            method, target, _ = request_line.split(" ", 2)
            body = from_client.read(int(headers.get("content-length", "0")))
            parsed = urllib.parse.urlsplit(target)
            query = dict(urllib.parse.parse_qsl(parsed.query))
            path = parsed.path
            watch = query.get("watch") in ("true", "1") or "/watch/" in path
            rule = self._take_failure(method, path, watch)
            if rule is not None:
                client.sendall(_status_answer(rule.status))
                self._record(method, path, query, watch, rule.status, injected=True)
                continue
            upstream.sendall(_raw_head(request_line, headers) + body)
            answer = _read_head(from_upstream)
            if answer is None:
                raise _Cut
            status_line, answer_headers = answer
            status = int(status_line.split(" ", 2)[1])
            client.sendall(_raw_head(status_line, answer_headers))
            try:
                if answer_headers.get("transfer-encoding", "").lower() == "chunked":
                    stream = None
                    if watch:
                        stream = _Stream(path=path, client=client, upstream=upstream)
                    self._relay_chunks(from_upstream, client, stream)
                elif "content-length" in answer_headers:
                    _copy(from_upstream, client, int(answer_headers["content-length"]))
                elif status in (204, 304) or status < 200 or method == "HEAD":
                    pass
                else:  # delimited by the end of the connection
                    while chunk := from_upstream.read1(65536):
                        client.sendall(chunk)
                    raise _Cut
            finally:
                self._record(method, path, query, watch, status, injected=False)
            if answer_headers.get("connection", "").lower() == "close":
                raise _Cut

    def _relay_chunks(
        self, src: io.BufferedReader, dst: socket.socket, stream: _Stream | None
    ) -> None:
        drop = self._take_drop(stream.path) if stream is not None else None
        if stream is not None:
            with self._lock:
                self._streams.add(stream)
        events, fired = 0, False
        try:
            if drop is not None and drop.after_events == 0:
                fired = True
                self._end_dropped(dst, drop.abrupt)
            while True:
                try:
                    size_line = src.readline(_MAX_LINE)
                except OSError:
                    size_line = b""
                if not size_line:
                    if stream is not None and stream.drop is not None:
                        self._end_dropped(dst, stream.drop == "abrupt")
                    raise _Cut
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                data = src.read(size + 2) if size else b""
                if size == 0:  # the trailer section, then the end
                    trailer = size_line
                    while (line := src.readline(_MAX_LINE)) not in (b"\r\n", b"\n", b""):
                        trailer += line
                    dst.sendall(trailer + b"\r\n")
                    return
                dst.sendall(size_line + data)
                events += data[:-2].count(b"\n")
                if drop is not None and events >= drop.after_events:
                    fired = True
                    self._end_dropped(dst, drop.abrupt)
        finally:
            with self._lock:
                if stream is not None:
                    self._streams.discard(stream)
                if drop is not None and not fired:
                    # the watch ended before its Nth event: the next one gets the cut
                    self._drops.insert(0, drop)

    def _end_dropped(self, dst: socket.socket, abrupt: bool) -> None:
        with self._lock:
            self.watches_dropped += 1
        if not abrupt:
            with contextlib.suppress(OSError):
                dst.sendall(b"0\r\n\r\n")
        raise _Cut

    def _take_failure(self, method: str, path: str, watch: bool) -> _FailRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.remaining > 0 and rule.applies(method, path, watch):
                    rule.remaining -= 1
                    return rule
            self._rules = [r for r in self._rules if r.remaining > 0]
            return None

    def _take_drop(self, path: str) -> _WatchDrop | None:
        with self._lock:
            for n, drop in enumerate(self._drops):
                if drop.path_contains is None or drop.path_contains in path:
                    return self._drops.pop(n)
            return None

    def _record(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        watch: bool,
        status: int,
        *,
        injected: bool,
    ) -> None:
        with self._lock:
            self._requests.append(
                ProxiedRequest(
                    method=method,
                    path=path,
                    query=query,
                    watch=watch,
                    status=status,
                    injected=injected,
                )
            )


def _read_head(src: io.BufferedReader) -> tuple[str, dict[str, str]] | None:
    """The start line and headers (names lower-cased; ``None`` at the connection's end)."""
    try:
        first = src.readline(_MAX_LINE)
    except OSError:
        return None
    if not first:
        return None
    headers: dict[str, str] = {}
    while True:
        line = src.readline(_MAX_LINE)
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return first.decode("latin-1").rstrip("\r\n"), headers


def _raw_head(start_line: str, headers: dict[str, str]) -> bytes:
    lines = [start_line, *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _copy(src: io.BufferedReader, dst: socket.socket, length: int) -> None:
    while length > 0:
        chunk = src.read(min(length, 65536))
        if not chunk:
            raise _Cut
        dst.sendall(chunk)
        length -= len(chunk)


def _status_answer(status: int) -> bytes:
    reason, phrase = _REASONS[status]
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"injected by the lane's proxy ({phrase})",
            "reason": reason,
            "code": status,
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()

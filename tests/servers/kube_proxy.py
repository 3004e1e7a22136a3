"""A TCP proxy in front of the lane's kube-apiserver, for faults on the wire that a real cluster
has: cutting every open connection (a load balancer's idle reset, an apiserver rollout: the
watches drop mid-stream) and refusing new ones for a while (an outage). TLS passes through
untouched (the client still verifies the server's certificate).

    proxy = TcpProxy(("127.0.0.1", server.port)).start()
    proxy.url                     # https://127.0.0.1:<proxy port>
    proxy.cut()                   # close every open connection now
    with proxy.refusing(): ...    # connections are closed as soon as accepted
    proxy.stop()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

__all__ = ["TcpProxy"]


class TcpProxy:
    """A threaded TCP forwarder on 127.0.0.1 (see the module docstring)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._refusing = threading.Event()
        self._stopped = threading.Event()
        self.accepted = 0
        self.cuts = 0

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
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

    def cut(self) -> int:
        """Close every open connection (both sides) now; return how many were open."""
        with self._lock:
            socks = list(self._open)
            self._open.clear()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
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

    def connections(self) -> int:
        """Client connections open now."""
        with self._lock:
            return len(self._open) // 2

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing.is_set():
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

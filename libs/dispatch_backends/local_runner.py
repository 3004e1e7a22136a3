"""The runner of one local object: holds its start gate, runs its command, records its end.

The local backend (:mod:`dispatch_backends.local`) makes one runner per object. The runner is
the local "scheduler daemon" of that object: it outlives the backend process that started it,
so a new backend on the same data directory finds the object where it left it.

Usage (the backend runs the script by path with ``-I -S``; ``-m`` works too, but starts
slower because it imports the package)::

    python -I -S .../dispatch_backends/local_runner.py run <object dir>
    python -I -S .../dispatch_backends/local_runner.py zygote <name> <idle seconds>
    python -m dispatch_backends.local_runner terminate <object dir>

``run`` forks once and the parent exits at once (so nobody has to reap the runner: it is
re-parented); the child prints ``ready`` on stdout when it is listening, then goes on whether
or not anyone read it (a launcher killed mid-start must not take the object with it: the
backend's next start of the same launch finds it; issue 15):

1. *Gate.* It waits, without running the command, until ``control/gate-open`` exists and
   ``control/admin-hold`` does not. A ``stop``, ``preempt`` or ``emergency`` marker ends the
   object before it ran.
2. *Run.* It runs the command in a new session (its own process group, id = its pid) with
   the object's environment, stdout and stderr to files in the object directory, and writes
   ``job.json`` (pid, start time).
3. *End.* A ``stop`` or ``preempt`` marker, or the time limit, makes it send SIGTERM to the
   process group, wait the kill wait, then send SIGKILL; ``emergency`` sends SIGKILL at once.
   When the command's process exits the runner writes ``status.json`` (how it ended: the
   reason, the exit code or the signal), then ends what is left of the process group (SIGTERM,
   kill wait, SIGKILL), writes ``ceased.json`` and exits.

Waking up: whoever writes a marker sends SIGUSR1 to the runner; SIGCHLD wakes it when the
command exits. Both arrive through :func:`signal.set_wakeup_fd`, so an idle runner sleeps in
``select`` and uses no CPU. As a safety net it re-reads its markers every
:data:`FALLBACK_POLL_S` seconds (a marker written by hand, without the signal, is seen then).
Only the clean-up of left-over group members polls, every 50 ms (a SIGCHLD cuts it short):
the runner is a child subreaper, so the command's orphaned descendants become its children
and it reaps them, and a zombie never makes an empty process group look alive.

The runner uses the standard library only (no msgspec, no dispatch_core): started with
``-I -S`` it is up in about 20 ms and takes about 6 MB. That is still tens of milliseconds of
CPU per object, so the backend normally asks the data directory's ``zygote`` instead (see
:class:`_Zygote`): a warm runner process that forks one runner per request, in about a
millisecond. On this project's 2-core machine that took starting 1,000 objects from about
30 s to about 6 s. A forked runner is the same code from step 1 on. The JSON the runner writes
is read by the backend with msgspec; the field names below are the contract between the two.

``terminate`` is the fallback when a runner has vanished (killed with SIGKILL) while its
command still runs: it does step 3's SIGTERM / kill wait / SIGKILL on the process group and
writes nothing (the exit status is lost with the runner).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final

__all__ = [
    "ADMIN_HOLD",
    "CEASED_FILE",
    "CONTROL_DIR",
    "EMERGENCY",
    "END_MARKERS",
    "FALLBACK_POLL_S",
    "GATE_OPEN",
    "JOB_FILE",
    "META_FILE",
    "NODE_LOST",
    "PREEMPT",
    "REASON_EMERGENCY",
    "REASON_EXEC_FAILED",
    "REASON_EXITED",
    "REASON_PREEMPT",
    "REASON_STOP",
    "REASON_TIME_LIMIT",
    "RUNNER_FILE",
    "RUNNER_LOG",
    "STATUS_FILE",
    "STDERR_FILE",
    "STDOUT_FILE",
    "STOP",
    "TERMINATING_FILE",
    "end_group",
    "group_members",
    "main",
    "proc_starttime",
]

# Files of an object directory.
META_FILE: Final = "meta.json"
"""Written by the backend before the runner starts; never changed. Keys the runner reads:
``command`` (list of str), ``env`` (dict), ``cwd`` (str), ``time_limit_s`` (int or null),
``kill_wait_s`` (float)."""
RUNNER_FILE: Final = "runner.json"
"""``{"pid", "starttime"}`` of the runner, written once it listens for wake-ups."""
JOB_FILE: Final = "job.json"
"""``{"pid", "starttime", "started_at"}`` of the command's process (= its process group)."""
TERMINATING_FILE: Final = "terminating.json"
"""``{"reason", "at"}``: the runner sent SIGTERM (or SIGKILL) and waits for the end."""
STATUS_FILE: Final = "status.json"
"""How the object ended: ``{"ended_at", "started", "reason", "exit_code", "signal",
"escalated", "detail", "kill_wait_s"}``; written once."""
CEASED_FILE: Final = "ceased.json"
"""``{"at"}``: no process of the object's process group is left."""
STDOUT_FILE: Final = "stdout"
STDERR_FILE: Final = "stderr"
RUNNER_LOG: Final = "runner.log"

# Markers: files in control/, written by the backend and by fault injection.
CONTROL_DIR: Final = "control"
GATE_OPEN: Final = "gate-open"
ADMIN_HOLD: Final = "admin-hold"
STOP: Final = "stop"
PREEMPT: Final = "preempt"
EMERGENCY: Final = "emergency"
NODE_LOST: Final = "node-lost"
END_MARKERS: Final = frozenset({STOP, PREEMPT, EMERGENCY})

# Reasons in status.json.
REASON_EXITED: Final = "exited"
"""The command exited (or was killed by a signal) without the runner ending it."""
REASON_STOP: Final = "stop"
REASON_PREEMPT: Final = "preempt"
REASON_TIME_LIMIT: Final = "time-limit"
REASON_EMERGENCY: Final = "emergency"
REASON_EXEC_FAILED: Final = "exec-failed"

FALLBACK_POLL_S: Final = 2.0
"""Seconds between re-reads of the markers when no wake-up signal came (a safety net)."""
_GROUP_POLL_S: Final = 0.05
_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_SET_NAME: Final = 15


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _log(message: str) -> None:
    print(f"{_now()} runner[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def write_json_atomically(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` so a reader sees all of it or nothing."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def proc_starttime(pid: int) -> int | None:
    """Return the start time of live process ``pid`` (clock ticks after boot), else ``None``.

    A zombie (exited, not yet reaped) counts as gone. Comparing the start time with the one
    recorded when the process was made tells a reused pid from the original.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Return the live (non-zombie) processes of process group ``pgid`` (scans ``/proc``)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def _group_exists(pgid: int) -> bool:
    """Whether process group ``pgid`` has any process, zombies included (one syscall)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def end_group(
    pgid: int,
    kill_wait_s: float,
    *,
    alive: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
    term_sent: bool = False,
) -> bool:
    """SIGTERM what is left of process group ``pgid``, wait up to ``kill_wait_s``, SIGKILL.

    Args:
        pgid: the process group (whose leader has been reaped, or is not ours).
        kill_wait_s: seconds between SIGTERM and SIGKILL.
        alive: whether a live process is left in the group.
        sleep: waits up to the given seconds between checks (may return early).
        term_sent: SIGTERM was already sent (do not send it again).

    Returns:
        Whether SIGKILL had to be sent.
    """
    if not alive():
        return False
    if not term_sent:
        _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + kill_wait_s
    while (left := deadline - time.monotonic()) > 0:
        if not alive():
            return False
        sleep(min(left, _GROUP_POLL_S))
    if not alive():
        return False
    _killpg(pgid, signal.SIGKILL)
    while alive():
        sleep(_GROUP_POLL_S)
    return True


_libc: ctypes.CDLL | None = None


def _prctl(option: int, arg: int | bytes) -> None:
    """Call prctl(2); a failure is logged, never fatal (the runner still works without)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        if _libc.prctl(option, arg, 0, 0, 0) != 0:
            _log(f"prctl({option}) failed: errno {ctypes.get_errno()}")
    except (OSError, AttributeError) as err:
        _log(f"prctl({option}) unavailable: {err}")


def _become_subreaper(name: bytes) -> None:
    """Make orphaned descendants of the command our children (PR_SET_CHILD_SUBREAPER), so we
    reap them and a zombie never lingers in the process group waiting for init; and name the
    process ``name`` in ps/top (a runner forked by the zygote keeps the zygote's command
    line)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_NAME, name)


class _Runner:
    """One object's runner (see the module docstring)."""

    def __init__(self, objdir: Path, base_env: dict[str, str] | None = None) -> None:
        self.dir = objdir
        self.base_env = dict(os.environ) if base_env is None else base_env
        self.control = objdir / CONTROL_DIR
        meta = json.loads((objdir / META_FILE).read_text())
        self.command: list[str] = [str(a) for a in meta["command"]]
        self.env: dict[str, str] = {str(k): str(v) for k, v in meta["env"].items()}
        self.cwd = str(meta["cwd"])
        limit = meta.get("time_limit_s")
        self.time_limit_s: float | None = None if limit is None else float(limit)
        self.kill_wait_s = float(meta["kill_wait_s"])
        self._wake_r, self._wake_w = os.pipe()
        self.leader = 0
        self.leader_status: int | None = None

    # -- wake-ups -------------------------------------------------------------------------

    def listen(self) -> None:
        """Route SIGUSR1 (a marker changed), SIGCHLD (the command exited) and the signals
        that would otherwise end the runner to the wake-up pipe."""
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

        def ignore(signum: int, frame: FrameType | None) -> None:
            # A handler, not SIG_IGN: exec resets handled signals to their defaults, while
            # an ignored signal would stay ignored in the command.
            del signum, frame

        for sig in (signal.SIGUSR1, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, ignore)

    def wait(self, timeout_s: float) -> None:
        """Sleep until a wake-up signal arrives or ``timeout_s`` seconds pass."""
        readable, _, _ = select.select([self._wake_r], [], [], max(timeout_s, 0.0))
        if readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 512):
                    pass

    def markers(self) -> frozenset[str]:
        try:
            return frozenset(os.listdir(self.control))
        except FileNotFoundError:
            return frozenset()

    # -- the three steps ------------------------------------------------------------------

    def serve(self, ready_fd: int = 1) -> None:
        """Run the object to its end; say ``ready`` on ``ready_fd`` once listening, then
        close it (stdout is then the runner's log)."""
        self.listen()
        _become_subreaper(b"dj-runner")
        # Created exclusively: should a second runner ever be started for this object, it
        # leaves (without "ready") instead of running the command twice.
        runner = {"pid": os.getpid(), "starttime": proc_starttime(os.getpid())}
        tmp = self.dir / f".{RUNNER_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(runner))
        try:
            os.link(tmp, self.dir / RUNNER_FILE)
        except FileExistsError:
            _log("another runner owns this object: leaving")
            return
        finally:
            tmp.unlink()
        # Tell the backend we listen, then let go of its pipe or socket so its read ends.
        # The backend that launched us may be gone (its process killed mid-launch): the
        # object is made all the same and a restarted backend finds it, so a write to a
        # closed pipe or socket must never end the runner (issue 15: it used to die of
        # BrokenPipeError here, and the object ended "unknown" without having run).
        try:
            os.write(ready_fd, b"ready\n")
        except OSError as err:
            _log(f"the launcher is gone ({err.strerror or err}); running on")
        with open(self.dir / RUNNER_LOG, "ab") as log:
            os.dup2(log.fileno(), ready_fd if ready_fd == 1 else 1)
        if ready_fd != 1:
            os.close(ready_fd)
        _log(f"listening in {self.dir}")

        reason = self.hold_gate()
        if reason is not None:
            _log(f"ended before start: {reason}")
            self.finish(started=False, reason=reason)
            return
        try:
            proc = self.spawn()
        except OSError as err:
            # The child reports a failed chdir with the directory as the error's filename.
            if err.filename == self.cwd:
                detail = f"cannot enter the working directory {self.cwd!r}: {err.strerror or err}"
            else:
                detail = f"cannot execute {self.command[0]!r}: {err.strerror or err}"
            _log(detail)
            self.finish(started=False, reason=REASON_EXEC_FAILED, detail=detail)
            return
        self.supervise(proc)

    def hold_gate(self) -> str | None:
        """Wait at the closed gate; return ``None`` once it opens, or why the object ended."""
        while True:
            markers = self.markers()
            if EMERGENCY in markers:
                return REASON_EMERGENCY
            if STOP in markers:
                return REASON_STOP
            if PREEMPT in markers:
                return REASON_PREEMPT
            if GATE_OPEN in markers and ADMIN_HOLD not in markers:
                return None
            self.wait(FALLBACK_POLL_S)

    def spawn(self) -> subprocess.Popen[bytes]:
        env = dict(self.base_env)
        env.update(self.env)
        with (
            open(self.dir / STDOUT_FILE, "ab") as out,
            open(self.dir / STDERR_FILE, "ab") as err,
        ):
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self.cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        # Not reaped until we wait for it, so the pid (and the group id) can't be reused yet.
        write_json_atomically(
            self.dir / JOB_FILE,
            {"pid": proc.pid, "starttime": proc_starttime(proc.pid), "started_at": _now()},
        )
        _log(f"gate open: started pid {proc.pid}")
        return proc

    def reap(self) -> None:
        """Reap every child that exited (the command, and as a subreaper its orphaned
        descendants); keep the command's wait status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.leader:
                self.leader_status = status

    def supervise(self, proc: subprocess.Popen[bytes]) -> None:
        started = time.monotonic()
        pgid = self.leader = proc.pid
        reason: str | None = None
        kill_at: float | None = None
        escalated = False
        emergency = False
        self.reap()
        while self.leader_status is None:
            now = time.monotonic()
            markers = self.markers()
            if EMERGENCY in markers and not emergency:
                emergency = True
                reason = REASON_EMERGENCY
                self.terminating(reason)
                _log("emergency stop: SIGKILL")
                _killpg(pgid, signal.SIGKILL)
            if reason is None:
                if STOP in markers:
                    reason = REASON_STOP
                elif PREEMPT in markers:
                    reason = REASON_PREEMPT
                elif self.time_limit_s is not None and now - started >= self.time_limit_s:
                    reason = REASON_TIME_LIMIT
                if reason is not None:
                    self.terminating(reason)
                    _log(f"{reason}: SIGTERM, kill wait {self.kill_wait_s} s")
                    _killpg(pgid, signal.SIGTERM)
                    kill_at = now + self.kill_wait_s
            if kill_at is not None and not escalated and not emergency and now >= kill_at:
                _log(f"{reason}: kill wait over: SIGKILL")
                _killpg(pgid, signal.SIGKILL)
                escalated = True
            timeout = FALLBACK_POLL_S
            if reason is None and self.time_limit_s is not None:
                timeout = min(timeout, started + self.time_limit_s - now)
            if kill_at is not None and not escalated and not emergency:
                timeout = min(timeout, kill_at - now)
            self.wait(timeout)
            self.reap()
        returncode = os.waitstatus_to_exitcode(self.leader_status)
        proc.returncode = returncode  # reaped here, not by Popen
        if EMERGENCY in self.markers() and returncode == -signal.SIGKILL:
            # An emergency stop may have killed it directly, before we read the marker.
            reason = REASON_EMERGENCY
        _log(f"pid {pgid} ended: returncode {returncode}, reason {reason or REASON_EXITED}")
        self.finish(
            started=True,
            reason=reason or REASON_EXITED,
            exit_code=returncode if returncode >= 0 else None,
            signum=-returncode if returncode < 0 else None,
            escalated=escalated,
        )

        # The object has ended; now end whatever it left behind in its process group (as a
        # scheduler's job-end clean-up does), then say the group has ceased.
        def alive() -> bool:
            self.reap()
            return _group_exists(pgid)

        if end_group(
            pgid,
            0.0 if escalated or emergency else self.kill_wait_s,
            alive=alive,
            sleep=self.wait,
        ):
            _log(f"left-over processes of group {pgid} killed after the kill wait")
        write_json_atomically(self.dir / CEASED_FILE, {"at": _now()})

    def terminating(self, reason: str) -> None:
        write_json_atomically(self.dir / TERMINATING_FILE, {"reason": reason, "at": _now()})

    def finish(
        self,
        *,
        started: bool,
        reason: str,
        exit_code: int | None = None,
        signum: int | None = None,
        escalated: bool = False,
        detail: str = "",
    ) -> None:
        write_json_atomically(
            self.dir / STATUS_FILE,
            {
                "ended_at": _now(),
                "started": started,
                "reason": reason,
                "exit_code": exit_code,
                "signal": signum,
                "escalated": escalated,
                "detail": detail,
                "kill_wait_s": self.kill_wait_s,
            },
        )
        if not started:
            write_json_atomically(self.dir / CEASED_FILE, {"at": _now()})


def _terminate(objdir: Path) -> None:
    """End the process group of an object whose runner vanished (see the module docstring)."""
    meta = json.loads((objdir / META_FILE).read_text())
    job = json.loads((objdir / JOB_FILE).read_text())
    pid, starttime = int(job["pid"]), job["starttime"]
    # The group id is the leader's pid; only trust it while the leader is the same process
    # or, with the leader gone, while the group still has members (the kernel does not
    # reuse a pid that is still some live process's group id).
    leader = proc_starttime(pid)
    if leader is not None and leader != starttime:
        _log(f"pid {pid} is another process now: nothing to terminate")
        return
    _log(f"terminating process group {pid} (runner vanished)")
    # Not our children: a /proc scan tells live members from zombies init has not reaped.
    end_group(pid, float(meta["kill_wait_s"]), alive=lambda: bool(group_members(pid)))
    write_json_atomically(objdir / CEASED_FILE, {"at": _now()})


class _Zygote:
    """Forks runners on request, so a runner costs a fork (about a millisecond) instead of an
    interpreter start (tens of milliseconds of CPU): with a thousand objects starting at once
    that is the difference between seconds and half a minute on two cores.

    One per data directory, listening on the abstract Unix socket ``name`` (bound at most
    once, so a second zygote just exits). A request is one JSON line,
    ``{"dir": <object dir>, "env": {...}}`` (the environment commands start from) or
    ``{"quit": true}``. The zygote answers ``forking`` before it forks, so a client that sees
    no answer knows no runner was made and can spawn one itself; the forked runner then
    answers ``ready`` on the same connection, as over the pipe of a directly spawned runner.
    It exits after ``idle_s`` seconds without a request.
    """

    def __init__(self, name: str, idle_s: float) -> None:
        self.name, self.idle_s = name, idle_s
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._wake_r, self._wake_w = os.pipe()

    def serve(self) -> None:
        try:
            self.sock.bind("\0" + self.name)
        except OSError:
            return  # another zygote serves this data directory
        self.sock.listen(256)
        _prctl(_PR_SET_NAME, b"dj-zygote")
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        _log(f"zygote {self.name} listening")
        idle_since = time.monotonic()
        while True:
            timeout = idle_since + self.idle_s - time.monotonic()
            if timeout <= 0:
                break
            readable, _, _ = select.select([self.sock.fileno(), self._wake_r], [], [], timeout)
            self.reap()
            if self._wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 512):
                        pass
            if self.sock.fileno() in readable:
                idle_since = time.monotonic()
                conn, _ = self.sock.accept()
                with conn:
                    if not self.handle(conn):
                        break
        # Closing the listener resets connections not yet accepted: they got no "forking".
        self.sock.close()
        _log(f"zygote {self.name} exits")

    def reap(self) -> None:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass

    def handle(self, conn: socket.socket) -> bool:
        """Serve one request; return whether to go on."""
        conn.settimeout(5.0)
        data = b""
        try:
            while not data.endswith(b"\n") and len(data) < 1 << 22:
                chunk = conn.recv(65536)
                if not chunk:
                    return True
                data += chunk
            request = json.loads(data)
        except (OSError, ValueError) as err:
            _log(f"bad request: {err!r}")
            return True
        if request.get("quit"):
            return False
        objdir = Path(str(request["dir"]))
        env = {str(k): str(v) for k, v in dict(request.get("env") or {}).items()}
        try:
            conn.sendall(b"forking\n")
        except OSError:
            return True
        if os.fork():
            return True
        # The child: forget the zygote, become the object's runner.
        try:
            self.sock.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(self._wake_r)
            os.close(self._wake_w)
            os.setsid()
            os.chdir(objdir)
            with open(objdir / RUNNER_LOG, "ab") as log, open(os.devnull, "rb") as null:
                os.dup2(null.fileno(), 0)
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
            conn.setblocking(True)
            _Runner(objdir, env).serve(ready_fd=conn.detach())
        except BaseException as err:  # the child must never return into the zygote
            with contextlib.suppress(BaseException):
                _log(f"runner failed: {err!r}")
            os._exit(1)
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    """Run the runner's command line (see the module docstring); return the exit status."""
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: local_runner (run|terminate) OBJECT_DIR | zygote NAME IDLE_S"
    if len(args) < 2 or args[0] not in ("run", "terminate", "zygote"):
        print(usage, file=sys.stderr)
        return 2
    if args[0] == "zygote":
        if len(args) != 3:
            print(usage, file=sys.stderr)
            return 2
        zygote = _Zygote(args[1], float(args[2]))
        if os.fork():
            os._exit(0)  # re-parented, like a runner
        os.setsid()
        zygote.serve()
        return 0
    if len(args) != 2:
        print(usage, file=sys.stderr)
        return 2
    mode, objdir = args[0], Path(args[1]).resolve()
    if mode == "terminate":
        if os.fork():
            return 0
        _terminate(objdir)
        return 0
    runner = _Runner(objdir)
    if os.fork():
        # The parent exits at once; the child is re-parented, so the backend never has to
        # reap it. The backend learns the child is up from the "ready" line on the pipe.
        os._exit(0)
    try:
        runner.serve()
    except BaseException as err:
        _log(f"runner failed: {err!r}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the files of the local backend's data directory hold, and how they are read and
written (see the package docstring for the layout)."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

import msgspec

from dispatch_backends import local_runner as _r
from dispatch_core.state import (
    ObservedObject,
    UtcDatetime,
)

log = logging.getLogger("dispatch_backends.local")

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
    tmp = _tmp_name(path)
    _write_new(tmp, data)
    os.replace(tmp, path)


def _tmp_name(path: Path) -> str:
    """A fresh temporary name beside ``path`` (``.<name>.<pid>.<random>.tmp``)."""
    return f"{os.fspath(path.parent)}/.{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _write_new(path: str, data: bytes) -> None:
    """Write ``data`` to the new file ``path`` with bare system calls: ``open()`` adds a
    stat, an ioctl and a seek, each a GIL release that the launch threads of a mass
    preemption contend on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _read(path: Path | str, decoder: msgspec.json.Decoder[T]) -> T | None:
    """Decode ``path``, or ``None`` when it does not exist or is not (yet) valid."""
    try:
        with open(path, "rb") as f:
            data = f.read()
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

"""Fault injection into a data directory, from this process or any other."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from dispatch_backends import local_runner as _r
from dispatch_backends.local.errors import FaultError
from dispatch_backends.local.files import (
    _FOREIGN_COMMAND,
    _JOB_PREFIX,
    _OBJECT_ID,
    _FaultState,
    _Files,
    _Meta,
    _same_process,
    _utcnow,
)
from dispatch_backends.local.store import _Store

CALLS: Final = ("start", "open-gate", "stop", "discover", "cessation", "emergency-stop")
"""The backend calls an ``unreachable-next`` fault can target (besides ``any``)."""


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

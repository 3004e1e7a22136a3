"""The local backend itself (see the package docstring)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

from dispatch_backends import local_runner as _r
from dispatch_backends.environment import execution_base_env
from dispatch_backends.local.errors import AdminHeldError, ObjectNotFound
from dispatch_backends.local.faults import Faults
from dispatch_backends.local.files import _Meta, _utcnow
from dispatch_backends.local.store import _Store
from dispatch_backends.output import check_window, read_file_chunk
from dispatch_backends.protocol import (
    CessationAnswer,
    LaunchRefusedError,
    LaunchUnknownError,
    OutputChunk,
    OutputNotFound,
    OutputStream,
    Snapshot,
    Unreachable,
)
from dispatch_backends.time_limit import parse_time_limit
from dispatch_core.epoch import epoch
from dispatch_core.state import (
    Declarations,
    ObjectRef,
)
from dispatch_core.steps import Launch

log = logging.getLogger("dispatch_backends.local")

# -- the backend ----------------------------------------------------------------------------


class LocalBackend:
    """Process groups on this machine, behind the :class:`~dispatch_backends.Backend` Protocol
    (also a :class:`~dispatch_backends.CessationSignal`, an
    :class:`~dispatch_backends.EmergencyStopper` and an
    :class:`~dispatch_backends.OutputReader`). See the module docstring.

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
        return self._launched("local.object.started", launch, object_id, unknown=unknown)

    def _resume(self, launch: Launch, object_id: str, path: Path, *, unknown: bool) -> ObjectRef:
        """A second start of a launch an earlier start made ``meta.json`` for: return that
        object, first giving it the runner the earlier start did not (its process died
        before, or while, asking for one). Never a second object, never a second runner
        (the runner's ``runner.json`` is created exclusively)."""
        if path.parent == self._store.objects and not (path / _r.RUNNER_FILE).exists():
            try:
                self._store.spawn(path, env=self._execution_env(), timeout_s=self._start_timeout_s)
            except RuntimeError as err:
                if not (path / _r.RUNNER_FILE).exists():
                    raise LaunchRefusedError(self._cluster, str(err)) from err
            except TimeoutError as err:
                raise LaunchUnknownError(self._cluster, str(err)) from err
        return self._launched("local.object.resumed", launch, object_id, unknown=unknown)

    def _launched(self, event: str, launch: Launch, object_id: str, *, unknown: bool) -> ObjectRef:
        """Log ``event`` for the launch's object and return it; with the ``unknown`` fault
        injected, raise instead, as a start whose answer was lost would.

        Raises:
            LaunchUnknownError: ``unknown``.
        """
        log.info(
            event,
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

    async def read_output(
        self, ref: ObjectRef, stream: OutputStream, offset: int, limit: int
    ) -> OutputChunk:
        """Read ``ref``'s ``stdout`` or ``stderr`` file (in its object directory, live or
        archived) from byte ``offset``, at most ``limit`` bytes (capped at
        ``OUTPUT_CHUNK_LIMIT``). Live until the runner wrote how the object ended
        (``status.json``); a pending object's output is empty and live.

        Raises:
            OutputNotFound: no such object (live or archived), or its output file was
                deleted after the command started (a file not made yet reads as empty).
            Unreachable: the file can't be read.
            ValueError: a negative offset or limit.
        """
        check_window(offset, limit)
        return await asyncio.to_thread(self._read_output, ref, stream, offset, limit)

    def _read_output(
        self, ref: ObjectRef, stream: OutputStream, offset: int, limit: int
    ) -> OutputChunk:
        try:
            path = self.object_dir(ref)
        except ObjectNotFound as err:
            raise OutputNotFound(self._cluster, err.detail) from None
        name = _r.STDOUT_FILE if stream is OutputStream.STDOUT else _r.STDERR_FILE
        # Decided before the read: an object that ends in between is read once more.
        live = path.parent == self._store.objects and not (path / _r.STATUS_FILE).exists()
        try:
            chunk = read_file_chunk(path / name, offset, limit, live=live)
        except OSError as err:
            raise Unreachable(self._cluster, f"cannot read {path / name}: {err}") from err
        if not live or chunk.data or (path / name).exists():
            return self._kept(path, name, chunk)
        # archived between finding the directory and reading it: read it where it went
        moved = self._store.find(ref.id, archived=True)
        if moved is None or moved == path:
            return self._kept(path, name, chunk)
        return self._kept(moved, name, read_file_chunk(moved / name, offset, limit, live=False))

    def _kept(self, path: Path, name: str, chunk: OutputChunk) -> OutputChunk:
        """``chunk``, unless the runner started the command (it wrote ``job.json``, having
        made both output files first) and the file is gone: deleted by someone, its output
        lost. Reading it as empty would show a finished job as one that printed nothing.

        Raises:
            OutputNotFound: the output file was deleted after the command started.
        """
        if not chunk.data and not (path / name).exists() and (path / _r.JOB_FILE).exists():
            raise OutputNotFound(
                self._cluster,
                f"{path / name} is gone: it was deleted after the command started, "
                "so its output is lost",
            )
        return chunk

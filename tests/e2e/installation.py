"""One dispatch installation for an end-to-end test, whatever the backend: a namespace on the
test nats-server (its streams deleted at the end), a clusters file, the backend the test
inspects, and the observer and supervisor run in-process (as tasks of the test's event loop)
or as subprocesses (``python -m services.<name>``) where the test is about processes being
killed or restarted.

Jobs are submitted as the API service does: ``decide`` against the folded record, and the
resulting events appended with optimistic concurrency.

A backend's harness subclasses :class:`Installation`, handing it the backend and the clusters
file's text, and says what to end on the backend once the services have stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, ClassVar, Final, Generic, TypeVar

import aiohttp
import nats
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

import dispatch_backends
from dispatch_backends import Backend
from dispatch_core import (
    Actor,
    ActorKind,
    Discovery,
    Job,
    JobEvent,
    JobSpec,
    ObservedObject,
    OperatorCommand,
    RecoveryPolicy,
    Status,
    Submit,
    decide,
    decode,
    decode_event,
    encode,
    fold,
)
from dispatch_nats import LatestStore, Layout, RecordStore, StreamKind, ensure_streams
from services.observer import service as observer_service
from services.observer.config import ObserverConfig
from services.supervisor import service as supervisor_service
from services.supervisor.config import SupervisorConfig
from services.supervisor.ports import DeliverFn
from tests.util import AsTheirWriters, assert_eventually

__all__ = ["ALICE", "InProcess", "Installation", "Subprocess"]

BackendT = TypeVar("BackendT", bound=Backend)
ServiceT = TypeVar("ServiceT", "InProcess", "Subprocess")
T = TypeVar("T")

ALICE: Final = Actor(name="alice", kind=ActorKind.HUMAN)
_REPO: Final = Path(__file__).resolve().parents[2]
_LIBS: Final = Path(dispatch_backends.__file__).resolve().parent.parent


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a service started next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class InProcess:
    """A service run as a task of the test's event loop."""

    def __init__(self, name: str, start: Callable[[asyncio.Event, asyncio.Event], Any]) -> None:
        self.name = name
        self._start = start
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._task = asyncio.create_task(self._start(self._stop, self._ready), name=self.name)
        ready = asyncio.ensure_future(self._ready.wait())
        done, _ = await asyncio.wait(
            {ready, self._task}, timeout=timeout_s, return_when="FIRST_COMPLETED"
        )
        ready.cancel()
        if self._task in done:
            self._task.result()  # raises what made it end
            raise AssertionError(f"{self.name} ended before it was ready")
        assert self._ready.is_set(), f"{self.name} not ready within {timeout_s} s"

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None


class Subprocess:
    """A service run as ``python -m services.<module>`` with its log in a file."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    async def start(self, timeout_s: float = 30.0, *, wait_ready: bool = True) -> None:
        """Start the process; wait until its ``/healthz`` answers 200 (connected, streams
        and consumers made), on the port its ``*_HTTP_PORT`` names."""
        self._log = self.log_path.open("ab")
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONPATH"] = os.pathsep.join([str(_REPO), str(_LIBS), str(_LIBS / "ckpt")])
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
            cwd=str(_REPO),
        )
        if not wait_ready:
            return
        port = next(v for k, v in self.env.items() if k.endswith("_HTTP_PORT"))
        url = f"http://127.0.0.1:{port}/healthz"

        async def up() -> None:
            assert self.proc is not None
            assert self.proc.returncode is None, f"{self.name} exited:\n{self.log_tail()}"
            try:
                async with aiohttp.ClientSession() as http, http.get(url) as response:
                    assert response.status == 200, f"{self.name}: {response.status}"
            except aiohttp.ClientError as err:
                raise AssertionError(f"{self.name} not listening yet: {err}") from None

        await assert_eventually(up, timeout_s=timeout_s, interval_s=0.1)

    def log_text(self, offset: int = 0) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def wait(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        self._close_log()
        return code

    async def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, and wait for it to end (SIGKILL after ``timeout_s``)."""
        if self.proc is None or self.proc.returncode is not None:
            self._close_log()
            return 0 if self.proc is None else self.proc.returncode or 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await self.wait(timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            self._close_log()
            raise AssertionError(f"{self.name} ignored SIGTERM:\n{self.log_tail()}") from None

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Installation(Generic[BackendT]):
    """One dispatch installation for one test (see the module docstring).

    A subclass hands over the backend of the one cluster (``backend.cluster`` names it), the
    clusters file's text, the observer's poll interval and, optionally, the supervisor's
    in-process ``deliver``; it may override :meth:`_clear_backend` and :meth:`_dump_extra`,
    and the class attributes below.
    """

    namespace_prefix: ClassVar[str] = "e"
    """Starts the installation's namespace (a random suffix follows)."""
    log_level: ClassVar[str] = "info"
    """The services' log level."""
    wait_timeout_s: ClassVar[float] = 60.0
    """How long :meth:`wait_status` and :meth:`wait_job` wait unless told."""
    wait_interval_s: ClassVar[float] = 0.1
    """How often :meth:`wait_status` and :meth:`wait_job` look."""

    def __init__(
        self,
        nats_url: str,
        tmp: Path,
        backend: BackendT,
        *,
        clusters_toml: str,
        poll_interval_s: float,
        deliver: DeliverFn | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.layout = Layout(namespace=f"{self.namespace_prefix}{secrets.token_hex(5)}")
        self.backend = backend
        self.poll_interval_s = poll_interval_s
        self.clusters_file = tmp / "clusters.toml"
        self.clusters_file.write_text(clusters_toml)
        self.services: list[InProcess | Subprocess] = []
        self.jobs: list[str] = []  # the jobs submit() made
        self._deliver = deliver
        self._nc: NATS | None = None
        self._records: RecordStore | None = None
        self._statuses: LatestStore | None = None
        self._discoveries: LatestStore | None = None

    # -- life ---------------------------------------------------------------------------------

    async def open(self) -> None:
        self._nc = await nats.connect(
            self.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.1
        )
        await ensure_streams(self._nc, layout=self.layout)
        # Long timeouts: a busy 2-core machine may keep the server from answering for a while.
        wait_s = 15.0
        self._records = AsTheirWriters(
            self._nc, layout=self.layout, ack_timeout_s=wait_s, read_timeout_s=wait_s
        )
        self._statuses, self._discoveries = (
            LatestStore(
                self._nc, kind, layout=self.layout, ack_timeout_s=wait_s, read_timeout_s=wait_s
            )
            for kind in (StreamKind.STATUS, StreamKind.DISCOVERY)
        )

    async def close(self) -> None:
        """Stop the services, end what the test left on the backend, delete the streams."""
        for service in reversed(self.services):
            with contextlib.suppress(Exception):
                if isinstance(service, Subprocess):
                    await service.kill()
                else:
                    await asyncio.wait_for(service.stop(), 30)
        try:
            await self._clear_backend()
        finally:
            if self._nc is not None:
                for store in (self._records, self._statuses, self._discoveries):
                    if store is not None:
                        await store.aclose()
                js = self._nc.jetstream()
                for kind in StreamKind:
                    with contextlib.suppress(nats.errors.Error):
                        await js.delete_stream(self.layout.stream(kind))
                await self._nc.close()

    async def _clear_backend(self) -> None:
        """Once the services have stopped: end what the test left on the backend."""

    @property
    def nc(self) -> NATS:
        assert self._nc is not None
        return self._nc

    @property
    def records(self) -> RecordStore:
        assert self._records is not None
        return self._records

    @property
    def discoveries(self) -> LatestStore:
        assert self._discoveries is not None
        return self._discoveries

    @property
    def statuses(self) -> LatestStore:
        assert self._statuses is not None
        return self._statuses

    # -- services -------------------------------------------------------------------------------

    def observer_env(self, **extra: str) -> dict[str, str]:
        env = {
            "OBSERVER_CLUSTER": self.backend.cluster,
            "OBSERVER_CLUSTERS_FILE": str(self.clusters_file),
            "OBSERVER_NATS_URL": self.nats_url,
            "OBSERVER_NAMESPACE": self.layout.namespace,
            "OBSERVER_POLL_INTERVAL_S": str(self.poll_interval_s),
            "OBSERVER_HTTP_PORT": "0",
            "OBSERVER_STORE_TIMEOUT_S": "10",
            "OBSERVER_LOG_LEVEL": self.log_level,
        }
        env.update({f"OBSERVER_{k.upper()}": v for k, v in extra.items()})
        return env

    def supervisor_env(self, **extra: str) -> dict[str, str]:
        env = {
            "SUPERVISOR_CLUSTERS_FILE": str(self.clusters_file),
            "SUPERVISOR_NATS_URL": self.nats_url,
            "SUPERVISOR_NAMESPACE": self.layout.namespace,
            "SUPERVISOR_HTTP_PORT": "0",
            "SUPERVISOR_RETRY_S": "1",
            "SUPERVISOR_LAUNCH_RETRY_S": "2",
            "SUPERVISOR_STORE_TIMEOUT_S": "10",
            "SUPERVISOR_LOG_LEVEL": self.log_level,
        }
        env.update({f"SUPERVISOR_{k.upper()}": v for k, v in extra.items()})
        return env

    async def observer(self, *, backend: Backend | None = None, **extra: str) -> InProcess:
        """Start the cluster's observer in this process (on ``backend``, if given, instead of
        one built from the clusters file)."""
        cfg = ObserverConfig.from_env(self.observer_env(**extra))

        async def start(stop: asyncio.Event, ready: asyncio.Event) -> None:
            await observer_service.run(
                cfg, stop, registry=CollectorRegistry(), ready=ready, backend=backend
            )

        return await self._start(InProcess("observer", start))

    async def observer_process(self, **extra: str) -> Subprocess:
        """Start the cluster's observer as ``python -m services.observer``."""
        env = self.observer_env(**{"http_port": str(_free_port()), **extra})
        return await self._start(
            Subprocess("observer", "services.observer", env, self.tmp / "observer.log")
        )

    async def supervisor(
        self,
        *,
        deliver: DeliverFn | None = None,
        backends: Mapping[str, Backend] | None = None,
        name: str = "supervisor",
        **extra: str,
    ) -> InProcess:
        """Start a supervisor replica in this process (``deliver`` in-process, if given, else
        the installation's; on ``backends``, if given, instead of those the clusters file
        builds)."""
        cfg = SupervisorConfig.from_env(self.supervisor_env(**extra))
        deliver = self._deliver if deliver is None else deliver

        async def start(stop: asyncio.Event, ready: asyncio.Event) -> None:
            await supervisor_service.run(
                cfg,
                stop,
                registry=CollectorRegistry(),
                ready=ready,
                deliver=deliver,
                backends=backends,
            )

        return await self._start(InProcess(name, start))

    async def supervisor_process(self, *, name: str = "supervisor", **extra: str) -> Subprocess:
        """Start a supervisor replica as ``python -m services.supervisor``."""
        env = self.supervisor_env(**{"http_port": str(_free_port()), **extra})
        return await self._start(
            Subprocess(name, "services.supervisor", env, self.tmp / f"{name}.log")
        )

    async def _start(self, service: ServiceT) -> ServiceT:
        await service.start()
        self.services.append(service)
        return service

    # -- jobs -----------------------------------------------------------------------------------

    async def submit(self, job_id: str, spec: JobSpec, policy: RecoveryPolicy) -> None:
        """Create the job's record, as the API service does."""
        self.jobs.append(job_id)
        command = Submit(
            by=ALICE,
            job_id=job_id,
            spec=spec,
            policy=policy,
            declarations=self.backend.declarations(),
        )
        await self.command(job_id, command)

    async def command(self, job_id: str, command: OperatorCommand) -> tuple[JobEvent, ...]:
        """Decide ``command`` against the job's record and append what it commits (to each
        job's own record: a command may append to other jobs' records too).

        Raises:
            dispatch_core.Refused: ``decide`` refused it.
        """
        job = await self.job(job_id) if await self.records.last_seq(job_id) else None
        events = decide(job, command, datetime.now(UTC))
        seq = 0 if job is None else job.seq
        token = secrets.token_hex(6)
        by_job: dict[str, list[JobEvent]] = {}
        for event in events:
            by_job.setdefault(event.job_id, []).append(event)
        for target, evs in by_job.items():
            expected = seq if target == job_id else await self.records.last_seq(target)
            await self.records.append_many(
                target,
                [encode(e) for e in evs],
                expected_last_seq=expected,
                msg_ids=[f"test:{token}:{i}" for i in range(len(evs))],
            )
        return events

    async def job(self, job_id: str) -> Job:
        entries = await self.records.read(job_id)
        assert entries, f"job {job_id} has no record"
        return fold(
            ((e.seq, decode_event(e.payload), e.writer) for e in entries), datetime.now(UTC)
        )

    async def events(self, job_id: str) -> list[JobEvent]:
        return [decode_event(e.payload) for e in await self.records.read(job_id)]

    async def status(self, job_id: str) -> Status | None:
        entry = await self.statuses.get((job_id,))
        return None if entry is None else decode(entry.payload, Status)

    async def discovery(self, job_id: str) -> Discovery | None:
        entry = await self.discoveries.get((self.backend.cluster, job_id))
        return None if entry is None else decode(entry.payload, Discovery)

    async def wait_status(
        self,
        job_id: str,
        check: Callable[[Status], None],
        *,
        timeout_s: float | None = None,
    ) -> Status:
        """Wait until the job's latest Status passes ``check`` (which asserts)."""

        async def probe() -> Status:
            status = await self.status(job_id)
            assert status is not None, f"{job_id}: no status yet"
            check(status)
            return status

        return await self._wait(job_id, probe, timeout_s)

    async def wait_job(
        self, job_id: str, check: Callable[[Job], None], *, timeout_s: float | None = None
    ) -> Job:
        """Wait until the job's folded record passes ``check`` (which asserts)."""

        async def probe() -> Job:
            job = await self.job(job_id)
            check(job)
            return job

        return await self._wait(job_id, probe, timeout_s)

    async def _wait(
        self, job_id: str, probe: Callable[[], Awaitable[T]], timeout_s: float | None
    ) -> T:
        """``assert_eventually(probe)``, with :meth:`dump` in its failure message."""
        try:
            return await assert_eventually(
                probe,
                timeout_s=self.wait_timeout_s if timeout_s is None else timeout_s,
                interval_s=self.wait_interval_s,
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\n{await self.dump(job_id)}") from None

    async def dump(self, job_id: str) -> str:
        """The job's record, Discovery and objects, for a failure message."""
        lines = [f"--- record of {job_id}:"]
        for entry in await self.records.read(job_id):
            lines.append(f"{entry.seq} {entry.msg_id} {entry.payload.decode()}")
        lines.append(f"--- discovery: {await self.discovery(job_id)}")
        lines.append(f"--- status: {await self.status(job_id)}")
        with contextlib.suppress(Exception):
            objects = (await self.objects()).get(job_id, ())
            lines.extend(f"--- object {o}" for o in objects)
        js = self.nc.jetstream()
        for stream, durable in (
            (self.layout.record_stream, "supervisor-record"),
            (self.layout.discovery_stream, "supervisor-discovery"),
            (self.layout.work_stream, "supervisor-work"),
        ):
            with contextlib.suppress(Exception):
                info = await js.consumer_info(stream, durable)
                lines.append(
                    f"--- consumer {durable}: delivered={info.delivered} "
                    f"ack_floor={info.ack_floor} ack_pending={info.num_ack_pending} "
                    f"pending={info.num_pending} waiting={info.num_waiting} "
                    f"redelivered={info.num_redelivered}"
                )
        for service in self.services:
            if isinstance(service, InProcess) and service.task is not None and service.task.done():
                exc = None if service.task.cancelled() else service.task.exception()
                text = "".join(traceback.format_exception(exc)) if exc else "no exception"
                lines.append(f"--- {service.name} ended: {text}")
        lines.extend(self._dump_extra(job_id))
        return "\n".join(lines)

    def _dump_extra(self, job_id: str) -> list[str]:
        """More lines for :meth:`dump` (the backend's own)."""
        return []

    # -- the backend ---------------------------------------------------------------------------

    async def objects(self) -> Mapping[str, tuple[ObservedObject, ...]]:
        """Every object the backend shows, by job id."""
        return (await self.backend.discover()).objects

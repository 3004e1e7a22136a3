"""A dispatch installation on the Slurm test cluster for the end-to-end walkthrough: a
namespace on the test nats-server, a clusters file naming the cluster (``lab``, the slurm
backend), and the observer and a supervisor replica run in-process (as tasks of the test's
event loop).

Jobs are submitted as the API service does: ``decide`` against the folded record, and the
events appended with optimistic concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import nats
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_backends.slurm import SlurmBackend, SlurmSettings
from dispatch_core import (
    Actor,
    ActorKind,
    Escalation,
    Job,
    JobEvent,
    JobSpec,
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
from dispatch_core.state import ObjectRef, ObservedObject
from dispatch_nats import LatestStore, Layout, RecordStore, StreamKind, ensure_streams
from services.observer import service as observer_service
from services.observer.config import ObserverConfig
from services.supervisor import service as supervisor_service
from services.supervisor.config import SupervisorConfig
from tests.e2e.runtime.harness import InProcess
from tests.util import assert_eventually

__all__ = ["ALICE", "CLUSTER", "SlurmRuntime"]

CLUSTER: Final = "lab"
ALICE: Final = Actor(name="alice", kind=ActorKind.HUMAN)


class SlurmRuntime:
    """One dispatch installation on the Slurm test cluster, for one test."""

    def __init__(
        self,
        nats_url: str,
        tmp: Path,
        *,
        poll_interval_s: float = 1.0,
        node_loss_window_s: float = 60.0,
        accounting_grace_s: float = 20.0,
    ) -> None:
        self.nats_url = nats_url
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.out = tmp / "out"
        self.out.mkdir(exist_ok=True)
        self.layout = Layout(namespace=f"s{secrets.token_hex(5)}")
        self.poll_interval_s = poll_interval_s
        self.settings = SlurmSettings(
            node_loss_window_s=node_loss_window_s,
            accounting_grace_s=accounting_grace_s,
            output_dir=str(self.out),
            workdir=str(tmp),
            open_mode="append",
        )
        self.clusters_file = tmp / "clusters.toml"
        self.clusters_file.write_text(
            "[[clusters]]\n"
            f'name = "{CLUSTER}"\n'
            'backend = "slurm"\n'
            f"node_loss_window_s = {node_loss_window_s}\n"
            f"accounting_grace_s = {accounting_grace_s}\n"
            f'output_dir = "{self.out}"\n'
            f'workdir = "{tmp}"\n'
            'open_mode = "append"\n'
        )
        self.backend = SlurmBackend(CLUSTER, self.settings)
        self.services: list[InProcess] = []
        self.escalations: list[tuple[str, Escalation]] = []
        self.jobs: list[str] = []
        self._nc: NATS | None = None
        self._records: RecordStore | None = None
        self._statuses: LatestStore | None = None

    # -- life ----------------------------------------------------------------------------------

    async def open(self) -> None:
        self._nc = await nats.connect(
            self.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.1
        )
        await ensure_streams(self._nc, layout=self.layout)
        self._records = RecordStore(self._nc, layout=self.layout)
        self._statuses = LatestStore.status(self._nc, layout=self.layout)

    async def close(self) -> None:
        for service in reversed(self.services):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), 30)
        with contextlib.suppress(Exception):
            snapshot = await self.backend.discover()
            refs = [o.ref for j in self.jobs for o in snapshot.objects.get(j, ()) if o.alive]
            for ref in refs:
                await self.backend.stop(ref)
        if self._nc is not None:
            for store in (self._records, self._statuses):
                if store is not None:
                    await store.aclose()
            js = self._nc.jetstream()
            for kind in StreamKind:
                with contextlib.suppress(nats.errors.Error):
                    await js.delete_stream(self.layout.stream(kind))
            await self._nc.close()

    @property
    def records(self) -> RecordStore:
        assert self._records is not None
        return self._records

    # -- services ------------------------------------------------------------------------------

    async def observer(self) -> InProcess:
        cfg = ObserverConfig.from_env(
            {
                "OBSERVER_CLUSTER": CLUSTER,
                "OBSERVER_CLUSTERS_FILE": str(self.clusters_file),
                "OBSERVER_NATS_URL": self.nats_url,
                "OBSERVER_NAMESPACE": self.layout.namespace,
                "OBSERVER_POLL_INTERVAL_S": str(self.poll_interval_s),
                "OBSERVER_HTTP_PORT": "0",
                "OBSERVER_LOG_LEVEL": "warning",
            }
        )

        async def start(stop: asyncio.Event, ready: asyncio.Event) -> None:
            await observer_service.run(cfg, stop, registry=CollectorRegistry(), ready=ready)

        service = InProcess("observer", start)
        await service.start()
        self.services.append(service)
        return service

    async def supervisor(self) -> InProcess:
        cfg = SupervisorConfig.from_env(
            {
                "SUPERVISOR_CLUSTERS_FILE": str(self.clusters_file),
                "SUPERVISOR_NATS_URL": self.nats_url,
                "SUPERVISOR_NAMESPACE": self.layout.namespace,
                "SUPERVISOR_HTTP_PORT": "0",
                "SUPERVISOR_RETRY_S": "1",
                "SUPERVISOR_LAUNCH_RETRY_S": "2",
                "SUPERVISOR_LOG_LEVEL": "warning",
            }
        )

        async def deliver(job_id: str, escalation: Escalation) -> None:
            self.escalations.append((job_id, escalation))

        async def start(stop: asyncio.Event, ready: asyncio.Event) -> None:
            await supervisor_service.run(
                cfg, stop, registry=CollectorRegistry(), ready=ready, deliver=deliver
            )

        service = InProcess("supervisor", start)
        await service.start()
        self.services.append(service)
        return service

    # -- jobs ----------------------------------------------------------------------------------

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
        job = await self.job(job_id) if await self.records.last_seq(job_id) else None
        events = decide(job, command, datetime.now(UTC))
        token = secrets.token_hex(6)
        await self.records.append_many(
            job_id,
            [encode(e) for e in events],
            expected_last_seq=0 if job is None else job.seq,
            msg_ids=[f"test:{token}:{i}" for i in range(len(events))],
        )
        return events

    async def job(self, job_id: str) -> Job:
        entries = await self.records.read(job_id)
        assert entries, f"job {job_id} has no record"
        return fold(((e.seq, decode_event(e.payload)) for e in entries), datetime.now(UTC))

    async def events(self, job_id: str) -> list[JobEvent]:
        return [decode_event(e.payload) for e in await self.records.read(job_id)]

    async def status(self, job_id: str) -> Status | None:
        assert self._statuses is not None
        entry = await self._statuses.get((job_id,))
        return None if entry is None else decode(entry.payload, Status)

    async def dump(self, job_id: str) -> str:
        lines = [f"--- record of {job_id}:"]
        for entry in await self.records.read(job_id):
            lines.append(f"{entry.seq} {entry.payload.decode()[:400]}")
        lines.append(f"--- status: {await self.status(job_id)}")
        with contextlib.suppress(Exception):
            snapshot = await self.backend.discover()
            lines.extend(f"--- object {o}" for o in snapshot.objects.get(job_id, ()))
        lines.append(f"--- escalations: {self.escalations}")
        return "\n".join(lines)

    async def wait_status(
        self, job_id: str, check: Callable[[Status], None], *, timeout_s: float = 120.0
    ) -> Status:
        """Wait until the job's latest Status passes ``check`` (which asserts)."""

        async def probe() -> Status:
            status = await self.status(job_id)
            assert status is not None, f"{job_id}: no status yet"
            check(status)
            return status

        try:
            return await assert_eventually(probe, timeout_s=timeout_s, interval_s=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{await self.dump(job_id)}") from None

    async def wait_job(
        self, job_id: str, check: Callable[[Job], None], *, timeout_s: float = 120.0
    ) -> Job:
        """Wait until the job's folded record passes ``check`` (which asserts)."""

        async def probe() -> Job:
            job = await self.job(job_id)
            check(job)
            return job

        try:
            return await assert_eventually(probe, timeout_s=timeout_s, interval_s=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{await self.dump(job_id)}") from None

    # -- the cluster ---------------------------------------------------------------------------

    async def observed(self, job_id: str, ref: ObjectRef) -> ObservedObject | None:
        snapshot = await self.backend.discover()
        return next((o for o in snapshot.objects.get(job_id, ()) if o.ref == ref), None)

    def output(self, ref: ObjectRef) -> str:
        """Everything the object's executions printed (one file, appended)."""
        found = sorted(self.out.glob(f"*-{ref.id}.out"))
        return found[0].read_text() if found else ""

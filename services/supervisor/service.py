"""The supervisor service: any number of replicas share the jobs' passes over JetStream
(docs/runtime.md, "Supervisor"). :func:`run` runs one replica; :class:`Supervisor` runs jobs
from a program. The parts: :mod:`services.supervisor.replica` (the replica's loops: what
wakes a job, catch-up), :mod:`services.supervisor.scheduling` (one worker per job, the echo
rule), :mod:`services.supervisor.deadlines` (deadline and retry wakes),
:mod:`services.supervisor.passes` (one pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from datetime import datetime

from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_backends import Backend, close_backend
from dispatch_backends.config import load_clusters, make_backend
from dispatch_core import (
    Status,
)
from dispatch_nats import (
    DEFAULT_LAYOUT,
    Layout,
    NatsStoreError,
)
from services.common.clock import utcnow
from services.common.http import health_app, start_http
from services.common.lifecycle import (
    open_nats,
)
from services.supervisor.config import NOTIFIER, SupervisorConfig
from services.supervisor.deadlines import Deadlines
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassError, PassExecutor, PassOutcome
from services.supervisor.ports import DeliverFn
from services.supervisor.replica import Replica, _stores
from services.supervisor.scheduling import Scheduler, Source

__all__ = [
    "Deadlines",
    "JobNotFound",
    "Replica",
    "Scheduler",
    "Source",
    "Supervisor",
    "load_deliver",
    "run",
]

log = logging.getLogger("dispatch.supervisor")


def load_deliver(spec: str) -> DeliverFn | None:
    """Resolve ``SUPERVISOR_DELIVER``: None for ``notifier``, else the ``<module>:<name>``
    callable.

    Raises:
        ValueError: the module or the name can't be found, or it is not callable.
    """
    if spec == NOTIFIER:
        return None
    module_name, _, attr = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"deliver {spec!r}: {err}") from err
    if not callable(target):
        raise ValueError(f"deliver {spec!r} is not callable")
    deliver: DeliverFn = target  # checked callable; async by contract
    return deliver


async def run(
    cfg: SupervisorConfig,
    stop: asyncio.Event,
    *,
    registry: CollectorRegistry | None = None,
    ready: asyncio.Event | None = None,
    deliver: DeliverFn | None = None,
    backends: Mapping[str, Backend] | None = None,
    on_http: Callable[[int], None] | None = None,
) -> None:
    """Run one supervisor replica until ``stop`` is set (docs/runtime.md, "Supervisor").

    Args:
        cfg: the configuration.
        stop: set it to shut down (passes in flight get ``cfg.shutdown_grace_s``).
        registry: the Prometheus registry to export on (a fresh one by default).
        ready: set once connected, streams and consumers made and the catch-up published
            (``/healthz`` answers 200 from then on).
        deliver: an in-process ``Deliver`` (overrides ``cfg.deliver``).
        backends: the backends by cluster (default: built from the clusters file).
        on_http: called with the HTTP port bound.

    Raises:
        ClustersConfigError: the clusters file is invalid.
        ValueError: ``cfg.deliver`` names nothing callable.
        NatsStoreError: the streams can't be created or read at start-up.
    """
    registry = registry if registry is not None else CollectorRegistry()
    ready = ready if ready is not None else asyncio.Event()
    built = backends is None
    if backends is None:
        clusters = load_clusters(cfg.clusters_file)
        backends = {c.name: make_backend(c) for c in clusters.clusters}
    if deliver is None:
        deliver = load_deliver(cfg.deliver)
    layout = Layout(namespace=cfg.namespace)
    metrics = SupervisorMetrics(registry)
    async with AsyncExitStack() as stack:
        if built:
            for backend in backends.values():
                stack.push_async_callback(close_backend, backend)
        runner, port = await start_http(
            health_app(registry, ready, service="supervisor"), cfg.http_host, cfg.http_port
        )
        stack.push_async_callback(runner.cleanup)
        if on_http is not None:
            on_http(port)
        name = "dispatch-supervisor"
        nc = await open_nats(
            stack, cfg, stop, name=name, replicas=cfg.stream_replicas, layout=layout
        )
        if nc is None:
            return
        replica = Replica(
            nc, layout=layout, backends=backends, metrics=metrics, cfg=cfg, deliver=deliver
        )
        stack.push_async_callback(replica.aclose)
        await replica.run(stop, ready)
        log.info("supervisor.stopped", extra={"writer": replica.executor.writer})


# -- library use ----------------------------------------------------------------------------


class JobNotFound(LookupError):
    """``run_job`` was given a job that has no record."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} has no record")
        self.job_id = job_id


class Supervisor:
    """Supervise jobs from a program (seed 002's ``supervise.New(backend, store,
    WithDeliver(...))`` and ``Run(ctx, job)``), without the service's shared consumers.

        supervisor = Supervisor(nc, [backend], deliver=page_someone)
        status = await supervisor.run_job("train-42")   # returns once the job settled

    Each pass is the service's (:class:`PassExecutor`); the job is woken by appends to its
    record, changes of its Discovery (an observer of its cluster must be running) and its
    deadlines. Other supervisors may run the same job at the same time: every decision is
    committed with optimistic concurrency.
    """

    def __init__(
        self,
        nc: NATS,
        backends: Mapping[str, Backend] | list[Backend],
        *,
        layout: Layout = DEFAULT_LAYOUT,
        deliver: DeliverFn | None = None,
        channel: str = "in-process",
        registry: CollectorRegistry | None = None,
        clock: Callable[[], datetime] = utcnow,
        retry_s: float = 5.0,
        launch_retry_s: float = 30.0,
        store_timeout_s: float = 5.0,
        store_retry_s: float = 60.0,
    ) -> None:
        """Supervise on ``nc`` with ``backends`` (by cluster, or a list of them); the
        durations are those of :class:`~services.supervisor.config.SupervisorConfig`."""
        if not isinstance(backends, Mapping):
            backends = {b.cluster: b for b in backends}
        self._nc = nc
        self._layout = layout
        self._clock = clock
        self._retry_s = retry_s
        self.records, self.discoveries, self.statuses = _stores(nc, layout, store_timeout_s)
        self.executor = PassExecutor(
            records=self.records,
            discoveries=self.discoveries,
            statuses=self.statuses,
            backends=backends,
            metrics=SupervisorMetrics(registry if registry is not None else CollectorRegistry()),
            deliver=deliver,
            channel=channel,
            clock=clock,
            launch_retry_s=launch_retry_s,
            store_retry_s=store_retry_s,
        )
        self._locks: dict[str, asyncio.Lock] = {}

    async def aclose(self) -> None:
        """Release the stores' subscriptions (the connection stays open)."""
        for store in (self.records, self.discoveries, self.statuses):
            await store.aclose()

    async def run_job(self, job_id: str) -> Status:
        """Supervise ``job_id`` until it settles; return its last Status.

        With ``deliver``, the last look happens before this returns (seed 002).

        Raises:
            JobNotFound: the job has no record.
            PassError: the record can't be read, or the job's cluster has no backend.
            NatsStoreError: the store failed.
        """
        lock = self._locks.setdefault(job_id, asyncio.Lock())
        changed = asyncio.Event()

        async def on_msg(_: object) -> None:
            changed.set()

        async def on_append(_: object) -> None:
            self.executor.note_appended(job_id)  # the next pass reads what is new
            changed.set()

        subs = [
            await self._nc.subscribe(self._layout.record_job_filter(job_id), cb=on_append),
            await self._nc.subscribe(f"{self._layout.root}.discovery.*.{job_id}", cb=on_msg),
        ]
        try:
            async with lock:
                while True:
                    changed.clear()
                    try:
                        outcome = await self.executor.run_pass(job_id)
                    except PassError as err:
                        if not err.retryable:
                            raise
                        outcome = PassOutcome(job_id=job_id, retry=True)
                    except NatsStoreError:
                        outcome = PassOutcome(job_id=job_id, retry=True)
                    if not outcome.found:
                        raise JobNotFound(job_id)
                    if outcome.settled and outcome.status is not None:
                        self.executor.forget(job_id)
                        return outcome.status
                    if outcome.follow_up:
                        continue
                    timeout: float | None = None
                    if outcome.wake_at is not None:
                        timeout = max((outcome.wake_at - self._clock()).total_seconds(), 0.0)
                    if outcome.retry:
                        timeout = min(timeout or self._retry_s, self._retry_s)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout)
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

"""The observer service: what one cluster's scheduler shows, published per job (docs/runtime.md,
"Observer").

Every ``poll_interval_s``: one ``backend.discover(expected=...)`` (one batched query, never one
per job) gives a Snapshot; for each job whose Discovery differs from the last one published
for it, a new Discovery goes to ``dispatch.discovery.<cluster>.<job>``. Comparing objects (not
``seen_at``) keeps the stream quiet while nothing changes, and a supervisor woken by a
Discovery always finds something new in it.

Gone is not ended (issue 15). ``expected`` is every own object the last published Discovery of
each job shows alive: the backend looks each one the scheduler no longer lists up where the
scheduler keeps ends (its real end, shown ended) or lists it vanished (no word of it). A
job's Discovery keeps showing each object it last showed ended after the scheduler forgets it,
and keeps listing each vanished one, so a supervisor that reads only the latest Discovery
(after an outage of its own, however long) still finds every end. An object the backend
neither lists nor accounts for is left out and never reported vanished: absence proves
nothing. At start-up the last Discovery of each of the cluster's jobs is read back from the
stream, so a restart publishes nothing twice and keeps expecting what it last saw alive.

It also answers the API's requests for a chunk of an object's output on
``dispatch.logs.<cluster>`` (services/observer/output.py; ``dispatch logs``).
Progress (issue 14, part 1): with a :class:`~services.observer.progress.PublicationReader`,
the Discovery of a job with a checkpoint root carries what its ``pub/`` listing shows
(``Discovery.publications``): read in the poll that first shows one of its executions ended
(so the supervisor decides that end with it), and every ``progress_every`` polls while the
job lives; a reading whose latest epoch and step are new publishes the Discovery.

After each poll a heartbeat goes to ``dispatch.observer.<cluster>``: reachable, or
unreachable with the error. An unreachable scheduler publishes no Discovery, so no job's
state changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Final

import msgspec
import nats
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_backends import Backend, BackendError, Unreachable, close_backend
from dispatch_backends.config import load_clusters, make_backend, poll_interval_s
from dispatch_core import (
    Discovery,
    ObjectRef,
    ObservedObject,
    Publications,
    decode,
    encode,
    is_job_id,
)
from dispatch_core.writers import WriterKind
from dispatch_nats import LatestStore, Layout, NatsStoreError, RecordStore, StreamKind
from services.common.clock import utcnow
from services.common.http import health_app, start_http
from services.common.lifecycle import (
    open_nats,
    retry_until_stopped,
    run_until_stopped,
)
from services.observer.config import ObserverConfig
from services.observer.heartbeat import Heartbeat, encode_heartbeat
from services.observer.metrics import ObserverMetrics
from services.observer.output import OutputServer
from services.observer.progress import PublicationReader, RecordRoots

__all__ = ["Observer", "PollResult", "run"]

log = logging.getLogger("dispatch.observer")

_PUBLISH_CONCURRENCY: Final = 256
"""Most Discovery puts in flight at once (a mass preemption changes every job at once)."""


class PollResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one poll did.

    Attributes:
        reachable: whether the scheduler answered.
        error: its error when it did not.
        published: Discoveries published.
        failed: Discoveries that could not be published (retried at the next poll).
        jobs: jobs with objects on the cluster.
        calls: scheduler calls the discover took.
        duration_s: how long the poll took, in seconds.
    """

    reachable: bool
    error: str = ""
    published: int = 0
    failed: int = 0
    jobs: int = 0
    calls: int = 0
    duration_s: float = 0.0


class Observer:
    """Polls one backend and publishes each job's Discovery when it changes."""

    def __init__(
        self,
        backend: Backend,
        discoveries: LatestStore,
        nc: NATS,
        *,
        layout: Layout,
        metrics: ObserverMetrics,
        poll_interval_s: float,
        clock: Callable[[], datetime] = utcnow,
        publications: PublicationReader | None = None,
        progress_every: int = 10,
    ) -> None:
        """Observe ``backend``'s cluster.

        Args:
            backend: the cluster's backend.
            discoveries: the discovery stream.
            nc: the connection heartbeats go out on.
            layout: subject names.
            metrics: where to count polls.
            poll_interval_s: seconds between two polls' starts.
            clock: the time of a heartbeat of an unreachable poll.
            publications: reads jobs' ``pub/`` listings (issue 14); ``None``: never.
            progress_every: polls between two readings of a live job's listing.
        """
        self._backend = backend
        self._cluster = backend.cluster
        self._discoveries = discoveries
        self._nc = nc
        self._layout = layout
        self._metrics = metrics
        self._interval_s = poll_interval_s
        self._clock = clock
        self._last: dict[str, tuple[ObservedObject, ...]] = {}
        self._vanished: dict[str, tuple[ObjectRef, ...]] = {}
        self._skipped: set[str] = set()
        self._reader = publications
        self._progress_every = max(1, progress_every)
        self._polls = 0
        self._pubs: dict[str, Publications] = {}

    @property
    def known(self) -> Mapping[str, tuple[ObservedObject, ...]]:
        """The objects of the last Discovery published for each job."""
        return self._last

    @property
    def expected(self) -> dict[ObjectRef, str]:
        """Own objects the last published Discovery of each job shows alive, with their job:
        what the next poll asks the backend to account for (issue 15)."""
        return {
            obj.ref: job_id
            for job_id, objs in self._last.items()
            for obj in objs
            if obj.alive and not obj.foreign
        }

    async def load(self) -> int:
        """Read back the last Discovery of each of the cluster's jobs; return how many.

        Raises:
            NatsStoreError: the discovery stream can't be read.
            dispatch_core.DecodeError: a stored Discovery can't be decoded.
        """
        entries = await self._discoveries.get_all((self._cluster,))
        for entry in entries:
            discovery = decode(entry.payload, Discovery)
            self._last[discovery.job_id] = discovery.objects
            self._vanished[discovery.job_id] = discovery.vanished
            if discovery.publications is not None:
                self._pubs[discovery.job_id] = discovery.publications
        log.info("observer.loaded", extra={"cluster": self._cluster, "jobs": len(self._last)})
        return len(entries)

    async def poll(self) -> PollResult:
        """Ask the backend once, publish what changed, and send a heartbeat."""
        started = time.monotonic()
        expected = self.expected
        try:
            snapshot = await self._backend.discover(expected=tuple(expected))
        except Unreachable as err:
            result = PollResult(reachable=False, error=err.detail)
        except BackendError as err:
            log.warning(
                "observer.discover_failed", extra={"cluster": self._cluster, "error": str(err)}
            )
            result = PollResult(reachable=False, error=err.detail)
        except Exception as err:  # the loop boundary: a bug must not stop observing
            log.exception("observer.discover_crashed", extra={"cluster": self._cluster})
            result = PollResult(reachable=False, error=f"{type(err).__name__}: {err}")
        else:
            vanished: dict[str, list[ObjectRef]] = {}
            for ref in snapshot.vanished:
                job_id = expected.get(ref)
                if job_id is not None:
                    vanished.setdefault(job_id, []).append(ref)
            published, failed = await self._publish_changes(
                snapshot.seen_at, snapshot.objects, vanished
            )
            result = PollResult(
                reachable=True,
                published=published,
                failed=failed,
                jobs=len(snapshot.objects),
                calls=snapshot.calls,
            )
        result = msgspec.structs.replace(result, duration_s=time.monotonic() - started)
        await self._heartbeat(result)
        self._metrics.observe_poll(
            reachable=result.reachable,
            duration_s=result.duration_s,
            calls=result.calls,
            published=result.published,
            jobs=result.jobs,
        )
        if not result.reachable:
            log.warning(
                "observer.unreachable", extra={"cluster": self._cluster, "error": result.error}
            )
        elif result.published or result.failed:
            log.debug(
                "observer.published",
                extra={
                    "cluster": self._cluster,
                    "published": result.published,
                    "failed": result.failed,
                },
            )
        return result

    async def _publish_changes(
        self,
        seen_at: datetime,
        objects: Mapping[str, tuple[ObservedObject, ...]],
        vanished: Mapping[str, list[ObjectRef]],
    ) -> tuple[int, int]:
        changes: list[Discovery] = []
        jobs: list[str] = []
        for job_id in objects:
            if not is_job_id(job_id):
                if job_id not in self._skipped:
                    self._skipped.add(job_id)
                    log.warning(
                        "observer.bad_job_name",
                        extra={"cluster": self._cluster, "job_id": job_id},
                    )
                continue
            jobs.append(job_id)
        # A job the backend no longer lists changes only if it had a live object (now shown
        # ended from the observer's memory, or left out) or one vanished.
        jobs += [
            j for j, objs in self._last.items() if j not in objects and any(o.alive for o in objs)
        ]
        jobs += [j for j in vanished if j not in objects]
        self._polls += 1
        built = [
            self._discovery(job_id, seen_at, objects.get(job_id, ()), vanished)
            for job_id in dict.fromkeys(jobs)
        ]
        read = await self._read_publications(built, seen_at)
        for discovery in built:
            job_id = discovery.job_id
            if job_id in read:
                discovery = msgspec.structs.replace(discovery, publications=read[job_id])
            last = self._last.get(job_id, ())
            last_vanished = self._vanished.get(job_id, ())
            same = (discovery.objects, discovery.vanished) == (last, last_vanished)
            moved = not same and _canonical(discovery.objects, discovery.vanished) != _canonical(
                last, last_vanished
            )
            progressed = job_id in read and _step(read[job_id]) != _step(self._pubs.get(job_id))
            if moved or progressed:
                changes.append(discovery)
        if not changes:
            return 0, 0
        slots = asyncio.Semaphore(_PUBLISH_CONCURRENCY)
        results = await asyncio.gather(*(self._put(d, slots) for d in changes))
        published = sum(results)
        return published, len(results) - published

    async def _read_publications(
        self, built: list[Discovery], seen_at: datetime
    ) -> dict[str, Publications | None]:
        """Read ``pub/`` of the jobs due (issue 14): one whose Discovery shows an execution
        ended that the last published one didn't, one with an object on a lost node, and,
        every ``progress_every`` polls, one with a live object. A job due whose reading
        failed gets ``None`` (nothing read, so the supervisor never decides an end on an
        earlier reading)."""
        if self._reader is None:
            return {}
        await self._reader.prepare(d.job_id for d in built)
        due: list[str] = []
        periodic = self._polls % self._progress_every == 0
        for discovery in built:
            if not self._reader.has_root(discovery.job_id):
                continue
            before = _ended(self._last.get(discovery.job_id, ()))
            # A live object with a cause is on a lost node (seed 000): the node-loss fence
            # may end its execution in any pass, so its listing is read every poll.
            fenced = any(o.alive and o.cause is not None for o in discovery.objects)
            if (
                _ended(discovery.objects) - before
                or fenced
                or (periodic and any(o.alive for o in discovery.objects))
            ):
                due.append(discovery.job_id)
        if not due:
            return {}
        got = await self._reader.read(due, seen_at)
        return {job_id: got.get(job_id) for job_id in due}

    def _discovery(
        self,
        job_id: str,
        seen_at: datetime,
        shown: tuple[ObservedObject, ...],
        vanished: Mapping[str, list[ObjectRef]],
    ) -> Discovery:
        """The job's Discovery: what the backend shows now, then each object the last one
        showed ended that the backend no longer lists (its end is kept), and every object
        ever listed vanished and not shown again."""
        listed = {obj.ref for obj in shown}
        kept = tuple(
            obj for obj in self._last.get(job_id, ()) if not obj.alive and obj.ref not in listed
        )
        gone = dict.fromkeys((*self._vanished.get(job_id, ()), *vanished.get(job_id, ())))
        return Discovery(
            cluster=self._cluster,
            job_id=job_id,
            seen_at=seen_at,
            objects=(*shown, *kept),
            vanished=tuple(ref for ref in gone if ref not in listed),
        )

    async def _put(self, discovery: Discovery, slots: asyncio.Semaphore) -> bool:
        async with slots:
            try:
                await self._discoveries.put((self._cluster, discovery.job_id), encode(discovery))
            except NatsStoreError as err:
                # Not recorded as published: the next poll finds it changed and tries again.
                log.warning(
                    "observer.publish_failed",
                    extra={"cluster": self._cluster, "job_id": discovery.job_id, "error": str(err)},
                )
                return False
        self._last[discovery.job_id] = discovery.objects
        self._vanished[discovery.job_id] = discovery.vanished
        if discovery.publications is not None:
            self._pubs[discovery.job_id] = discovery.publications
        return True

    async def _heartbeat(self, result: PollResult) -> None:
        beat = Heartbeat(
            cluster=self._cluster,
            at=self._clock(),
            reachable=result.reachable,
            error=result.error,
            jobs=result.jobs,
            poll_interval_s=self._interval_s,
        )
        try:
            await self._nc.publish(
                self._layout.observer_subject(self._cluster), encode_heartbeat(beat)
            )
        except nats.errors.Error as err:
            log.warning(
                "observer.heartbeat_failed", extra={"cluster": self._cluster, "error": repr(err)}
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``poll_interval_s`` (from one poll's start to the next) until ``stop``."""
        while not stop.is_set():
            started = time.monotonic()
            await self.poll()
            delay = self._interval_s - (time.monotonic() - started)
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)


def _canonical(
    objects: tuple[ObservedObject, ...], vanished: tuple[ObjectRef, ...]
) -> tuple[list[ObservedObject], set[ObjectRef]]:
    """A Discovery's content, in an order that doesn't depend on which objects the backend
    still lists and which the observer keeps (so a forgotten end republishes nothing)."""
    return sorted(objects, key=lambda o: (o.ref.cluster, o.ref.id)), set(vanished)


def _ended(objects: tuple[ObservedObject, ...]) -> set[tuple[ObjectRef, int]]:
    """The executions ``objects`` show ended: each earlier one, and the current one once the
    object is ended."""
    out = {(o.ref, e.restart) for o in objects if not o.foreign for e in o.executions}
    out |= {(o.ref, o.restarts) for o in objects if not o.foreign and not o.alive}
    return out


def _step(publications: Publications | None) -> tuple[int | None, int | None] | None:
    return None if publications is None else (publications.epoch, publications.step)


def _first_event(records: RecordStore) -> Callable[[str], Awaitable[bytes | None]]:
    async def first(job_id: str) -> bytes | None:
        entries = await records.read(job_id)
        return entries[0].payload if entries else None

    return first


def _loaded(observer: Observer) -> Callable[[], Awaitable[bool]]:
    async def load() -> bool:
        await observer.load()
        return True

    return load


async def run(
    cfg: ObserverConfig,
    stop: asyncio.Event,
    *,
    registry: CollectorRegistry | None = None,
    ready: asyncio.Event | None = None,
    backend: Backend | None = None,
    on_http: Callable[[int], Awaitable[None] | None] | None = None,
) -> None:
    """Run the observer until ``stop`` is set (docs/runtime.md, "Observer").

    Args:
        cfg: the configuration.
        stop: set it to shut down (within ``cfg.shutdown_grace_s``).
        registry: the Prometheus registry to export on (a fresh one by default).
        ready: set once NATS is connected, the streams exist and the state is loaded
            (``/healthz`` answers 200 from then on).
        backend: the backend to observe (default: built from the clusters file).
        on_http: called with the HTTP port bound (useful with ``http_port = 0``).

    Raises:
        ClustersConfigError: the clusters file is invalid or has no ``cfg.cluster``.
        NatsStoreError: the streams can't be created or the state can't be read.
    """
    registry = registry if registry is not None else CollectorRegistry()
    ready = ready if ready is not None else asyncio.Event()
    built = backend is None
    if backend is None:
        cluster = load_clusters(cfg.clusters_file).get(cfg.cluster)
        backend = make_backend(cluster)
        interval = cfg.poll_interval_s or poll_interval_s(cluster)
    else:
        interval = cfg.poll_interval_s or 1.0
    layout = Layout(namespace=cfg.namespace)
    metrics = ObserverMetrics(registry, backend.cluster)
    async with AsyncExitStack() as stack:
        if built:
            stack.push_async_callback(close_backend, backend)
        runner, port = await start_http(
            health_app(registry, ready, service="observer"), cfg.http_host, cfg.http_port
        )
        stack.push_async_callback(runner.cleanup)
        if on_http is not None:
            called = on_http(port)
            if called is not None:
                await called
        name = f"dispatch-observer-{backend.cluster}"
        nc = await open_nats(
            stack, cfg, stop, name=name, replicas=cfg.stream_replicas, layout=layout
        )
        if nc is None:
            return
        discoveries = LatestStore(
            nc,
            StreamKind.DISCOVERY,
            layout=layout,
            ack_timeout_s=cfg.store_timeout_s,
            read_timeout_s=cfg.store_timeout_s,
        )
        stack.push_async_callback(discoveries.aclose)
        # Progress (issue 14): each job's checkpoint root comes from its record's first
        # event; the observer only reads the record (it never appends).
        records = RecordStore(
            nc,
            writer=WriterKind.SUPERVISOR,
            layout=layout,
            read_timeout_s=cfg.store_timeout_s,
        )
        stack.push_async_callback(records.aclose)
        roots = RecordRoots(_first_event(records))
        observer = Observer(
            backend,
            discoveries,
            nc,
            layout=layout,
            metrics=metrics,
            poll_interval_s=interval,
            publications=PublicationReader(roots, learn=roots.learn),
        )
        if await retry_until_stopped(stop, "observer.load", _loaded(observer)) is None:
            return
        output = OutputServer(backend, nc, layout=layout)
        await output.start()  # `dispatch logs`: this cluster's output requests
        stack.push_async_callback(output.aclose)
        ready.set()
        log.info(
            "observer.started",
            extra={"cluster": backend.cluster, "poll_interval_s": interval, "http_port": port},
        )
        await run_until_stopped(stop, cfg.shutdown_grace_s, observer.run(stop))
        log.info("observer.stopped", extra={"cluster": backend.cluster})

"""The supervisor service: any number of replicas share the jobs' passes over JetStream
(docs/runtime.md, "Supervisor").

**What wakes a job.** Three durable pull consumers, each shared by every replica so that each
message goes to one of them: appends to the records (``<durable>-record``), Discovery changes
(``<durable>-discovery``) and pass requests on the work stream (``<durable>-work``). A pass
request is published for a deadline: every replica follows the status stream, keeps a heap of
the ``Dispatch-Wake-At`` of each job's latest Status, and when one comes publishes
``dispatch.work.<job>`` with ``Nats-Msg-Id: wake:<job>:<wake at>``; however many replicas
publish it, JetStream stores it once, and one replica runs the pass. A replica that dies
loses nothing: the others publish the same wake. At start-up a replica reads every job's
last Status and requests a pass (``catch-up:<job>:<record seq>``) for each job whose record
is ahead of its Status or that has not settled.

**Within a replica** passes of one job never overlap: a job has one worker at a time; a
message that arrives while its pass runs marks it dirty, and one more pass runs after. A
pass that appended events is followed by another when planning again on them gives steps
to carry out (seed 002: an escalation it committed is delivered after the next pass).
Messages are acked once a pass that covers them has completed; a record message whose event
a completed pass already saw is acked at once. A pass whose action failed (scheduler
unreachable) requests another pass ``retry_s`` later; a pass that failed on the store naks
its messages with that delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from typing import Final, Literal

from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext
from prometheus_client import CollectorRegistry

from dispatch_backends import Backend, close_backend
from dispatch_backends.config import load_clusters, make_backend
from dispatch_core import (
    MalformedRecord,
    State,
    Status,
    UndecodableEvent,
    WriterKind,
    WriterRefused,
    decode,
)
from dispatch_nats import (
    DEFAULT_LAYOUT,
    Delivery,
    JetStreamApiError,
    LatestEntry,
    LatestStore,
    Layout,
    NatsStoreError,
    RecordStore,
    SharedFeed,
    StoreUnavailable,
    StreamKind,
)
from dispatch_nats.contract import MSG_ID_HEADER, WAKE_AT_HEADER
from services.common.clock import utcnow
from services.common.http import health_app, start_http
from services.common.lifecycle import (
    START_BACKOFF,
    connect_nats,
    drain,
    ensure_streams_until,
    retry_until_stopped,
    run_until_stopped,
    wait_or_stop,
)
from services.supervisor.config import NOTIFIER, SupervisorConfig
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassError, PassExecutor, PassOutcome, PoisonRecord
from services.supervisor.ports import DeliverFn

__all__ = [
    "Deadlines",
    "JobNotFound",
    "Replica",
    "Scheduler",
    "Supervisor",
    "load_deliver",
    "run",
]

log = logging.getLogger("dispatch.supervisor")

Source = Literal["record", "discovery", "work"]

_MAX_ROUNDS: Final = 50
"""Most passes one worker runs in a row (a pass that appends is followed by another)."""
_PUBLISH_CONCURRENCY: Final = 64
_MAX_ACK_PENDING: Final = 20_000
"""Most messages of one consumer delivered and not yet acked, over all replicas."""


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


def _stores(
    nc: NATS, layout: Layout, timeout_s: float
) -> tuple[RecordStore, LatestStore, LatestStore]:
    """The record, discovery and status stores, waiting ``timeout_s`` for each reply."""
    # A pass acts on what it reads, and its wake is acknowledged once it ran: the record is
    # checked against the stream leader's last seq and the Discovery read from the leader,
    # so a replica still catching up never makes a pass see less than what woke it.
    return (
        RecordStore(
            nc,
            writer=WriterKind.SUPERVISOR,
            layout=layout,
            ack_timeout_s=timeout_s,
            read_timeout_s=timeout_s,
            check_reads=True,
        ),
        LatestStore(
            nc,
            StreamKind.DISCOVERY,
            layout=layout,
            ack_timeout_s=timeout_s,
            read_timeout_s=timeout_s,
            read_from_leader=True,
        ),
        LatestStore(
            nc, StreamKind.STATUS, layout=layout, ack_timeout_s=timeout_s, read_timeout_s=timeout_s
        ),
    )


# -- deadlines ------------------------------------------------------------------------------


class Deadlines:
    """Every job's next deadline (from the status stream) and local retries, as a heap; when
    one comes, a pass request goes to the work stream with a msg id every replica derives
    the same way."""

    def __init__(
        self,
        publish: Callable[[str, str], Awaitable[bool]],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """``publish(job_id, msg_id)`` sends a pass request; it returns False on failure."""
        self._publish = publish
        self._clock = clock
        self._heap: list[tuple[datetime, str, str]] = []
        self._wake: dict[str, datetime] = {}
        self._changed = asyncio.Event()

    def set_wake(self, job_id: str, at: datetime | None) -> None:
        """Make ``at`` the job's deadline (None: it has none)."""
        if at is None:
            self._wake.pop(job_id, None)
            return
        if self._wake.get(job_id) == at:
            return
        self._wake[job_id] = at
        self._push(at, job_id, f"wake:{job_id}:{at.isoformat()}")

    def retry(self, job_id: str, at: datetime) -> None:
        """Request a pass of the job at ``at`` (this replica's own retry)."""
        self._push(at, job_id, f"retry:{job_id}:{at.isoformat()}")

    def _push(self, at: datetime, job_id: str, msg_id: str) -> None:
        heapq.heappush(self._heap, (at, job_id, msg_id))
        self._changed.set()

    def __len__(self) -> int:
        return len(self._heap)

    async def _fire(self, entry: tuple[datetime, str, str], slots: asyncio.Semaphore) -> None:
        async with slots:
            if not await self._publish(entry[1], entry[2]):
                # Try again in a second (the deadline is still due).
                again = self._clock() + timedelta(seconds=1)
                heapq.heappush(self._heap, (again, entry[1], entry[2]))

    async def run(self, stop: asyncio.Event) -> None:
        """Publish each request when it comes, until ``stop``."""
        while not stop.is_set():
            self._changed.clear()
            now = self._clock()
            due: list[tuple[datetime, str, str]] = []
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)
                at, job_id, msg_id = entry
                if msg_id.startswith("wake:") and self._wake.get(job_id) != at:
                    continue  # superseded by a newer deadline
                due.append(entry)
            if due:
                slots = asyncio.Semaphore(_PUBLISH_CONCURRENCY)
                await asyncio.gather(*(self._fire(e, slots) for e in due))
                continue
            timeout = None
            if self._heap:
                timeout = max((self._heap[0][0] - self._clock()).total_seconds(), 0.0)
            waiters = [
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self._changed.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()


# -- per-job scheduling ---------------------------------------------------------------------


class _Slot:
    """One job's worker state in this replica."""

    __slots__ = ("deliveries", "dirty", "reflected", "running", "seen")

    def __init__(self) -> None:
        self.running = False
        self.dirty = False
        self.deliveries: list[Delivery] = []
        self.seen: list[Delivery] = []
        """Record messages that came while a pass ran, of events the pass had read or
        appended: acked after it if it planned from them, else kept for the next pass."""
        self.reflected = 0
        """The record seq a completed pass planned from: record messages up to it need
        no pass."""


class Scheduler:
    """Runs each woken job's passes, one worker per job, a bounded number at once."""

    def __init__(
        self,
        executor: PassExecutor,
        *,
        deadlines: Deadlines,
        metrics: SupervisorMetrics,
        max_concurrent: int,
        retry_s: float,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """Prepare; :meth:`run` starts it."""
        self._executor = executor
        self._deadlines = deadlines
        self._metrics = metrics
        self._slots_sem = asyncio.Semaphore(max_concurrent)
        self._retry_s = retry_s
        self._clock = clock
        self._jobs: dict[str, _Slot] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._stopping = False

    @property
    def stopping(self) -> bool:
        """Whether the scheduler stopped taking work (it changes while a pass runs)."""
        return self._stopping

    @property
    def busy(self) -> int:
        """Jobs whose worker is running."""
        return sum(1 for s in self._jobs.values() if s.running)

    async def wake(self, job_id: str, delivery: Delivery | None, source: Source) -> None:
        """A message for ``job_id`` came: run a pass (or mark the running one dirty)."""
        slot = self._jobs.setdefault(job_id, _Slot())
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "supervisor.wake",
                extra={
                    "job_id": job_id,
                    "source": source,
                    "seq": None if delivery is None else delivery.seq,
                    "running": slot.running,
                    "reflected": slot.reflected,
                },
            )
        if delivery is not None and source == "record":
            if delivery.seq <= slot.reflected:
                await _settle(delivery, "ack")
                return
            if slot.running and delivery.seq <= self._executor.cached_seq(job_id):
                # The running pass read it, or appended it itself (and will pass again).
                slot.seen.append(delivery)
                return
        if delivery is not None:
            slot.deliveries.append(delivery)
        if slot.running:
            slot.dirty = True
            return
        if self._tg is None or self._stopping:
            slot.deliveries.clear()
            if delivery is not None:
                await _settle(delivery, "nak")
            return
        slot.running = True
        self._tg.create_task(self._work(job_id, slot), name=f"job:{job_id}")

    async def _work(self, job_id: str, slot: _Slot) -> None:
        try:
            for _ in range(_MAX_ROUNDS):
                slot.dirty = False
                covered, slot.deliveries = slot.deliveries, []
                async with self._slots_sem:
                    if self._stopping:
                        slot.deliveries[:0] = covered
                        break
                    outcome, verdict = await self._pass(job_id)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "supervisor.pass_done",
                        extra={
                            "job_id": job_id,
                            "verdict": verdict,
                            "covered": len(covered),
                            "dirty": slot.dirty,
                            "planned_seq": None if outcome is None else outcome.planned_seq,
                            "appended": None if outcome is None else outcome.appended,
                            "follow_up": None if outcome is None else outcome.follow_up,
                        },
                    )
                await asyncio.gather(*(_settle(d, verdict, self._retry_s) for d in covered))
                if outcome is None:
                    if verdict == "nak" and not covered:
                        self._deadlines.retry(
                            job_id, self._clock() + timedelta(seconds=self._retry_s)
                        )
                    break
                planned = outcome.planned_seq
                slot.reflected = max(slot.reflected, planned)
                seen, slot.seen = slot.seen, []
                late = [d for d in seen if d.seq > planned]
                await asyncio.gather(*(_settle(d, "ack") for d in seen if d.seq <= planned))
                slot.deliveries.extend(late)
                if outcome.retry:
                    self._deadlines.retry(job_id, self._clock() + timedelta(seconds=self._retry_s))
                if self.stopping or not (outcome.follow_up or slot.dirty or slot.deliveries):
                    break
        finally:
            slot.running = False
            leftover, slot.deliveries = [*slot.deliveries, *slot.seen], []
            slot.seen = []
            if self._stopping:
                await asyncio.gather(*(_settle(d, "nak") for d in leftover))
            elif leftover or slot.dirty:
                slot.deliveries = leftover
                await self.wake(job_id, None, "work")  # arrived after the last round

    async def _pass(self, job_id: str) -> tuple[PassOutcome | None, Literal["ack", "nak", "term"]]:
        try:
            outcome = await self._executor.run_pass(job_id)
        except PassError as err:
            if err.retryable:
                self._metrics.passes.labels("retry").inc()
                log.warning("supervisor.pass_retry", extra={"job_id": job_id, "error": str(err)})
                return None, "nak"
            self._metrics.passes.labels("poison").inc()
            extra: dict[str, object] = {"job_id": job_id, "error": str(err)}
            if isinstance(err, PoisonRecord):
                # The job is left alone: its messages are terminated (never redelivered), no
                # Status is published, so no deadline wakes it again (issue 10).
                self._metrics.poison.labels(_poison_kind(err.error)).inc()
                extra["seq"] = err.seq
            log.error("supervisor.pass_poison", extra=extra)
            return None, "term"
        except NatsStoreError as err:
            self._metrics.passes.labels("retry").inc()
            log.warning("supervisor.pass_store_error", extra={"job_id": job_id, "error": str(err)})
            return None, "nak"
        except Exception:  # the loop boundary: log, count, carry on with other jobs
            self._metrics.passes.labels("error").inc()
            log.exception("supervisor.pass_crashed", extra={"job_id": job_id})
            return None, "nak"
        self._metrics.passes.labels("ok").inc()
        return outcome, "ack"

    async def run(self, stop: asyncio.Event) -> None:
        """Accept wakes until ``stop``; then let running passes finish (the caller bounds
        how long) and nak what waits."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            await stop.wait()
            self._stopping = True
            waiting = [d for s in self._jobs.values() if not s.running for d in s.deliveries]
            for slot in self._jobs.values():
                if not slot.running:
                    slot.deliveries = []
            await asyncio.gather(*(_settle(d, "nak") for d in waiting))
        self._tg = None


def _poison_kind(err: MalformedRecord) -> str:
    """The ``why`` label of an unreadable record."""
    if isinstance(err, UndecodableEvent):
        return "undecodable"
    if isinstance(err, WriterRefused):
        return "writer"
    return "malformed"


async def _settle(
    delivery: Delivery, verdict: Literal["ack", "nak", "term"], delay_s: float | None = None
) -> None:
    try:
        if verdict == "ack":
            await delivery.ack()
        elif verdict == "nak":
            await delivery.nak(delay_s)
        else:
            await delivery.term()
    except NatsStoreError as err:
        # Unacked, it is redelivered after the ack wait: at worst one more pass.
        log.debug("supervisor.settle_failed", extra={"verdict": verdict, "error": str(err)})


# -- the replica ------------------------------------------------------------------------------


class Replica:
    """One supervisor replica's loops on one NATS connection."""

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        backends: Mapping[str, Backend],
        metrics: SupervisorMetrics,
        cfg: SupervisorConfig,
        deliver: DeliverFn | None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """Prepare the replica (:meth:`open` connects its stores)."""
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=5.0)
        self._layout = layout
        self._metrics = metrics
        self._cfg = cfg
        self._clock = clock
        self.records, self.discoveries, self.statuses = _stores(nc, layout, cfg.store_timeout_s)
        self.executor = PassExecutor(
            records=self.records,
            discoveries=self.discoveries,
            statuses=self.statuses,
            backends=backends,
            metrics=metrics,
            deliver=deliver,
            channel=cfg.deliver_channel,
            clock=clock,
            launch_retry_s=cfg.launch_retry_s,
            store_retry_s=cfg.store_retry_s,
            crash_after_intent=cfg.crash_after_intent,
        )
        self.deadlines = Deadlines(self._publish_wake, clock=clock)
        self.scheduler = Scheduler(
            self.executor,
            deadlines=self.deadlines,
            metrics=metrics,
            max_concurrent=cfg.max_concurrent_passes,
            retry_s=cfg.retry_s,
            clock=clock,
        )
        self._states: dict[str, State] = {}

    async def aclose(self) -> None:
        """Release the stores' subscriptions."""
        for store in (self.records, self.discoveries, self.statuses):
            await store.aclose()

    # -- feeds ------------------------------------------------------------------------------

    def _feeds(self) -> list[tuple[Source, SharedFeed]]:
        cfg = self._cfg
        work = SharedFeed(
            self._nc,
            stream=self._layout.work_stream,
            durable=f"{cfg.durable}-work",
            filter_subject=self._layout.work_filter,
            job_of=self._layout.job_id_from_work_subject,
            api_prefix=self._layout.api_prefix,
            ack_wait_s=cfg.ack_wait_s,
            max_ack_pending=_MAX_ACK_PENDING,
            batch=cfg.fetch_batch,
            headers_only=True,
            from_start=True,
        )
        return [
            (
                "record",
                self.records.shared(
                    f"{cfg.durable}-record",
                    ack_wait_s=cfg.ack_wait_s,
                    max_ack_pending=_MAX_ACK_PENDING,
                    batch=cfg.fetch_batch,
                    from_start=False,
                ),
            ),
            (
                "discovery",
                self.discoveries.shared(
                    f"{cfg.durable}-discovery",
                    ack_wait_s=cfg.ack_wait_s,
                    max_ack_pending=_MAX_ACK_PENDING,
                    batch=cfg.fetch_batch,
                    from_start=False,
                ),
            ),
            ("work", work),
        ]

    async def consume(self, source: Source, feed: SharedFeed, stop: asyncio.Event) -> None:
        """Hand every message of ``feed`` to the scheduler until ``stop``.

        A store error (the connection lost for a while, a consumer that could not be
        re-created yet) never ends the replica: the feed is started again after a pause.
        """

        async def close_on_stop() -> None:
            await stop.wait()
            await feed.aclose()

        async with asyncio.TaskGroup() as tg:
            closer = tg.create_task(close_on_stop())
            try:
                delays = START_BACKOFF.delays(random.random)
                while not stop.is_set():
                    try:
                        delivery = await anext(feed)
                    except StopAsyncIteration:
                        break
                    except NatsStoreError as err:
                        if stop.is_set():
                            break
                        if not err.retryable and not isinstance(err, JetStreamApiError):
                            raise
                        delay = next(delays)
                        log.warning(
                            "supervisor.feed_failed",
                            extra={"source": source, "error": str(err), "retry_in_s": delay},
                        )
                        if await wait_or_stop(stop, delay):
                            break
                        await retry_until_stopped(stop, f"supervisor.{source}_feed", feed.start)
                        continue
                    delays = START_BACKOFF.delays(random.random)
                    self._metrics.deliveries.labels(source).inc()
                    await self.scheduler.wake(delivery.job_id, delivery, source)
            finally:
                closer.cancel()

    async def follow_statuses(self, stop: asyncio.Event) -> None:
        """Follow every job's Status: deadlines, the status cache, jobs by state.

        The feed is started again (after a pause) whenever it fails: a lost status only
        delays a deadline until the next Status of the job, but the replica must not end.
        """
        delays = START_BACKOFF.delays(random.random)
        while not stop.is_set():
            try:
                await self._follow_statuses(stop)
            except* NatsStoreError as group:
                delay = next(delays)
                log.warning(
                    "supervisor.status_feed_failed",
                    extra={"error": str(group.exceptions[0]), "retry_in_s": delay},
                )
                await wait_or_stop(stop, delay)

    async def _follow_statuses(self, stop: asyncio.Event) -> None:
        async with self.statuses.watch(()) as feed:

            async def close_on_stop() -> None:
                await stop.wait()
                await feed.aclose()

            async with asyncio.TaskGroup() as tg:
                closer = tg.create_task(close_on_stop())
                try:
                    async for entry in feed:
                        self.note_status(entry)
                except NatsStoreError:
                    if not stop.is_set():
                        raise
                finally:
                    closer.cancel()

    def note_status(self, entry: LatestEntry) -> None:
        """Take note of one Status from the stream."""
        job_id = entry.key[-1]
        status = self.executor.note_status(job_id, entry)
        if status is None:
            return
        wake = entry.headers.get(WAKE_AT_HEADER)
        try:
            at = None if wake is None else datetime.fromisoformat(wake)
        except ValueError:
            log.error("supervisor.bad_wake_header", extra={"job_id": job_id, "value": wake})
            at = None
        self.deadlines.set_wake(job_id, None if status.settled else at)
        old = self._states.get(job_id)
        if old is not status.state:
            if old is not None:
                self._metrics.jobs.labels(old.value).dec()
            self._metrics.jobs.labels(status.state.value).inc()
            self._states[job_id] = status.state

    async def _publish_wake(self, job_id: str, msg_id: str) -> bool:
        why = msg_id.split(":", 1)[0]
        try:
            await self._js.publish(
                self._layout.work_subject(job_id),
                b"",
                headers={MSG_ID_HEADER: msg_id},
            )
        except Exception as err:  # nats-py raises several unrelated types here
            log.warning(
                "supervisor.wake_publish_failed",
                extra={"job_id": job_id, "msg_id": msg_id, "error": repr(err)},
            )
            return False
        self._metrics.wakes.labels({"wake": "deadline"}.get(why, why)).inc()
        return True

    async def catch_up(self) -> int:
        """Request a pass of every job whose record is ahead of its Status or that has not
        settled; return how many.

        Raises:
            NatsStoreError: the streams can't be read.
        """
        statuses: dict[str, Status] = {}
        for entry in await self.statuses.get_all():
            self.note_status(entry)
            try:
                statuses[entry.key[-1]] = decode(entry.payload, Status)
            except Exception:  # noted (and logged) above
                continue
        jobs = await self.records.list_jobs()
        slots = asyncio.Semaphore(_PUBLISH_CONCURRENCY)

        async def check(job_id: str) -> bool | None:
            """None: no pass needed; else whether the pass request was published."""
            async with slots:
                # From the leader: a replica behind it could hide the events that make a
                # settled-looking job need a pass.
                seq = await self.records.leader_last_seq(job_id)
                status = statuses.get(job_id)
                if status is not None and status.settled and status.seq >= seq:
                    return None
                return await self._publish_wake(job_id, f"catch-up:{job_id}:{seq}")

        published = await asyncio.gather(*(check(j) for j in jobs))
        if False in published:
            # A wake not published is a job no replica may ever pass: try the catch-up
            # again (the wakes already stored are deduplicated by their msg ids).
            raise StoreUnavailable(
                "supervisor catch-up", f"{published.count(False)} pass requests not published"
            )
        woken = published.count(True)
        log.info("supervisor.caught_up", extra={"jobs": len(jobs), "woken": woken})
        return woken

    async def run(self, stop: asyncio.Event, ready: asyncio.Event) -> None:
        """Run every loop of the replica until ``stop``."""
        feeds = self._feeds()
        for source, feed in feeds:
            # Consumers first, so nothing appended after the scan is lost.
            if not await retry_until_stopped(stop, f"supervisor.{source}_feed", _started(feed)):
                return
        if await retry_until_stopped(stop, "supervisor.catch_up", self.catch_up) is None:
            return
        ready.set()
        log.info("supervisor.started", extra={"writer": self.executor.writer})
        loops = [
            self.scheduler.run(stop),
            self.deadlines.run(stop),
            self.follow_statuses(stop),
            *(self.consume(source, feed, stop) for source, feed in feeds),
        ]
        try:
            await run_until_stopped(stop, self._cfg.shutdown_grace_s, *loops)
        finally:
            for _, feed in feeds:
                await feed.aclose()


def _started(feed: SharedFeed) -> Callable[[], Awaitable[bool]]:
    async def start() -> bool:
        await feed.start()
        return True

    return start


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
        nc = await connect_nats(cfg, stop, name="dispatch-supervisor")
        if nc is None:
            return
        stack.push_async_callback(drain, nc)
        if not await ensure_streams_until(nc, stop, cfg.stream_replicas, layout=layout):
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

        subs = [
            await self._nc.subscribe(self._layout.record_job_filter(job_id), cb=on_msg),
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

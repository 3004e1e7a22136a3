"""One supervisor replica's loops (docs/runtime.md, "Supervisor").

**What wakes a job.** Three durable pull consumers, each shared by every replica so that each
message goes to one of them: appends to the records by writers other than the supervisor
(``<durable>-record``), Discovery changes with their values (``<durable>-discovery``) and
pass requests on the work stream (``<durable>-work``). Deadlines come from the status stream
(:mod:`services.supervisor.deadlines`). At start-up a replica reads every job's last Status
and requests a pass (``catch-up:<job>:<record seq>``) for each job whose record is ahead of
its Status or that has not settled.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Final

from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from dispatch_backends import Backend
from dispatch_core import (
    State,
    Status,
    WriterKind,
    decode,
)
from dispatch_nats import (
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
from services.common.lifecycle import (
    START_BACKOFF,
    closing_on_stop,
    retry_until_stopped,
    run_until_stopped,
    wait_or_stop,
)
from services.supervisor.config import SupervisorConfig
from services.supervisor.deadlines import Deadlines
from services.supervisor.delivered import DeliveredLatest
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassExecutor, PassOutcome
from services.supervisor.ports import DeliverFn
from services.supervisor.scheduling import Scheduler, Source

__all__ = ["Replica"]

log = logging.getLogger("dispatch.supervisor")

_PUBLISH_CONCURRENCY: Final = 64
"""Most catch-up pass requests published at once."""
_OWN: Final = frozenset({WriterKind.SUPERVISOR})
"""Writer kinds whose record appends wake no pass (see "the echo rule" in Scheduler)."""
_MAX_ACK_PENDING: Final = 20_000
"""Most messages of one consumer delivered and not yet acked, over all replicas."""


def _stores(
    nc: NATS, layout: Layout, timeout_s: float
) -> tuple[RecordStore, DeliveredLatest, LatestStore]:
    """The record, discovery and status stores, waiting ``timeout_s`` for each reply (the
    discovery store first takes a value the discovery consumer delivered: see
    ``services/supervisor/delivered.py``)."""
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
        DeliveredLatest(
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
            # follow_statuses brings every Status back: a pass's own is its ack (issue 11).
            status_echo_s=cfg.store_timeout_s,
        )
        self.deadlines = Deadlines(self._publish_wake, clock=clock)
        self.scheduler = Scheduler(
            self._run_pass,
            deadlines=self.deadlines,
            metrics=metrics,
            max_concurrent=cfg.max_concurrent_passes,
            retry_s=cfg.retry_s,
            clock=clock,
            on_settled=self._forget,
        )
        self._states: dict[str, State] = {}

    async def aclose(self) -> None:
        """Release the stores' subscriptions."""
        for store in (self.records, self.discoveries, self.statuses):
            await store.aclose()

    # -- feeds ------------------------------------------------------------------------------

    def _feeds(self) -> list[tuple[Source, SharedFeed]]:
        cfg = self._cfg
        layout = self._layout
        # What every replica's durables share: headers only, the replica's ack wait, batch
        # and pending bound.
        shared = functools.partial(
            SharedFeed,
            self._nc,
            api_prefix=layout.api_prefix,
            ack_wait_s=cfg.ack_wait_s,
            max_ack_pending=_MAX_ACK_PENDING,
            batch=cfg.fetch_batch,
            headers_only=True,
        )
        work = shared(
            stream=layout.work_stream,
            durable=f"{cfg.durable}-work",
            filter_subject=layout.work_filter,
            job_of=layout.job_id_from_work_subject,
            from_start=True,
        )
        # The supervisor's own appends are not consumed at all (the writer kind is the
        # record subject's last token): see "the echo rule" in Scheduler.
        records = shared(
            stream=layout.record_stream,
            durable=f"{cfg.durable}-record",
            filter_subject=[layout.record_writer_filter(w) for w in WriterKind if w not in _OWN],
            job_of=layout.job_id_from_record_subject,
            from_start=False,
            timeout_s=cfg.store_timeout_s,
        )
        return [
            ("record", records),
            (
                "discovery",
                self.discoveries.shared(
                    f"{cfg.durable}-discovery",
                    ack_wait_s=cfg.ack_wait_s,
                    max_ack_pending=_MAX_ACK_PENDING,
                    batch=cfg.fetch_batch,
                    from_start=False,
                    headers_only=False,  # the pass takes the value delivered: one read less
                ),
            ),
            ("work", work),
        ]

    async def consume(self, source: Source, feed: SharedFeed, stop: asyncio.Event) -> None:
        """Hand every message of ``feed`` to the scheduler until ``stop``.

        A store error (the connection lost for a while, a consumer that could not be
        re-created yet) never ends the replica: the feed is started again after a pause.
        """

        async with closing_on_stop(feed, stop):
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
                if source == "discovery":
                    self.discoveries.keep(delivery)
                elif source == "record":
                    self.executor.note_appended(delivery.job_id, delivery.seq)
                await self.scheduler.wake(delivery.job_id, delivery, source)

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
        async with self.statuses.watch(()) as feed, closing_on_stop(feed, stop):
            try:
                async for entry in feed:
                    self.note_status(entry)
            except NatsStoreError:
                if not stop.is_set():
                    raise

    async def _run_pass(self, job_id: str) -> PassOutcome:
        """Run one pass of ``job_id`` (the scheduler's ``run_pass``).

        A pass that fails takes no Discovery it was woken with: the value kept for it is
        dropped then. Its delivery is nak'd and may go to another replica, as may every
        newer value of the key; kept here, it would be handed to this replica's next pass
        of the job (a deadline, an append by the notifier), which would plan from a
        Discovery older than the record it reads: a stale decision committed (a stop of
        an object long ended) and a Status that reads the job unsettled.
        """
        try:
            return await self.executor.run_pass(job_id)
        except BaseException:
            self.discoveries.forget(job_id)
            raise

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
        if status.settled and self.scheduler.forget(job_id):
            # Not while its pass runs: the pass works on the executor's cache.
            self._forget(job_id)
        old = self._states.get(job_id)
        if old is not status.state:
            if old is not None:
                self._metrics.jobs.labels(old.value).dec()
            self._metrics.jobs.labels(status.state.value).inc()
            self._states[job_id] = status.state

    def _forget(self, job_id: str) -> None:
        """Drop a settled job from the per-job caches (bounded memory: a settled job's
        next pass, if any, reads its record again)."""
        self.executor.forget(job_id)
        self.discoveries.forget(job_id)

    def cached_jobs(self) -> frozenset[str]:
        """Every job some per-job cache of this replica holds (the per-state job gauge's
        own record of each job's state aside)."""
        return (
            self.executor.cached_jobs()
            | self.scheduler.jobs()
            | self.deadlines.jobs()
            | self.discoveries.kept_jobs()
        )

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

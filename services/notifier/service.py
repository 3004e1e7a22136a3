"""The notifier: deliver every escalation committed to a record, and record the delivery.

How work is shared: one durable pull consumer on the record stream (``NOTIFIER_DURABLE``),
shared by every replica, so each record event goes to one replica at a time. Events other
than ``escalation.committed`` are acked at once. The event that committed an escalation is
that escalation's unit of work: it stays unacked until the delivery is recorded, so

* two replicas never deliver the same escalation at once (only one holds its message; a
  long attempt extends the ack wait with ``in_progress``);
* a failed delivery is ``nak``'ed with a backoff delay (exponential, capped, with injected
  jitter; the server's delivery count is the attempt number), and JetStream hands it again
  to whichever replica is up, forever: nothing is lost while a channel is down;
* a replica that dies mid-delivery loses the message to another after ``ack_wait_s`` (on
  SIGTERM it ``nak``s what it holds, so the wait is skipped);
* catch-up at start-up is the consumer's own: it resumes where the group left off, so every
  escalation not yet recorded as delivered comes back (a new consumer starts at the
  stream's first event, so a first start delivers every undelivered escalation ever
  committed). At start-up, and every ``audit_interval_s``, every job's record is scanned to
  report undelivered escalations in ``/metrics`` (and the count in the log).

Delivering one escalation: load the job's record (``dispatch_nats.RecordRepository``); if
the record shows it delivered, stop (whoever delivered it). Otherwise send it to every
channel its route names (channels that already accepted it, in this process, are not sent to
again), and once all have accepted, append ``EscalationDelivered(id, channel=<names,
comma-separated>)`` as a fact with msg-id ``delivered:<job>:<id>``: the repository re-loads
after a lost race and appends nothing if another writer recorded the delivery meanwhile, and
finds out by reading whether an append whose ack was lost was stored.

Delivery is at least once: a crash between a channel accepting and the record showing it
delivered sends it again. Every notice carries ``<job>:<id>`` as its idempotency key so a
receiver can drop such a copy; once the record shows it delivered, it is never sent again.

Held notices (``held_notices``, issue 15 item 6): the event that placed a hold
(``hold.placed``, a recovery hold or a person's) is the unit of work of a notice with id
``held:<instance>``, routed like an escalation, sent at once so the on-call knows the job
waits for them. It is not an escalation: nothing is appended to the record, and the message
is acked once every channel accepted it (retried with the same backoff until then; at least
once, the same idempotency key on every copy). A hold no longer in force when its message is
handled (released, or the job has an outcome: e.g. a new consumer catching up from the
stream's start) is not notified.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Final

import aiohttp
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from dispatch_core import (
    DecodeError,
    DispatchError,
    Escalation,
    EscalationCommitted,
    EscalationDelivered,
    Hold,
    HoldKind,
    HoldPlaced,
    Job,
    MalformedRecord,
    WriterKind,
    decode_event,
    escalation_delivered,
    is_redundant,
)
from dispatch_core.backoff import Backoff
from dispatch_nats import (
    Delivery,
    Layout,
    NatsStoreError,
    RecordRepository,
    RecordStore,
    SharedFeed,
)
from services.common.clock import Clock, utcnow
from services.common.http import health_app, start_http
from services.common.lifecycle import (
    START_BACKOFF,
    open_nats,
    wait_or_stop,
)
from services.common.logs import JobLogger
from services.notifier.channels import Channel, Notice, build_channel
from services.notifier.config import NotifierConfig, Setup, build_setup, load_routes_file
from services.notifier.errors import ChannelError
from services.notifier.metrics import NotifierMetrics
from services.notifier.routing import Router

__all__ = ["Notifier", "Undelivered", "delivered_msg_id", "run"]

log = logging.getLogger("dispatch.notifier")

Jitter = Callable[[], float]

_MISSING_RETRY_S: Final = 0.5  # the escalation isn't in the record read yet (a lagging replica)


def delivered_msg_id(job_id: str, esc_id: str) -> str:
    """The ``Nats-Msg-Id`` of the fact that the escalation was delivered."""
    return f"delivered:{job_id}:{esc_id}"


class Undelivered:
    """Escalations committed and not yet delivered, over every job, read from the records.

    ``refresh`` reads only what was appended since the last one (per-subject counts say
    which jobs changed). It only reports: the shared consumer, not this scan, delivers.
    """

    def __init__(self, store: RecordStore, clock: Clock) -> None:
        """Scan the records of ``store``; ages are measured with ``clock``."""
        self._store = store
        self._clock = clock
        self._read: dict[str, tuple[int, int]] = {}  # job -> (events read, last seq read)
        self._open: dict[tuple[str, str], datetime] = {}  # (job, id) -> committed at
        self._bad: set[str] = set()

    async def refresh(self) -> None:
        """Read every job's new events and update the undelivered set.

        Raises:
            NatsStoreError: the store didn't answer (the next refresh tries again).
        """
        counts = await self._store.job_event_counts()
        for job_id, count in counts.items():
            seen, last = self._read.get(job_id, (0, 0))
            if count == seen:
                continue
            try:
                entries = await self._store.read(job_id, after_seq=last)
            except MalformedRecord as err:  # an event on no writer's subject: this job only
                if job_id not in self._bad:
                    self._bad.add(job_id)
                    log.error(
                        "audit.unreadable",
                        extra={"job_id": job_id, "seq": err.seq, "error": str(err)},
                    )
                continue
            for entry in entries:
                try:
                    event = decode_event(entry.payload)
                except DecodeError as err:
                    if job_id not in self._bad:
                        self._bad.add(job_id)
                        log.error(
                            "audit.undecodable",
                            extra={"job_id": job_id, "seq": entry.seq, "error": str(err)},
                        )
                    continue
                match event:
                    case EscalationCommitted():
                        self._open[(job_id, event.id)] = event.at
                    case EscalationDelivered():
                        self._open.pop((job_id, event.id), None)
                    case _:
                        pass
            if entries:
                self._read[job_id] = (seen + len(entries), entries[-1].seq)

    def delivered(self, job_id: str, esc_id: str) -> None:
        """Forget an escalation the notifier saw delivered (before the next refresh does)."""
        self._open.pop((job_id, esc_id), None)

    def count(self) -> float:
        """How many escalations are undelivered."""
        return float(len(self._open))

    def oldest_age_s(self) -> float:
        """Seconds since the oldest undelivered escalation was committed (0 if none)."""
        if not self._open:
            return 0.0
        return max(0.0, (self._clock() - min(self._open.values())).total_seconds())


class Notifier:
    """Delivers escalations from the shared consumer's messages (see the module docstring)."""

    def __init__(
        self,
        *,
        cfg: NotifierConfig,
        nc: NATS,
        records: RecordRepository,
        layout: Layout,
        channels: Mapping[str, Channel],
        router: Router,
        metrics: NotifierMetrics,
        undelivered: Undelivered,
        jitter: Jitter,
        clock: Clock,
    ) -> None:
        """Wire the notifier; :meth:`consume` runs it.

        Args:
            cfg: the configuration (consumer, retry and link settings).
            nc: the connection the shared consumer uses (the store's).
            records: the records (a repository appending as the notifier).
            layout: the streams' names (the shared consumer's stream).
            channels: every channel a route may name, by name.
            router: which channels each escalation goes to.
            metrics: where to count.
            undelivered: the undelivered-escalations report, told of deliveries.
            jitter: returns a number in ``[0, 1)`` for each backoff (a seeded source in tests).
            clock: the time of delivery facts.
        """
        self._cfg = cfg
        self._nc = nc
        self._records = records
        self._layout = layout
        self._channels = channels
        self._router = router
        self._metrics = metrics
        self._undelivered = undelivered
        self._backoff = Backoff(
            base_s=cfg.retry_base_s, max_s=cfg.retry_max_s, jitter=cfg.retry_jitter
        )
        self._jitter = jitter
        self._clock = clock
        # Channels that accepted an escalation whose delivery isn't recorded yet: a retry
        # sends only to the others. Lost on restart (then they get it again: at least once).
        self._accepted: dict[tuple[str, str], set[str]] = {}

    # ------------------------------------------------------------ loops

    async def consume(self, stop: asyncio.Event, ready: asyncio.Event) -> None:
        """Take record events from the shared consumer until ``stop`` is set.

        A store error (the consumer deleted, the connection lost for good) re-creates the
        consumer after a pause, while deliveries in flight go on; ``ready`` is set once the
        consumer is bound. Once ``stop`` is set, deliveries in flight get
        ``shutdown_grace_s`` to finish; the rest are cancelled (and handed back).
        """
        slots = asyncio.Semaphore(self._cfg.concurrency)
        handlers: set[asyncio.Task[None]] = set()
        graceful = False
        pauses = START_BACKOFF.delays(self._jitter)
        try:
            while not stop.is_set():
                feed = self._store_feed()
                try:
                    await feed.start()
                except NatsStoreError as err:
                    self._metrics.errors.labels("store").inc()
                    log.warning("consumer.start_failed", extra={"error": str(err)})
                    await wait_or_stop(stop, next(pauses))
                    continue
                pauses = START_BACKOFF.delays(self._jitter)
                ready.set()
                log.info(
                    "consumer.started",
                    extra={
                        "durable": self._cfg.durable,
                        "stream": self._layout.record_stream,
                    },
                )
                try:
                    await self._drive(feed, stop, slots, handlers)
                except NatsStoreError as err:
                    self._metrics.errors.labels("store").inc()
                    log.exception("consumer.failed", extra={"error": str(err)})
                    await wait_or_stop(stop, next(pauses))
                finally:
                    await feed.aclose()
            graceful = True
        finally:
            if handlers and graceful:
                await asyncio.wait(set(handlers), timeout=self._cfg.shutdown_grace_s)
            for task in list(handlers):
                task.cancel()
            if handlers:
                await asyncio.gather(*handlers, return_exceptions=True)

    async def audit(self, stop: asyncio.Event) -> None:
        """Refresh the undelivered report now and every ``audit_interval_s`` until ``stop``."""
        first = True
        while not stop.is_set():
            try:
                await self._undelivered.refresh()
            except NatsStoreError as err:
                self._metrics.errors.labels("store").inc()
                log.warning("audit.failed", extra={"error": str(err)})
            else:
                if first:
                    first = False
                    log.info(
                        "notifier.catch_up",
                        extra={
                            "undelivered": int(self._undelivered.count()),
                            "oldest_age_s": round(self._undelivered.oldest_age_s(), 3),
                        },
                    )
            await wait_or_stop(stop, self._cfg.audit_interval_s)

    def _store_feed(self) -> SharedFeed:
        layout = self._layout
        return SharedFeed(
            self._nc,
            stream=layout.record_stream,
            durable=self._cfg.durable,
            filter_subject=layout.record_filter,
            job_of=layout.job_id_from_record_subject,
            api_prefix=layout.api_prefix,
            ack_wait_s=self._cfg.ack_wait_s,
            max_ack_pending=self._cfg.max_ack_pending,
            batch=self._cfg.fetch_batch,
            headers_only=False,  # the payload says whether it is an escalation: no read
            from_start=True,
        )

    async def _drive(
        self,
        feed: SharedFeed,
        stop: asyncio.Event,
        slots: asyncio.Semaphore,
        handlers: set[asyncio.Task[None]],
    ) -> None:
        """Triage each message and start a handler for each escalation (at most ``slots`` at
        once, kept in ``handlers``) until the feed closes, which ``stop`` makes it do."""

        async def close_on_stop() -> None:
            await stop.wait()
            await feed.aclose()

        closer = asyncio.create_task(close_on_stop())
        try:
            async for d in feed:
                event = await self._triage(d)
                if event is None:
                    continue
                await slots.acquire()
                if stop.is_set():
                    slots.release()
                    await self._nak(d, None)
                    continue
                task = asyncio.create_task(self._handle(d, event, slots))
                handlers.add(task)
                task.add_done_callback(handlers.discard)
        finally:
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer

    # ------------------------------------------------------------ one message

    async def _triage(self, d: Delivery) -> EscalationCommitted | HoldPlaced | None:
        """Ack what isn't an escalation (or a hold, with ``held_notices``); return the
        escalation a message committed, or the hold it placed."""
        try:
            event = decode_event(d.payload)
        except DecodeError as err:
            self._metrics.errors.labels("undecodable").inc()
            log.error(
                "record.undecodable", extra={"job_id": d.job_id, "seq": d.seq, "error": str(err)}
            )
            await d.term()
            return None
        if isinstance(event, EscalationCommitted):
            return event
        if isinstance(event, HoldPlaced) and self._cfg.held_notices:
            return event
        await d.ack()
        return None

    async def _handle(
        self, d: Delivery, event: EscalationCommitted | HoldPlaced, slots: asyncio.Semaphore
    ) -> None:
        """Deliver the escalation ``d`` committed; ack when recorded, nak to retry.

        The message loop's boundary: every error is logged, counted, and turned into a nak
        with a delay, so nothing is lost.
        """
        what = event.id if isinstance(event, EscalationCommitted) else f"held:{event.instance}"
        jlog = JobLogger(log, {"job_id": d.job_id, "escalation": what, "seq": d.seq})
        try:
            async with self._keepalive(d):
                if isinstance(event, EscalationCommitted):
                    delay = await self.deliver(
                        d.job_id, event.id, attempt=d.num_delivered, jlog=jlog
                    )
                else:
                    delay = await self.notify_held(
                        d.job_id, event.instance, attempt=d.num_delivered, jlog=jlog
                    )
        except asyncio.CancelledError:
            await self._nak(d, None)  # shutting down: let another replica have it now
            raise
        except MalformedRecord as err:
            # The job's record can't be read (an event that does not decode, one its writer
            # may not write, a history dispatch could not have written): that job's problem
            # only (issue 10). Its escalation is left alone, terminated, never redelivered;
            # the audit keeps reporting it undelivered. Every other job goes on.
            self._metrics.errors.labels("unreadable-record").inc()
            jlog.error(
                "record.unreadable",
                extra={"record_seq": err.seq, "error": str(err)},
            )
            await self._term(d, jlog)
            return
        except DispatchError as err:
            # Another refusal of the core: a bug. Not terminated: a fixed replica delivers
            # it later.
            self._metrics.errors.labels("malformed-record").inc()
            delay = self._backoff.max_s
            jlog.error("record.malformed", extra={"error": str(err), "retry_in_s": delay})
        except NatsStoreError as err:
            self._metrics.errors.labels("store").inc()
            delay = self._backoff.delay(d.num_delivered, self._jitter())
            jlog.warning("escalation.store_error", extra={"error": str(err), "retry_in_s": delay})
        except Exception:
            self._metrics.errors.labels("bug").inc()
            delay = self._backoff.delay(d.num_delivered, self._jitter())
            jlog.exception("escalation.unexpected_error", extra={"retry_in_s": delay})
        finally:
            slots.release()
        if delay is None:
            await self._ack(d, jlog)
        else:
            await self._nak(d, delay)

    async def _term(self, d: Delivery, jlog: JobLogger) -> None:
        try:
            await d.term()
        except NatsStoreError as err:  # handled again after ack_wait: terminated again
            jlog.warning("consumer.term_failed", extra={"error": str(err)})

    async def _nak(self, d: Delivery, delay_s: float | None) -> None:
        try:
            await d.nak(delay_s)
        except NatsStoreError as err:  # it will come back after ack_wait anyway
            log.warning("consumer.nak_failed", extra={"job_id": d.job_id, "error": str(err)})

    async def _ack(self, d: Delivery, jlog: JobLogger) -> None:
        try:
            await d.ack()
        except NatsStoreError as err:  # handled again after ack_wait: already delivered
            jlog.warning("consumer.ack_failed", extra={"error": str(err)})

    @contextlib.asynccontextmanager
    async def _keepalive(self, d: Delivery) -> AsyncIterator[None]:
        """Tell JetStream the message is still being worked on, every third of ack_wait."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(self._cfg.ack_wait_s / 3)
                with contextlib.suppress(NatsStoreError):
                    await d.in_progress()

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------ one escalation

    async def deliver(
        self, job_id: str, esc_id: str, *, attempt: int, jlog: logging.LoggerAdapter[logging.Logger]
    ) -> float | None:
        """Deliver one escalation unless the record shows it delivered; record the delivery.

        Args:
            job_id: the job.
            esc_id: the escalation's id.
            attempt: how many times this escalation's message was handed out (1 the first).
            jlog: a logger bound to the job and escalation.

        Returns:
            None when done (delivered and recorded, or found delivered), else the seconds to
            wait before trying again.

        Raises:
            DispatchError: the record can't be folded.
            NatsStoreError: reading failed, or delivered but the delivery couldn't be
                recorded (``TooManyConflicts``, an outcome left unknown).
        """
        job = await self._load(job_id)
        esc = None if job is None else job.escalation(esc_id)
        key = (job_id, esc_id)
        if job is None or esc is None:
            jlog.warning("escalation.not_in_record", extra={"record_seq": job and job.seq})
            return _MISSING_RETRY_S
        if esc.delivered is not None:
            self._done(key)
            jlog.info("escalation.already_delivered", extra={"delivered": esc.delivered})
            return None
        names = self._router.channels_for(esc.id)
        notice = self._notice(job_id, esc)
        accepted = self._accepted.setdefault(key, set())
        pending = [n for n in names if n not in accepted]
        results = await asyncio.gather(*(self._attempt(n, notice, jlog) for n in pending))
        failures: list[ChannelError] = []
        for name, failure in zip(pending, results, strict=True):
            if failure is None:
                accepted.add(name)
            else:
                failures.append(failure)
        if failures:
            delay = self._backoff.delay(attempt, self._jitter())
            asked = max((f.retry_after_s or 0.0 for f in failures), default=0.0)
            delay = min(max(delay, asked), self._backoff.max_s)
            self._metrics.retries.inc()
            jlog.warning(
                "escalation.retry",
                extra={
                    "attempt": attempt,
                    "retry_in_s": round(delay, 3),
                    "failing": [f.channel for f in failures],
                    "accepted": sorted(accepted),
                },
            )
            return delay
        by = await self._record(job, esc.id, ",".join(names), jlog)
        self._done(key)
        jlog.info("escalation.delivered", extra={"channels": list(names), "recorded_by": by})
        return None

    async def notify_held(
        self,
        job_id: str,
        instance: int,
        *,
        attempt: int,
        jlog: logging.LoggerAdapter[logging.Logger],
    ) -> float | None:
        """Tell the channels routed for ``held:<instance>`` that the job waits for a person,
        if hold ``instance`` is still in force (see the module docstring).

        Returns:
            None when done (every channel accepted it, or the hold no longer stands), else
            the seconds to wait before trying again.

        Raises:
            DispatchError: the record can't be folded.
            NatsStoreError: reading failed.
        """
        job = await self._load(job_id)
        if job is None:
            jlog.warning("held.not_in_record")
            return _MISSING_RETRY_S
        hold = job.hold
        notice_id = f"held:{instance}"
        key = (job_id, notice_id)
        if hold is None or hold.instance != instance or job.outcome is not None:
            self._accepted.pop(key, None)
            jlog.info("held.not_in_force", extra={"record_seq": job.seq})
            return None
        names = self._router.channels_for(notice_id)
        link, page = self._links(job_id)
        notice = Notice(
            job_id=job_id,
            id=notice_id,
            detail=_held_detail(job_id, hold, self._cfg.answer_command),
            at=hold.placed_at,
            severity=self._router.severity_of(notice_id),
            link=link,
            kind="notice",
            page=page,
        )
        accepted = self._accepted.setdefault(key, set())
        pending = [n for n in names if n not in accepted]
        results = await asyncio.gather(*(self._attempt(n, notice, jlog) for n in pending))
        failures = [f for f in results if f is not None]
        accepted.update(n for n, f in zip(pending, results, strict=True) if f is None)
        if failures:
            delay = self._backoff.delay(attempt, self._jitter())
            asked = max((f.retry_after_s or 0.0 for f in failures), default=0.0)
            self._metrics.retries.inc()
            jlog.warning(
                "held.retry",
                extra={"attempt": attempt, "failing": [f.channel for f in failures]},
            )
            return min(max(delay, asked), self._backoff.max_s)
        self._accepted.pop(key, None)
        jlog.info("held.notified", extra={"channels": list(names)})
        return None

    def _done(self, key: tuple[str, str]) -> None:
        self._accepted.pop(key, None)
        self._undelivered.delivered(*key)

    def _links(self, job_id: str) -> tuple[str | None, str | None]:
        """The job's JSON API URL and its web page (``<api>/#/job/<job>``), if configured."""
        if not self._cfg.api_url:
            return None, None
        api = self._cfg.api_url.rstrip("/")
        return f"{api}/v1/jobs/{job_id}", f"{api}/#/job/{job_id}"

    def _notice(self, job_id: str, esc: Escalation) -> Notice:
        link, page = self._links(job_id)
        return Notice(
            job_id=job_id,
            id=esc.id,
            detail=esc.detail,
            at=esc.at,
            severity=self._router.severity_of(esc.id),
            link=link,
            page=page,
        )

    async def _attempt(
        self, name: str, notice: Notice, jlog: logging.LoggerAdapter[logging.Logger]
    ) -> ChannelError | None:
        """Send ``notice`` on one channel; return the error, or None if it was accepted."""
        channel = self._channels[name]
        started = time.monotonic()
        try:
            await channel.send(notice)
        except ChannelError as err:
            failure = err
        except Exception as err:  # a plugged-in channel's bug must not stop the others
            jlog.exception("channel.unexpected_error", extra={"channel": name})
            failure = ChannelError(name, f"unexpected error: {err!r}")
        else:
            self._metrics.channel_result(name, "accepted", time.monotonic() - started)
            jlog.debug("channel.accepted", extra={"channel": name})
            return None
        self._metrics.channel_result(name, failure.outcome, time.monotonic() - started)
        level = logging.ERROR if failure.outcome == "rejected" else logging.WARNING
        jlog.log(
            level,
            "channel.failed",
            extra={"channel": name, "outcome": failure.outcome, "error": failure.reason},
        )
        return failure

    async def _record(
        self, job: Job, esc_id: str, channel: str, jlog: logging.LoggerAdapter[logging.Logger]
    ) -> str:
        """Append ``EscalationDelivered``; return who recorded it (``self`` or ``other``).

        Raises:
            NatsStoreError: every try lost a race (``TooManyConflicts``), or the append's
                outcome stayed unknown.
        """
        fact = escalation_delivered(job.job_id, esc_id, self._clock(), channel=channel)
        # The notifier's own msg id, not the fact's key (the supervisor's): a record store
        # refuses a msg id another writer kind stored (`MsgIdReused`), where a lost race
        # re-loads and finds the delivery redundant (`delivered_msg_id`).
        done = await self._records.append_fact(
            job, delivered_msg_id(job.job_id, esc_id), fact.event, redundant=is_redundant
        )
        if done.seq is None:
            self._metrics.recorded.labels("other").inc()
            return "other"
        self._metrics.recorded.labels("self").inc()
        jlog.debug("escalation.recorded", extra={"record_seq": done.seq})
        return "self"

    async def _load(self, job_id: str) -> Job | None:
        """The job's record, folded (None: no record read yet, e.g. a lagging replica).

        Raises:
            MalformedRecord: an event can't be read (naming the job and seq).
            NatsStoreError: the read failed.
        """
        loaded = await self._records.load(job_id)
        return None if loaded is None else loaded.job


_REASON: Final = '--reason "..."'
"""Every printed answer carries it: the CLI requires a reason, so the line can be copied."""


def _held_detail(job_id: str, hold: Hold, command: str = "dispatch") -> str:
    """What the on-call reads of a hold: whose, why, until when, and how to answer it (with
    ``command``, the CLI as the reader runs it)."""
    c = command
    if hold.kind is HoldKind.RECOVERY:
        ended = ""
        if hold.cause is not None:
            words = f" ({hold.cause.detail})" if hold.cause.detail else ""
            ended = f" after an execution ended {hold.cause.kind}{words}"
        what = f"held by a recovery rule{ended}: {hold.reason}"
        answer = (
            f"{c} resubmit {job_id} {_REASON}, {c} cancel {job_id} {_REASON} or "
            f"{c} give-up {job_id} {_REASON} (release can't lift a recovery hold)"
        )
    else:
        what = f"held by {hold.by.name}: {hold.reason}"
        answer = f"{c} release {job_id} {_REASON} (or {c} cancel {job_id} {_REASON})"
    return (
        f"job {job_id} is {what}; it waits for a person (overdue at "
        f"{hold.deadline.isoformat()}). Answer: {answer}"
    )


async def run(
    cfg: NotifierConfig,
    stop: asyncio.Event,
    *,
    registry: CollectorRegistry | None = None,
    jitter: Jitter | None = None,
    clock: Clock = utcnow,
    plugins: Mapping[str, Channel] | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Run the notifier until ``stop`` is set.

    Args:
        cfg: the configuration.
        stop: set it to shut down (in-flight deliveries get ``shutdown_grace_s``).
        registry: the Prometheus registry (a fresh one by default).
        jitter: the backoff's randomness, numbers in ``[0, 1)`` (a private
            ``random.Random`` by default).
        clock: the time of delivery facts and ages.
        plugins: more channels by name (any :class:`Channel`); routes may name them.
        ready: set once NATS, the streams and the consumer are up (``/healthz`` says 200).

    Raises:
        ConfigError: the routes file or the routes are invalid.
        StreamConfigConflict: the streams contradict the contract.
    """
    registry = registry if registry is not None else CollectorRegistry()
    jitter = jitter if jitter is not None else random.Random().random
    ready = ready if ready is not None else asyncio.Event()
    plugins = dict(plugins or {})
    routes_file = None
    if cfg.routes_file:
        routes_file = await asyncio.to_thread(load_routes_file, Path(cfg.routes_file))
    setup = build_setup(cfg, routes_file, plugins=plugins.keys())
    layout = Layout(namespace=cfg.namespace)
    async with contextlib.AsyncExitStack() as stack:
        runner, port = await start_http(
            health_app(registry, ready, service="notifier"), cfg.http_host, cfg.http_port
        )
        stack.push_async_callback(runner.cleanup)
        log.info("http.listening", extra={"host": cfg.http_host, "port": port})
        nc = await open_nats(
            stack, cfg, stop, name="dispatch-notifier", replicas=cfg.stream_replicas, layout=layout
        )
        if nc is None:
            return
        store = RecordStore(nc, writer=WriterKind.NOTIFIER, layout=layout)
        stack.push_async_callback(store.aclose)
        records = RecordRepository(store, writer=WriterKind.NOTIFIER, clock=clock)
        session = aiohttp.ClientSession()
        stack.push_async_callback(session.close)
        channels = _channels(setup, session, plugins)
        undelivered = Undelivered(store, clock)
        metrics = NotifierMetrics(
            registry, undelivered=undelivered.count, oldest_age_s=undelivered.oldest_age_s
        )
        notifier = Notifier(
            cfg=cfg,
            nc=nc,
            records=records,
            layout=layout,
            channels=channels,
            router=setup.router,
            metrics=metrics,
            undelivered=undelivered,
            jitter=jitter,
            clock=clock,
        )
        log.info(
            "notifier.started",
            extra={
                "channels": sorted(channels),
                "default": list(setup.router.default),
                "routes": [r.describe() for r in setup.router.routes],
            },
        )
        async with asyncio.TaskGroup() as tg:
            tg.create_task(notifier.consume(stop, ready))
            tg.create_task(notifier.audit(stop))
        log.info("notifier.stopped")


def _channels(
    setup: Setup, session: aiohttp.ClientSession, plugins: Mapping[str, Channel]
) -> dict[str, Channel]:
    channels: dict[str, Channel] = {
        name: build_channel(name, spec, session) for name, spec in setup.channels.items()
    }
    channels.update(plugins)
    return channels

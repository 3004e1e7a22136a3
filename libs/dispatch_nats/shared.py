"""A durable pull consumer shared by every replica of a service: each message to one replica.

The supervisor's replicas share the work of waking jobs this way (docs/runtime.md): one
durable consumer on the record stream and one on the discovery stream, each message handed
to one replica, acked when its pass is done, redelivered (to any replica) if not acked
within `ack_wait_s`.

    async with store.shared("supervisor") as work:
        async for d in work:
            await run_pass(d.job_id)
            await d.ack()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final, Self

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext

from dispatch_core.backoff import Backoff
from dispatch_nats._feed import StartedFeed, unsubscribe_quietly
from dispatch_nats._wire import Wire
from dispatch_nats.contract import _validate_token
from dispatch_nats.errors import (
    InvalidName,
    JetStreamApiError,
    NatsStoreError,
    StoreUnavailable,
    StreamNotFound,
)

__all__ = ["Delivery", "SharedFeed"]

_ERR_STREAM_NOT_FOUND: Final = 10059
_RECOVER_BACKOFF: Final = Backoff(base_s=0.2, max_s=2.0)
"""Pauses before re-creating the consumer after failed fetches (a leader election lasts
about 5 s on a 3-server cluster)."""

log = logging.getLogger("dispatch_nats.shared")


class Delivery:
    """One message handed to this replica; `ack` it once handled."""

    __slots__ = (
        "_msg",
        "headers",
        "job_id",
        "num_delivered",
        "payload",
        "seq",
        "subject",
        "time",
    )

    def __init__(self, msg: Msg, job_id: str) -> None:
        """Wrap a consumer delivery (built by `SharedFeed`)."""
        meta = msg.metadata
        self._msg = msg
        self.subject: str = msg.subject
        """The message's subject."""
        self.job_id: str = job_id
        """The job it concerns (the subject's last token)."""
        self.seq: int = meta.sequence.stream
        """Its stream seq."""
        self.time: datetime = meta.timestamp
        """When JetStream stored it (UTC)."""
        self.num_delivered: int = meta.num_delivered
        """How many times it has been delivered, this time included."""
        self.payload: bytes = msg.data
        """Its payload (empty for a headers-only consumer)."""
        self.headers: dict[str, str] = dict(msg.headers or {})
        """Its headers."""

    async def ack(self) -> None:
        """Done: never deliver it again.

        Raises:
            StoreUnavailable: the connection is closed.
        """
        await self._reply("ack", self._msg.ack)

    async def nak(self, delay_s: float | None = None) -> None:
        """Not done: deliver it again (to any replica), after `delay_s` seconds if given.

        Raises:
            StoreUnavailable: the connection is closed.
        """
        try:
            await self._msg.nak(delay=delay_s)
        except NatsError as err:
            raise StoreUnavailable(f"nak {self.subject!r} seq {self.seq}", repr(err)) from err

    async def in_progress(self) -> None:
        """Still working on it: restart its ack wait.

        Raises:
            StoreUnavailable: the connection is closed.
        """
        await self._reply("in_progress", self._msg.in_progress)

    async def term(self) -> None:
        """It can never be handled (poison): never deliver it again, and don't ack it.

        Raises:
            StoreUnavailable: the connection is closed.
        """
        await self._reply("term", self._msg.term)

    async def _reply(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            await fn()
        except NatsError as err:
            raise StoreUnavailable(f"{what} {self.subject!r} seq {self.seq}", repr(err)) from err

    def __repr__(self) -> str:
        return f"Delivery(subject={self.subject!r}, seq={self.seq}, n={self.num_delivered})"


class SharedFeed(StartedFeed):
    """Deliveries from one durable pull consumer, shared with every other holder of its name."""

    def __init__(
        self,
        nc: NATS,
        *,
        stream: str,
        durable: str,
        filter_subject: str | Sequence[str],
        job_of: Callable[[str], str],
        api_prefix: str = "$JS.API",
        ack_wait_s: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int = 1000,
        batch: int = 64,
        headers_only: bool = True,
        from_start: bool = True,
        poll_s: float = 1.0,
        timeout_s: float = 5.0,
    ) -> None:
        """Prepare the feed; `start()` (or `async with`) creates or updates the consumer.

        Args:
            nc: a connected client.
            stream: the stream to consume.
            durable: the consumer's name, the same in every replica (a subject-safe token).
            filter_subject: the subjects to consume, or several filters (a consumer with
                `filter_subjects`, nats-server 2.10+): e.g. the record appends of every
                writer kind but one.
            job_of: maps a subject to its job id.
            api_prefix: JetStream API prefix.
            ack_wait_s: redeliver a message not acked within this many seconds.
            max_deliver: most deliveries of one message (-1: unlimited).
            max_ack_pending: most messages delivered and not yet acked, over all replicas.
            batch: most messages fetched by this replica at once.
            headers_only: deliver headers without payloads (enough to wake a job).
            from_start: a consumer created now starts at the stream's first message (else
                at the next one stored); an existing consumer keeps its position.
            poll_s: how long one fetch waits for messages, in seconds.
            timeout_s: timeout of consumer creation, in seconds.

        Raises:
            InvalidName: `durable` is not a subject-safe token.
        """
        self._nc = nc
        self._stream = stream
        self._durable = _validate_token("consumer name", durable)
        filters = [filter_subject] if isinstance(filter_subject, str) else list(filter_subject)
        self._filter = " ".join(filters)
        self._job_of = job_of
        self._api_prefix = api_prefix
        self._config: dict[str, Any] = {
            "durable_name": durable,
            **(
                {"filter_subject": filters[0]}
                if len(filters) == 1
                else {"filter_subjects": filters}
            ),
            "ack_policy": "explicit",
            "ack_wait": int(ack_wait_s * 1e9),
            "max_deliver": max_deliver,
            "max_ack_pending": max_ack_pending,
            "deliver_policy": "all" if from_start else "new",
            "headers_only": headers_only,
        }
        self._batch = batch
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._js: JetStreamContext = nc.jetstream(prefix=api_prefix, timeout=timeout_s)
        self._sub: JetStreamContext.PullSubscription | None = None
        self._buffer: list[Msg] = []
        self._closed = False
        self._failures = 0

    async def start(self) -> None:
        """Create the durable consumer (or update it to this config) and bind to it.

        A new consumer starts at the beginning of the stream; an existing one keeps its
        position, so a restarted replica continues where the group left off.

        Raises:
            StreamNotFound: the stream does not exist.
            StoreUnavailable: JetStream did not answer, or the connection is down.
            JetStreamApiError: JetStream refused the consumer's configuration.
        """
        await self._create()

    async def _create(self) -> None:
        wire = Wire(self._nc)
        subject = f"{self._api_prefix}.CONSUMER.CREATE.{self._stream}.{self._durable}"
        try:
            await wire.api(
                f"create consumer {self._durable!r}",
                subject,
                {"stream_name": self._stream, "config": self._config},
                timeout_s=self._timeout_s,
                stream=self._stream,
            )
        except JetStreamApiError as err:
            if err.err_code == _ERR_STREAM_NOT_FOUND:
                raise StreamNotFound(self._stream, self._filter) from err
            raise
        finally:
            await wire.close()
        old, self._sub = self._sub, None
        await unsubscribe_quietly(self._nc, old, ValueError)
        try:
            self._sub = await self._js.pull_subscribe_bind(
                durable=self._durable, stream=self._stream
            )
        except NatsError as err:
            raise StoreUnavailable(f"bind consumer {self._durable!r}", repr(err)) from err

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Delivery:
        """Wait for the next message for this replica.

        Raises:
            StopAsyncIteration: the feed was closed.
            StoreUnavailable: the connection closed.
            JetStreamApiError: the consumer could not be re-created after a failed fetch,
                and trying again would not help (its configuration is refused).
        """
        while not self._buffer:
            sub = self._sub
            if self._closed or sub is None:
                if self._closed:
                    raise StopAsyncIteration
                raise NatsStoreError("the feed was not started: use `async with` or `start()`")
            try:
                self._buffer = await sub.fetch(self._batch, timeout=self._poll_s)
                self._failures = 0
            except (NatsTimeoutError, TimeoutError):
                # A fetch that found nothing. nats-py 2.16 raises its own TimeoutError from
                # some paths and the builtin one from others (nats/js/client.py, fetch). But
                # on Python 3.11 asyncio.wait_for can also turn a cancellation of this task
                # into a TimeoutError (fixed in 3.12): honour the cancellation, or the feed
                # would loop forever and never shut down.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from None
                if self._closed:
                    raise StopAsyncIteration from None
                self._failures = 0
                continue
            except ConnectionClosedError as err:
                if self._closed:
                    raise StopAsyncIteration from None
                raise StoreUnavailable(f"consumer {self._durable!r}", "connection closed") from err
            except NatsError as err:
                # A consumer or stream with no leader (503, no responders), a leader change,
                # a reconnect, or the consumer gone: none of these is the end of the work.
                # Fetch again after a pause, re-creating the consumer first (it is the same
                # durable with the same config, so its position is kept if it still exists).
                if self._nc.is_closed:
                    raise StoreUnavailable(
                        f"consumer {self._durable!r}", "connection closed"
                    ) from err
                await self._recover(err)
        msg = self._buffer.pop(0)
        try:
            job_id = self._job_of(msg.subject)
        except InvalidName as err:
            # Not a subject dispatch writes (a raw publish into the stream's wildcard):
            # nobody can handle it, and it must not stop the feed for every other job.
            log.error(
                "shared.unhandleable_subject",
                extra={"durable": self._durable, "subject": msg.subject, "error": str(err)},
            )
            with contextlib.suppress(NatsError):
                await msg.term()
            return await self.__anext__()
        return Delivery(msg, job_id)

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called."""
        return self._closed

    async def _recover(self, err: Exception) -> None:
        """After a failed fetch: pause, then re-create the consumer and bind to it again,
        until that works or the feed is closed.

        Raises:
            NatsStoreError: re-creating the consumer failed for good (not retryable).
        """
        self._failures += 1
        delays = _RECOVER_BACKOFF.delays(random.random)
        delay = _RECOVER_BACKOFF.delay(self._failures, random.random())
        log.warning(
            "shared.fetch_failed",
            extra={"durable": self._durable, "error": repr(err), "retry_in_s": round(delay, 3)},
        )
        while True:
            await asyncio.sleep(delay)
            if self.closed:
                return
            try:
                await self._create()
            except NatsStoreError as again:
                if not again.retryable:
                    raise
                delay = next(delays)
                log.warning(
                    "shared.recreate_failed",
                    extra={"durable": self._durable, "error": str(again), "retry_in_s": delay},
                )
                continue
            return

    async def aclose(self) -> None:
        """Stop fetching (the durable consumer stays for the other replicas). Idempotent.

        Messages fetched but not yet returned are not acked: they are redelivered after
        `ack_wait_s`.
        """
        self._closed = True
        sub, self._sub = self._sub, None
        self._buffer = []
        await unsubscribe_quietly(self._nc, sub, ValueError)

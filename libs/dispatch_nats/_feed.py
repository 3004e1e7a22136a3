"""An ordered JetStream consumer as an async iterator of messages (internal).

nats-py's ordered consumer (an ephemeral, in-memory, flow-controlled push consumer that
re-creates itself from the last stream seq it saw on any gap or on missed idle heartbeats)
follows a stream in order across reconnects and server restarts. `OrderedFeed` wraps it
with dispatch's errors, a bounded-wait loop that notices a closed connection, and a clean
`aclose`. `MessageFeed` is the base of the public feeds: an `OrderedFeed` whose messages
are turned into the feed's own items.

Every consumer an `OrderedFeed` creates, the first and each one a reset re-creates, is
*named*, with a fresh random name (:func:`fresh_consumer_name`), and so created on the named
subject ``<api>.CONSUMER.CREATE.<stream>.<name>.<filter>``, never on the legacy ephemeral
subject ``<api>.CONSUMER.CREATE.<stream>`` that nats-py uses for an unnamed one. The legacy
subject carries no name, so NATS permissions can't tell a request that creates a new
consumer from one that names an existing consumer in its body and so updates it (another
service's durable included): dispatch's generated permissions refuse it to every identity
(dispatch_nats.permissions). A reset takes a fresh name because the consumer it replaces
may still exist (a sequence gap while the old one still pushes): re-creating that name with
another start seq or deliver subject would be an update, which the server refuses. nats-py
keeps its own gap detection, heartbeat monitoring and flow control; only the name of the
re-created consumer is ours (`_FreshlyNamedReset`). The old consumer, no longer listened
to, is removed by the server after its inactive threshold (5 s for an ephemeral): no
identity is granted consumer delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from dispatch_nats.errors import NatsStoreError, StoreUnavailable, StreamNotFound, api_error

_POLL_S = 1.0  # how often a waiting iterator checks for a closed connection, seconds

ORDERED_CONSUMER_PREFIX = "ordered-"
"""The prefix of every name `OrderedFeed` gives a consumer (never a durable's name)."""


def fresh_consumer_name() -> str:
    """A new name for an ordered consumer: ``ordered-`` and 96 random bits in hex.

    The name is known to its creator only (its messages go to the creator's own inbox, and
    no identity may list consumers), so no other identity can name it in a request.
    """
    return f"{ORDERED_CONSUMER_PREFIX}{secrets.token_hex(12)}"


class _FreshlyNamedReset(JetStreamContext._JSI):
    """nats-py's ordered-consumer state, whose reset re-creates the consumer under a fresh
    name (module docstring). nats-py's `reset_ordered_consumer` has already pointed the
    config at a new deliver subject and the next stream seq; only the name changes here."""

    async def recreate_consumer(self) -> None:
        self._ccreq.name = fresh_consumer_name()
        await super().recreate_consumer()


T = TypeVar("T")


class _Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


async def unsubscribe_quietly(nc: NATS, sub: _Subscription | None, *also: type[Exception]) -> None:
    """Delete `sub`, if any, while `nc` is open: a closed connection has already dropped it,
    and a NATS error (or one of `also`) from a subscription already gone is ignored."""
    if sub is not None and not nc.is_closed:
        with contextlib.suppress(NatsError, *also):
            await sub.unsubscribe()


class StartedFeed:
    """A feed used as an async context manager: entering it calls `start`, leaving it
    `aclose`, both defined by subclasses."""

    async def start(self) -> None:
        """Begin following (create or bind the consumer)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Stop following. Safe to call twice."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class OrderedFeed(StartedFeed):
    """Messages of `stream` matching `filter_subject`, in stream order, until closed."""

    def __init__(
        self,
        nc: NATS,
        *,
        stream: str,
        filter_subject: str,
        deliver_policy: DeliverPolicy,
        start_seq: int | None = None,
        headers_only: bool = False,
        heartbeat_s: float = 2.0,
        api_prefix: str = "$JS.API",
        timeout_s: float = 5.0,
    ) -> None:
        """Prepare the feed; `start()` (or `async with`) creates the consumer.

        Args:
            nc: a connected client.
            stream: the stream to follow.
            filter_subject: the subjects to follow (wildcards allowed).
            deliver_policy: where to start: NEW, ALL, LAST_PER_SUBJECT or BY_START_SEQUENCE.
            start_seq: the first stream seq, with BY_START_SEQUENCE.
            headers_only: deliver headers without payloads.
            heartbeat_s: the consumer's idle heartbeat, in seconds; two missed ones make the
                client re-create the consumer (after a server restart, for instance).
            api_prefix: JetStream API prefix.
            timeout_s: timeout of the consumer-creation request, in seconds.
        """
        self._nc = nc
        self._stream = stream
        self._filter = filter_subject
        self._config = ConsumerConfig(
            deliver_policy=deliver_policy,
            opt_start_seq=start_seq,
            headers_only=headers_only or None,
        )
        self._heartbeat_s = heartbeat_s
        self._js: JetStreamContext = nc.jetstream(prefix=api_prefix, timeout=timeout_s)
        self._sub: JetStreamContext.PushSubscription | None = None
        self._closed = False

    async def start(self) -> None:
        """Create the ordered consumer.

        Raises:
            StreamNotFound: the stream does not exist.
            StoreUnavailable: JetStream did not answer, or the connection is down.
            JetStreamApiError: JetStream refused the consumer.
        """
        # a copy: nats-py fills in (and on a reset changes) the config it is given
        config = dataclasses.replace(self._config, name=fresh_consumer_name())
        try:
            sub = await self._js.subscribe(
                self._filter,
                stream=self._stream,
                ordered_consumer=True,
                idle_heartbeat=self._heartbeat_s,
                config=config,
            )
        except NotFoundError as err:
            raise StreamNotFound(self._stream, self._filter) from err
        except APIError as err:
            raise api_error(
                f"follow {self._filter!r}",
                int(err.code or 0),
                int(err.err_code or 0),
                str(err.description or ""),
            ) from err
        except NatsError as err:
            raise StoreUnavailable(f"follow {self._filter!r}", repr(err)) from err
        jsi = sub._sub._jsi
        if type(jsi) is not JetStreamContext._JSI:  # pragma: no cover - a nats-py change
            await sub.unsubscribe()
            raise NatsStoreError(f"nats-py's ordered consumer changed: {type(jsi)!r}")
        jsi.__class__ = _FreshlyNamedReset
        self._sub = sub

    async def next_msg(self) -> Msg:
        """Wait for the next message.

        Raises:
            StopAsyncIteration: the feed was closed.
            StoreUnavailable: the connection closed.
        """
        sub = self._sub
        if sub is None:
            if self._closed:
                raise StopAsyncIteration
            raise NatsStoreError("the feed was not started: use `async with` or `await start()`")
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                return await sub.next_msg(timeout=_POLL_S)
            except NatsTimeoutError:
                continue
            except ConnectionClosedError as err:
                if self._closed:
                    raise StopAsyncIteration from None
                raise StoreUnavailable(
                    f"follow {self._filter!r}", "the NATS connection closed"
                ) from err
            except asyncio.CancelledError:
                # `aclose` from another task cancels the waiting call; only that ends the
                # iteration, a cancellation of this task itself propagates.
                task = asyncio.current_task()
                if self.closed and task is not None and task.cancelling() == 0:
                    raise StopAsyncIteration from None
                raise

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called."""
        return self._closed

    async def aclose(self) -> None:
        """Stop following and delete the subscription. Safe to call twice."""
        self._closed = True
        sub, self._sub = self._sub, None
        await unsubscribe_quietly(self._nc, sub)


class MessageFeed(StartedFeed, Generic[T]):
    """An `OrderedFeed` as an async iterator (and async context manager) of `T`: each
    message is turned into an item by `item`, which subclasses define."""

    def __init__(self, feed: OrderedFeed) -> None:
        """Wrap an ordered feed (not yet started; entering the context starts it)."""
        self._feed = feed

    def item(self, msg: Msg) -> T:
        """The item of one message."""
        raise NotImplementedError

    async def start(self) -> None:
        """Start the ordered feed (as entering the context does)."""
        await self._feed.start()

    async def aclose(self) -> None:
        """Stop the feed. Safe to call twice."""
        await self._feed.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        """Wait for the next item.

        Raises:
            StopAsyncIteration: the feed was closed.
            StoreUnavailable: the connection closed.
        """
        return self.item(await self._feed.next_msg())

"""Latest value per subject, for the `DISPATCH_DISCOVERY` and `DISPATCH_STATUS` streams.

Both streams keep one message per subject, so each subject holds the current value of one
key: `(cluster, job)` for a Discovery, `(job,)` for a Status. Keys are tuples of tokens;
patterns are keys where a token may be `*` (any), and a short pattern is padded with `*`.

Writers `put`; readers `get` one key, `get_all` keys matching a pattern (one multi_last
direct get), or `watch` a pattern (the current values, then every change).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Final, Self

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from dispatch_nats._feed import MessageFeed, OrderedFeed
from dispatch_nats._wire import (
    EXPECTED_LAST_SUBJECT_SEQ,
    PUB_ACK_DECODER,
    NoResponders,
    ReplyTimeout,
    Wire,
    header_int,
    parse_nats_time,
)
from dispatch_nats.contract import DEFAULT_LAYOUT, Layout, StreamKind, _validate_token
from dispatch_nats.errors import (
    ConcurrencyConflict,
    InvalidName,
    JetStreamApiError,
    StoreUnavailable,
    StreamNotFound,
    api_error,
)
from dispatch_nats.shared import SharedFeed

__all__ = ["LatestEntry", "LatestFeed", "LatestStore"]

_ERR_WRONG_LAST_SEQ: Final = 10071
_WRONG_LAST_SEQ: Final = re.compile(r"wrong last sequence: (\d+)")
_KEY_NAMES: Final = {
    StreamKind.DISCOVERY: ("cluster name", "job id"),
    StreamKind.STATUS: ("job id",),
}


class LatestEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The current value of one key."""

    key: tuple[str, ...]
    """`(cluster, job)` for a Discovery, `(job,)` for a Status."""
    seq: int
    """The stream seq of this value (increases with every put to the stream)."""
    payload: bytes
    """The encoded value."""
    time: datetime
    """When JetStream stored it (UTC)."""
    headers: dict[str, str] = {}
    """The headers it was put with (without JetStream's own `Nats-*` headers)."""


class LatestFeed(MessageFeed[LatestEntry]):
    """Values of the keys matching a pattern as they change: an async iterator of `LatestEntry`.

    async with statuses.watch(("job-1",)) as changes:
        async for entry in changes:
            show(entry)
    """

    def __init__(self, feed: OrderedFeed, store: LatestStore) -> None:
        """Wrap an ordered feed (use `LatestStore.watch`)."""
        super().__init__(feed)
        self._store = store

    def item(self, msg: Msg) -> LatestEntry:
        """The value a message holds."""
        meta = msg.metadata
        return LatestEntry(
            key=self._store.key_of(msg.subject),
            seq=meta.sequence.stream,
            payload=msg.data,
            time=meta.timestamp,
            headers=_user_headers(msg),
        )


class LatestStore:
    """Latest value per key on a one-message-per-subject stream (discovery or status)."""

    def __init__(
        self,
        nc: NATS,
        kind: StreamKind,
        *,
        layout: Layout = DEFAULT_LAYOUT,
        ack_timeout_s: float = 2.0,
        read_timeout_s: float = 2.0,
        max_in_flight: int = 1024,
        watch_heartbeat_s: float = 2.0,
        read_from_leader: bool = False,
    ) -> None:
        """Use `nc` and the `kind` stream of `layout` (created beforehand by `ensure_streams`).

        Args:
            nc: a connected NATS client.
            kind: `StreamKind.DISCOVERY` or `StreamKind.STATUS`.
            layout: stream and subject names; the public contract's by default.
            ack_timeout_s: how long a put waits for JetStream's ack, in seconds.
            read_timeout_s: how long a read waits for each reply, in seconds.
            max_in_flight: most requests waiting for replies at once.
            watch_heartbeat_s: idle heartbeat of `watch`'s consumer, in seconds.
            read_from_leader: `get` asks the stream's leader (`STREAM.MSG.GET`) rather than
                any replica (a direct get, which a replica still catching up may answer
                with an older value); for a reader that acts on the value, such as a
                supervisor pass woken by it.

        Raises:
            ValueError: `kind` is the record stream.
        """
        self._prefix = layout.latest_prefix(kind)  # raises for RECORD
        self._kind = kind
        self._layout = layout
        self._stream = layout.stream(kind)
        self._key_names = _KEY_NAMES[kind]
        self._wire = Wire(nc, max_in_flight=max_in_flight)
        self._ack_timeout_s = ack_timeout_s
        self._read_timeout_s = read_timeout_s
        self._watch_heartbeat_s = watch_heartbeat_s
        self._read_from_leader = read_from_leader

    @classmethod
    def discovery(cls, nc: NATS, *, layout: Layout = DEFAULT_LAYOUT) -> Self:
        """The latest Discovery per `(cluster, job)`."""
        return cls(nc, StreamKind.DISCOVERY, layout=layout)

    @classmethod
    def status(cls, nc: NATS, *, layout: Layout = DEFAULT_LAYOUT) -> Self:
        """The latest Status per `(job,)`."""
        return cls(nc, StreamKind.STATUS, layout=layout)

    @property
    def kind(self) -> StreamKind:
        """Which stream this store holds."""
        return self._kind

    async def aclose(self) -> None:
        """Release the store's reply subscription (the connection stays open)."""
        await self._wire.close()

    def subject(self, key: tuple[str, ...]) -> str:
        """Return the subject of `key`, e.g. `dispatch.status.job-1` for `("job-1",)`.

        Raises:
            InvalidName: wrong number of tokens, or a token that is not subject-safe.
        """
        if len(key) != len(self._key_names):
            raise InvalidName(
                f"{self._kind.value} key",
                repr(key),
                f"must be a tuple ({', '.join(self._key_names)})",
            )
        for name, token in zip(self._key_names, key, strict=True):
            _validate_token(name, token)
        return ".".join((self._prefix, *key))

    def pattern(self, pattern: tuple[str, ...] = ()) -> str:
        """Return the subject filter of `pattern`: tokens or `*`, padded with `*`.

        Raises:
            InvalidName: too many tokens, or a token that is neither `*` nor subject-safe.
        """
        if len(pattern) > len(self._key_names):
            raise InvalidName(
                f"{self._kind.value} pattern",
                repr(pattern),
                f"must be a tuple of at most ({', '.join(self._key_names)})",
            )
        tokens = [*pattern, *("*" * (len(self._key_names) - len(pattern)))]
        for name, token in zip(self._key_names, tokens, strict=True):
            if token != "*":
                _validate_token(name, token)
        return ".".join((self._prefix, *tokens))

    def key_of(self, subject: str) -> tuple[str, ...]:
        """Return the key of one of this store's subjects.

        Raises:
            InvalidName: `subject` is not one of this store's subjects.
        """
        head = self._prefix + "."
        tokens = tuple(subject[len(head) :].split(".")) if subject.startswith(head) else ()
        if len(tokens) != len(self._key_names):
            raise InvalidName(f"{self._kind.value} subject", subject, f"must be {head}<key>")
        for name, token in zip(self._key_names, tokens, strict=True):
            _validate_token(name, token)
        return tokens

    async def put(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Make `payload` the current value of `key`; return its stream seq.

        Not retried here: on a timeout the value may or may not be stored, and re-sending
        an old value could overwrite a newer one; the caller `get`s and decides.

        Args:
            key: `(cluster, job)` for a Discovery, `(job,)` for a Status.
            payload: the encoded value.
            expected_last_seq: store only if the key's current value has this seq (0: the
                key has no value yet), so a slower writer never overwrites a newer value
                it has not seen; None to overwrite unconditionally.
            headers: extra headers stored with the value and returned in `LatestEntry`
                (e.g. a wake-up time); names starting with `Nats-` are reserved.

        Raises:
            ConcurrencyConflict: the key's current seq is not `expected_last_seq`.
            InvalidName: bad key, or a reserved header name.
            StreamNotFound: the stream does not answer (missing, or no leader).
            StoreUnavailable: no ack within `ack_timeout_s` (outcome unknown), or the
                connection is closed.
            PayloadTooLarge: the payload exceeds the server's max_payload.
            JetStreamApiError: JetStream refused it.
        """
        subject = self.subject(key)
        what = f"put {subject!r}"
        sent = _put_headers(headers, expected_last_seq)
        try:
            reply = await self._wire.request(
                what, subject, payload, timeout_s=self._ack_timeout_s, headers=sent or None
            )
        except ReplyTimeout:
            raise StoreUnavailable(
                what, f"no ack within {self._ack_timeout_s} s (it may still be stored)"
            ) from None
        except NoResponders:
            raise StreamNotFound(self._stream, subject) from None
        try:
            ack = PUB_ACK_DECODER.decode(reply.data)
        except msgspec.DecodeError as err:
            raise StoreUnavailable(what, f"undecodable ack {reply.data[:200]!r}") from err
        if ack.error is not None:
            m = _WRONG_LAST_SEQ.search(ack.error.description)
            if ack.error.err_code == _ERR_WRONG_LAST_SEQ and m and expected_last_seq is not None:
                raise ConcurrencyConflict(key[-1], expected_last_seq, int(m.group(1)))
            raise api_error(what, ack.error.code, ack.error.err_code, ack.error.description)
        return ack.seq

    async def publish(
        self,
        key: tuple[str, ...],
        payload: bytes,
        *,
        expected_last_seq: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`put` without waiting for JetStream's ack (one message, not two): for a writer
        that learns the outcome another way, e.g. from a `watch` that delivers every value
        put (the value stored, or another in its place when `expected_last_seq` was not
        the key's current seq, or nothing if it was lost).

        Raises:
            InvalidName: bad key, or a reserved header name.
            StoreUnavailable: the connection is closed, draining, or can't buffer more.
            PayloadTooLarge: the payload exceeds the server's max_payload.
        """
        subject = self.subject(key)
        sent = _put_headers(headers, expected_last_seq)
        await self._wire.publish(f"publish {subject!r}", subject, payload, sent or None)

    async def get(self, key: tuple[str, ...]) -> LatestEntry | None:
        """Return the current value of `key`, or None if it has none.

        Raises:
            InvalidName: bad key.
            StreamNotFound: the stream does not answer.
            StoreUnavailable: no reply within `read_timeout_s`.
        """
        subject = self.subject(key)
        get = self._wire.leader_get if self._read_from_leader else self._wire.direct_get
        msg = await get(
            f"get {subject!r}",
            self._stream,
            {"last_by_subj": subject},
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )
        return None if msg is None else self._entry(msg)

    async def stream_last_seq(self) -> int:
        """Return the stream's last seq (0 if empty): a reader following `watch` has seen
        every value put before it once its feed has delivered this seq (the API's jobs
        index waits for it, so a listing shows what was put before the request).

        Raises:
            StreamNotFound: the stream does not exist.
            StoreUnavailable: JetStream did not answer within `read_timeout_s`.
        """
        try:
            info = await self._wire.api(
                f"{self._stream} stream info",
                f"{self._layout.api_prefix}.STREAM.INFO.{self._stream}",
                None,
                timeout_s=self._read_timeout_s,
                stream=self._stream,
            )
        except JetStreamApiError as err:
            if err.err_code == 10059:
                raise StreamNotFound(self._stream, self.pattern()) from err
            raise
        return int((info.get("state") or {}).get("last_seq") or 0)

    async def get_all(self, pattern: tuple[str, ...] = ()) -> list[LatestEntry]:
        """Return the current value of every key matching `pattern`, in stream order.

        `("c1",)` on the discovery store is every job seen on cluster `c1`; `("*", "job-1")`
        is job-1's Discovery from every cluster; `()` is everything.

        Raises:
            InvalidName: bad pattern.
            StreamNotFound: the stream does not answer.
            StoreUnavailable: a reply did not come within `read_timeout_s`.
        """
        filter_subject = self.pattern(pattern)
        out: list[LatestEntry] = []
        start = 1
        while True:
            # Paging by "next message on the filter from seq": every message of these
            # streams is the latest of its subject, so this is multi_last without its cap.
            msgs, pending = await self._wire.direct_get_batch(
                f"get_all {filter_subject!r}",
                self._stream,
                {"seq": start, "next_by_subj": filter_subject, "batch": 1000},
                api_prefix=self._layout.api_prefix,
                timeout_s=self._read_timeout_s,
            )
            out.extend(self._entry(m) for m in msgs)
            if not msgs or pending == 0:
                return out
            start = header_int(msgs[-1], "Nats-Sequence") + 1

    def watch(self, pattern: tuple[str, ...] = (), *, initial: bool = True) -> LatestFeed:
        """Follow the values of keys matching `pattern`: an async iterator of `LatestEntry`.

        Args:
            pattern: tokens or `*`, padded with `*` (`()` is every key).
            initial: first deliver every matching key's current value, then changes; with
                False, only changes from now on.

        Returns:
            A feed to use as `async with store.watch(...) as changes: async for e in changes`.

        Raises:
            InvalidName: bad pattern.
        """
        feed = OrderedFeed(
            self._wire.nc,
            stream=self._stream,
            filter_subject=self.pattern(pattern),
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT if initial else DeliverPolicy.NEW,
            heartbeat_s=self._watch_heartbeat_s,
            api_prefix=self._layout.api_prefix,
            timeout_s=self._read_timeout_s,
        )
        return LatestFeed(feed, self)

    def shared(
        self,
        durable: str,
        pattern: tuple[str, ...] = (),
        *,
        ack_wait_s: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int = 1000,
        batch: int = 64,
        from_start: bool = True,
        headers_only: bool = True,
    ) -> SharedFeed:
        """Share the changes of keys matching `pattern` among replicas: each to one of them.

        A durable pull consumer named `durable` (the same in every replica): each `Delivery`
        names the job (the key's last token) and seq, and carries the value unless
        `headers_only` (then `get` it if needed); ack it when done.

        Args:
            durable: the consumer's name (a subject-safe token), e.g. `supervisor-discovery`.
            pattern: tokens or `*`, padded with `*` (`()` is every key).
            ack_wait_s: redeliver a message not acked within this many seconds.
            max_deliver: most deliveries of one message (-1: unlimited).
            max_ack_pending: most unacked messages over all replicas.
            batch: most messages this replica fetches at once.
            from_start: a new consumer starts with the current values (else at the next change).
            headers_only: deliver without the values (enough to know which key changed).
                Changing it on an existing consumer updates the consumer.

        Raises:
            InvalidName: bad pattern or consumer name.
        """
        return SharedFeed(
            self._wire.nc,
            stream=self._stream,
            durable=durable,
            filter_subject=self.pattern(pattern),
            job_of=lambda subject: self.key_of(subject)[-1],
            api_prefix=self._layout.api_prefix,
            ack_wait_s=ack_wait_s,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            batch=batch,
            headers_only=headers_only,
            from_start=from_start,
            timeout_s=self._read_timeout_s,
        )

    def _entry(self, msg: Msg) -> LatestEntry:
        headers = msg.headers or {}
        return LatestEntry(
            key=self.key_of(headers["Nats-Subject"]),
            seq=int(headers["Nats-Sequence"]),
            payload=msg.data,
            time=parse_nats_time(headers["Nats-Time-Stamp"]),
            headers=_user_headers(msg),
        )


def _user_headers(msg: Msg) -> dict[str, str]:
    return {k: v for k, v in (msg.headers or {}).items() if not k.lower().startswith("nats-")}


def _put_headers(
    headers: Mapping[str, str] | None, expected_last_seq: int | None
) -> dict[str, str]:
    """The headers of a put: the caller's (none reserved) and the expected last seq."""
    sent: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if name.lower().startswith("nats-"):
            raise InvalidName("header name", name, "names starting with 'Nats-' are reserved")
        sent[name] = value
    if expected_last_seq is not None:
        sent[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_seq)
    return sent

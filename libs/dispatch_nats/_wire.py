"""Request/reply on one NATS connection with every wait bounded (internal).

nats-py's `publish_async` never resolves its future when JetStream answers with an error
(nats-io/nats.py#985, measured in the lab), and `js.publish` pays for `wait_for` and
`json.loads` per call. `Wire` does what both do, without the trap: one wildcard inbox
subscription per connection, one future (or reply queue) per request, the reply routed by its
subject, and every wait under `asyncio.timeout`. A reply that never comes is a `ReplyTimeout`,
never a hang. It also speaks the two raw JetStream APIs the store needs and nats-py 2.16 lacks:
batch direct get (ADR-31) and stream info with paged `subjects_filter`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    MaxPayloadError,
    OutboundBufferLimitError,
)
from nats.errors import Error as NatsError

from dispatch_nats._feed import unsubscribe_quietly
from dispatch_nats.errors import (
    JetStreamApiError,
    PayloadTooLarge,
    StoreUnavailable,
    StreamNotFound,
    api_error,
)

log = logging.getLogger("dispatch_nats")

EXPECTED_LAST_SUBJECT_SEQ: Final = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: Final = "Nats-Expected-Last-Subject-Sequence-Subject"
MSG_ID: Final = "Nats-Msg-Id"
STATUS: Final = "Status"
DESCRIPTION: Final = "Description"
NO_RESPONDERS: Final = "503"

_SUB_PENDING_BYTES: Final = 256 * 1024 * 1024
_ERR_NO_MESSAGE: Final = 10037
_ERR_STREAM_NOT_FOUND: Final = 10059


class ReplyTimeout(Exception):
    """No reply came within the timeout (internal; the caller decides what it means)."""


class NoResponders(Exception):
    """The server said no one subscribes to the request subject (internal)."""


class ApiErrorBody(msgspec.Struct, frozen=True):
    """The `error` object of a JetStream API reply."""

    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct, frozen=True):
    """A JetStream publish acknowledgement (or its error)."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 0
    error: ApiErrorBody | None = None


PUB_ACK_DECODER: Final = msgspec.json.Decoder(PubAck)
_JSON_DECODER: Final = msgspec.json.Decoder(dict[str, Any])
_ENCODER: Final = msgspec.json.Encoder()


class _Replies:
    """Collects the replies of one multi-reply request (a batch direct get)."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()


class Wire:
    """Bounded request/reply over one connection, shared by all requests of a store."""

    def __init__(self, nc: NATS, *, max_in_flight: int = 1024) -> None:
        """Wrap `nc`; at most `max_in_flight` requests wait for a reply at once."""
        self._nc = nc
        self._prefix = ""
        self._next = 0
        self._pending: dict[str, asyncio.Future[Msg] | _Replies] = {}
        self._sub: Subscription | None = None
        self._sub_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_in_flight)

    @property
    def nc(self) -> NATS:
        """The connection."""
        return self._nc

    async def _inbox(self) -> str:
        if not self._prefix:
            async with self._sub_lock:
                if not self._prefix:
                    prefix = self._nc.new_inbox() + "."
                    self._sub = await self._nc.subscribe(
                        prefix + "*", cb=self._on_reply, pending_bytes_limit=_SUB_PENDING_BYTES
                    )
                    self._prefix = prefix
        self._next += 1
        return self._prefix + format(self._next, "x")

    async def close(self) -> None:
        """Drop the reply subscription (waiting requests time out). Safe to call twice."""
        sub, self._sub, self._prefix = self._sub, None, ""
        await unsubscribe_quietly(self._nc, sub)

    async def _on_reply(self, msg: Msg) -> None:
        waiter = self._pending.get(msg.subject)
        if waiter is None:
            return  # a late reply to a request that already gave up
        if isinstance(waiter, _Replies):
            waiter.queue.put_nowait(msg)
        elif not waiter.done():
            waiter.set_result(msg)

    async def _publish(
        self, what: str, subject: str, payload: bytes, reply: str, headers: Mapping[str, str] | None
    ) -> None:
        if self._nc.is_closed:
            raise StoreUnavailable(what, "the NATS connection is closed")
        try:
            await self._nc.publish(
                subject, payload, reply=reply, headers=dict(headers) if headers else None
            )
        except MaxPayloadError as err:
            raise PayloadTooLarge(subject, len(payload), self._nc.max_payload) from err
        except (ConnectionClosedError, ConnectionDrainingError, OutboundBufferLimitError) as err:
            raise StoreUnavailable(what, f"can't publish to {subject!r}: {err}") from err
        except NatsError as err:
            raise StoreUnavailable(what, f"publish to {subject!r} failed: {err!r}") from err

    async def publish(
        self, what: str, subject: str, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Publish without waiting for anything (the non-commit messages of an atomic batch).

        Raises:
            PayloadTooLarge: the payload exceeds the server's max_payload.
            StoreUnavailable: the connection is closed, draining, or can't buffer more.
        """
        await self._publish(what, subject, payload, "", headers)

    async def request(
        self,
        what: str,
        subject: str,
        payload: bytes,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> Msg:
        """Send one request and return its one reply.

        Args:
            what: a short description for error messages.
            subject: where to send it.
            payload: the body.
            timeout_s: how long to wait for the reply, in seconds.
            headers: NATS headers of the request.

        Raises:
            ReplyTimeout: no reply within `timeout_s` (the request may still have acted).
            NoResponders: nobody subscribes to `subject`, so nothing acted on it.
            StoreUnavailable: the connection is closed, draining, or can't buffer more.
        """
        async with self._slots:
            reply = await self._inbox()
            fut: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
            self._pending[reply] = fut
            try:
                await self._publish(what, subject, payload, reply, headers)
                try:
                    async with asyncio.timeout(timeout_s):
                        msg = await fut
                except TimeoutError:
                    raise ReplyTimeout(what) from None
            finally:
                del self._pending[reply]
        if msg.headers and not msg.data and msg.headers.get(STATUS) == NO_RESPONDERS:
            raise NoResponders(subject)
        return msg

    async def request_many(
        self, what: str, subject: str, payload: bytes, *, timeout_s: float
    ) -> tuple[list[Msg], Msg]:
        """Send one request answered by several replies ending with a status message.

        Used for batch direct get and multi_last: data messages, then a terminator whose
        `Status` header is `204` (end of batch) or an error status such as `404`.

        Args:
            what: a short description for error messages.
            subject: where to send it.
            payload: the body.
            timeout_s: the longest wait for each next reply, in seconds.

        Returns:
            The data messages in order, and the terminating status message.

        Raises:
            ReplyTimeout: a reply did not come within `timeout_s` of the previous one.
            NoResponders: nobody subscribes to `subject`.
            StoreUnavailable: the connection is closed or draining.
        """
        async with self._slots:
            reply = await self._inbox()
            replies = _Replies()
            self._pending[reply] = replies
            out: list[Msg] = []
            try:
                await self._publish(what, subject, payload, reply, None)
                while True:
                    try:
                        async with asyncio.timeout(timeout_s):
                            msg = await replies.queue.get()
                    except TimeoutError:
                        raise ReplyTimeout(what) from None
                    status = msg.headers.get(STATUS) if msg.headers else None
                    if status is None:
                        out.append(msg)
                        continue
                    if status == NO_RESPONDERS and not out:
                        raise NoResponders(subject)
                    return out, msg
            finally:
                del self._pending[reply]

    async def api(
        self,
        what: str,
        subject: str,
        body: Mapping[str, Any] | None,
        *,
        timeout_s: float,
        stream: str = "",
    ) -> dict[str, Any]:
        """Call a JetStream API endpoint and return its JSON reply (without an `error`).

        Args:
            what: a short description for error messages.
            subject: the API subject, e.g. `$JS.API.STREAM.INFO.<name>`.
            body: the JSON request, or None for an empty body.
            timeout_s: how long to wait for the reply, in seconds.
            stream: the stream concerned, for error messages.

        Raises:
            JetStreamApiError: the reply carries an error (`JetStreamTemporaryError` for
                500/503); the caller may catch a specific `err_code`.
            StoreUnavailable: no reply in time, JetStream not enabled, or the connection down.
        """
        payload = _ENCODER.encode(body) if body is not None else b""
        try:
            msg = await self.request(what, subject, payload, timeout_s=timeout_s)
        except ReplyTimeout:
            raise StoreUnavailable(what, f"no reply from JetStream within {timeout_s} s") from None
        except NoResponders:
            raise StoreUnavailable(
                what, f"JetStream did not answer on {subject!r} (is JetStream enabled?)"
            ) from None
        try:
            resp = _JSON_DECODER.decode(msg.data)
        except msgspec.DecodeError as err:
            raise StoreUnavailable(
                what, f"undecodable JetStream reply: {msg.data[:200]!r}"
            ) from err
        error = resp.get("error")
        if error:
            raise api_error(
                f"{what} ({stream})" if stream else what,
                int(error.get("code", 0)),
                int(error.get("err_code", 0)),
                str(error.get("description", "")),
            )
        return resp

    async def direct_get(
        self, what: str, stream: str, body: Mapping[str, Any], *, api_prefix: str, timeout_s: float
    ) -> Msg | None:
        """Get one message with a direct get (`seq` or `last_by_subj`); None if there is none.

        Raises:
            StreamNotFound: no stream (or no direct-get responder) answered.
            StoreUnavailable: no reply within `timeout_s` seconds, or the connection is down.
            JetStreamApiError: the server answered with another error status.
        """
        subject = f"{api_prefix}.DIRECT.GET.{stream}"
        try:
            msg = await self.request(what, subject, _ENCODER.encode(body), timeout_s=timeout_s)
        except ReplyTimeout:
            raise StoreUnavailable(what, f"no reply from JetStream within {timeout_s} s") from None
        except NoResponders:
            raise StreamNotFound(stream, str(body)) from None
        status = msg.headers.get(STATUS) if msg.headers else None
        if status is None:
            return msg
        if status == "404":
            return None
        raise _status_error(what, stream, msg)

    async def leader_get(
        self, what: str, stream: str, body: Mapping[str, Any], *, api_prefix: str, timeout_s: float
    ) -> Msg | None:
        """Get one message from the stream's leader (`STREAM.MSG.GET`, not a direct get);
        None if there is none.

        A direct get may be answered by any replica of an `allow_direct` stream, one still
        catching up included, so it can miss what the leader acknowledged. `STREAM.MSG.GET`
        is answered by the leader only. The reply is returned shaped like a direct get's
        (the `Nats-Subject`, `Nats-Sequence` and `Nats-Time-Stamp` headers, plus the
        message's own), so the caller reads both the same way.

        Raises:
            StreamNotFound: the stream does not exist.
            StoreUnavailable: no reply within `timeout_s` (no leader, or the connection down).
            JetStreamApiError: another error (`JetStreamTemporaryError` while electing).
        """
        try:
            resp = await self.api(
                what,
                f"{api_prefix}.STREAM.MSG.GET.{stream}",
                body,
                timeout_s=timeout_s,
                stream=stream,
            )
        except JetStreamApiError as err:
            if err.err_code == _ERR_NO_MESSAGE:
                return None
            if err.err_code == _ERR_STREAM_NOT_FOUND:
                raise StreamNotFound(stream, str(body)) from err
            raise
        raw = resp.get("message") or {}
        headers = _parse_headers(base64.b64decode(raw.get("hdrs") or ""))
        headers["Nats-Subject"] = str(raw.get("subject", ""))
        headers["Nats-Sequence"] = str(int(raw.get("seq", 0)))
        headers["Nats-Time-Stamp"] = str(raw.get("time", ""))
        return Msg(
            self._nc,
            subject=headers["Nats-Subject"],
            data=base64.b64decode(raw.get("data") or ""),
            headers=headers,
        )

    async def direct_get_batch(
        self, what: str, stream: str, body: Mapping[str, Any], *, api_prefix: str, timeout_s: float
    ) -> tuple[list[Msg], int]:
        """Run one batch direct get (or multi_last) and return its messages and what's left.

        Returns:
            The messages, and the number still pending for the filter after them (0 when the
            batch reached the end, or when nothing matched at all: a 404).

        Raises:
            StreamNotFound: no stream (or no direct-get responder) answered.
            StoreUnavailable: a reply did not come within `timeout_s` seconds of the previous.
            JetStreamApiError: the server ended the batch with an error status.
        """
        subject = f"{api_prefix}.DIRECT.GET.{stream}"
        try:
            msgs, end = await self.request_many(
                what, subject, _ENCODER.encode(body), timeout_s=timeout_s
            )
        except ReplyTimeout:
            raise StoreUnavailable(
                what, f"batch direct get stalled: no reply within {timeout_s} s"
            ) from None
        except NoResponders:
            raise StreamNotFound(stream, str(body)) from None
        assert end.headers is not None
        status = end.headers.get(STATUS)
        if status == "204":
            return msgs, int(end.headers.get("Nats-Num-Pending", "0"))
        if status == "404":
            return msgs, 0
        raise _status_error(what, stream, end)


def _status_error(what: str, stream: str, msg: Msg) -> Exception:
    headers = msg.headers or {}
    status = headers.get(STATUS, "")
    return api_error(
        f"{what} ({stream})",
        int(status) if status.isdigit() else 0,
        0,
        str(headers.get(DESCRIPTION, "")) or msg.data.decode(errors="replace"),
    )


def _parse_headers(block: bytes) -> dict[str, str]:
    """The headers of a `NATS/1.0` header block (as stored by JetStream)."""
    headers: dict[str, str] = {}
    for line in block.decode(errors="replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name:
            headers[name.strip()] = value.strip()
    return headers


def header_int(msg: Msg, name: str) -> int:
    """Return an integer header of a direct-get reply (`Nats-Sequence`, ...)."""
    assert msg.headers is not None
    return int(msg.headers[name])


def parse_nats_time(value: str) -> datetime:
    """Parse a JetStream RFC 3339 timestamp with nanoseconds (`...T09:17:14.287743249Z`) to UTC.

    Python keeps microseconds, so the last three digits are dropped.
    """
    value = value.removesuffix("Z")
    if "." in value:
        head, frac = value.split(".", 1)
        value = f"{head}.{frac[:6].ljust(6, '0')}"
    return datetime.fromisoformat(value).replace(tzinfo=UTC)

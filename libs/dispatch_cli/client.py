"""A thin, synchronous client of dispatch's HTTP API (``services/api/README.md``).

Every request carries the bearer token; every POST carries an ``Idempotency-Key`` made once
per command, so a request retried after a lost connection or a 503 is answered from the
first one's commit and nothing is recorded twice. Errors become :class:`~dispatch_cli.errors`
exceptions with the API's message (a 409's is the core's reason) and a documented exit code.

Responses are decoded into typed Structs (the core's ``Status``, ``Plan`` and events, and
mirrors of the API's own bodies); an enum name this build doesn't know is an error, never
misread (seed 000).
"""

from __future__ import annotations

import http.client
import ipaddress
import secrets
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar

import msgspec
import tenacity

from dispatch_cli.errors import ApiError, CliError, Unreachable
from dispatch_core import (
    Cause,
    HoldView,
    JobEvent,
    Plan,
    State,
    Status,
    UtcDatetime,
)

__all__ = [
    "ApiClient",
    "CommandResponse",
    "EscalationList",
    "EscalationView",
    "JobList",
    "JobSummary",
    "OutputResponse",
    "RecordResponse",
    "RecordedEvent",
    "SseMessage",
    "SubmitResponse",
    "UnreadableJob",
    "new_idempotency_key",
]

T = TypeVar("T")

_RETRIES: Final = 6
"""Tries of one request that meets a 503 or a connection lost after sending."""
_MAX_BACKOFF_S: Final = 5.0


# ------------------------------------------------------------------------- response bodies


class JobSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One job of ``GET /v1/jobs`` (the head of its Status)."""

    job_id: str
    state: State
    cause: Cause
    at: UtcDatetime
    seq: int
    settled: bool
    hold: HoldView | None = None
    submission: int | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    unreadable: bool = False
    """The job's record can't be read past this Status, which is stale (see ``unreadable``
    of the listing)."""
    cluster: str | None = None
    """``spec.cluster`` (None: unknown, or an API older than the jobs index)."""
    created_at: UtcDatetime | None = None
    """When the job was created (None: unknown)."""
    checkpoint: str | None = None
    """``spec.checkpoint``, the job's checkpoint root (None: none or unknown)."""
    published_step: int | None = None
    """The latest step published under the root, as the cluster's observer last read it
    (None: not read yet, nothing published, or an older API)."""
    published_at: UtcDatetime | None = None
    """When the observer read ``published_step``."""
    current_cluster: str | None = None
    """The current submission's cluster (after a failover not ``cluster``; None: no
    submission yet, unknown, or an older API)."""


class UnreadableJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job whose record the API can't read, listed apart: the event at fault and why."""

    job_id: str
    seq: int
    message: str


class JobList(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/jobs``: one page (``total`` jobs match the filters; ``next_after`` is the
    ``after`` of the next page, None on the last)."""

    jobs: tuple[JobSummary, ...]
    unreadable: tuple[UnreadableJob, ...] = ()
    total: int = 0
    offset: int = 0
    limit: int | None = None
    next_after: str | None = None


class EscalationView(msgspec.Struct, frozen=True, kw_only=True):
    """One escalation of ``GET /v1/escalations`` (seed 002)."""

    job_id: str
    id: str
    at: UtcDatetime
    detail: str
    delivered: UtcDatetime | None = None


class EscalationList(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/escalations``: oldest first."""

    escalations: tuple[EscalationView, ...]
    unreadable: tuple[UnreadableJob, ...] = ()


class RecordedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event of a record, with its seq."""

    seq: int
    event: JobEvent


class RecordResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/jobs/{job}/record``."""

    job_id: str
    events: tuple[RecordedEvent, ...]


class SubmitResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/jobs`` (201)."""

    job_id: str
    seq: int
    plan: Plan
    status: Status
    replayed: bool = False


class CommandResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/jobs/{job}/{command}`` (200; 201 for supersede)."""

    job_id: str
    command: str
    seq: int
    events: tuple[RecordedEvent, ...]
    status: Status
    new_job_id: str | None = None
    plan: Plan | None = None
    replayed: bool = False


class _ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    code: str = "unknown"
    message: str = ""
    field: str | None = None


class _ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: _ErrorDetail


class SseMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One server-sent event: its ``event`` name, ``id`` (none for the API's own first
    projection) and ``data``."""

    event: str
    id: str | None
    data: str


_ERROR_DECODER: Final = msgspec.json.Decoder(_ErrorBody)
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def new_idempotency_key() -> str:
    """Return a fresh ``Idempotency-Key``: one per command given, reused by its retries."""
    return f"cli-{secrets.token_hex(12)}"


def _decode(data: bytes, type_: type[T], what: str) -> T:
    decoder = _DECODERS.get(type_)
    if decoder is None:
        decoder = _DECODERS.setdefault(type_, msgspec.json.Decoder(type_))
    try:
        value: T = decoder.decode(data)
    except msgspec.DecodeError as err:
        raise CliError(
            f"the API's answer to {what} can't be read by this dispatch CLI ({err}); "
            "is the API a newer version?"
        ) from err
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiClient:
    """The API at ``url``, called with ``token`` (see the module docstring)."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0) -> None:
        """Prepare a client.

        Args:
            url: the API's base URL (``http://127.0.0.1:8080``).
            token: the bearer token; ``None`` sends none (every ``/v1`` route then answers
                401, which is reported as such).
            timeout_s: seconds one request may take.

        Raises:
            UsageError: ``url`` is not an ``http``/``https`` URL.
        """
        from dispatch_cli.errors import UsageError

        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(f"the API address {url!r} is not an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        # A proxy from the environment would get loopback requests too (urllib asks it for
        # every host not in no_proxy): never send the embedded default's traffic there.
        handlers: list[urllib.request.BaseHandler] = []
        if _is_loopback(parsed.hostname):
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    # -- plumbing -----------------------------------------------------------------------------

    def _url(self, path: str, query: Mapping[str, str | list[str]] | None = None) -> str:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        return url

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "dispatch-cli"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def _error(self, err: urllib.error.HTTPError) -> ApiError:
        raw = err.read()
        try:
            detail = _ERROR_DECODER.decode(raw).error
        except msgspec.DecodeError:
            text = raw.decode(errors="replace").strip()[:500]
            detail = _ErrorDetail(code=str(err.code), message=text or str(err.reason))
        return ApiError(err.code, detail.code, detail.message, field=detail.field, url=self.url)

    def stream_error(self, message: SseMessage) -> ApiError:
        """The error an ``event: error`` of the status stream reports (its ``data`` is the
        API's error body): 422 for ``record-unreadable`` (the job's record can't be read),
        else 500."""
        try:
            detail = _ERROR_DECODER.decode(message.data).error
        except msgspec.DecodeError:
            detail = _ErrorDetail(code="stream-error", message=message.data.strip()[:500])
        status = 422 if detail.code == "record-unreadable" else 500
        return ApiError(status, detail.code, detail.message, field=detail.field, url=self.url)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        query: Mapping[str, str | list[str]] | None = None,
        idempotency_key: str | None = None,
    ) -> bytes:
        """Send one request and return the answer's body (2xx).

        A 503 (``busy``, ``unavailable``) is retried after its ``Retry-After``; a connection
        lost after the request was sent is retried when retrying can't record anything twice
        (a GET, or a POST with its ``Idempotency-Key``). A refused connection is reported at
        once: nothing listens there.

        Raises:
            Unreachable: nothing answers at the address.
            ApiError: the API answered an error.
        """
        headers = self._headers()
        if body is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        retry_safe = method == "GET" or idempotency_key is not None
        url = self._url(path, query)

        def once() -> bytes:
            req = urllib.request.Request(url, data=body, method=method, headers=headers)
            try:
                with self._opener.open(req, timeout=self.timeout_s) as response:
                    data: bytes = response.read()
                    return data
            except urllib.error.HTTPError as err:
                if err.code == 503:
                    retry_after = _retry_after(err.headers.get("Retry-After"), None)
                    raise _Busy(self._error(err), retry_after) from None
                raise self._error(err) from None
            except urllib.error.URLError as err:
                reason = err.reason
                if isinstance(reason, ConnectionRefusedError | socket.gaierror) or not retry_safe:
                    raise Unreachable(self.url, _why(reason)) from None
                raise _Lost(Unreachable(self.url, _why(reason))) from None
            except (http.client.HTTPException, ConnectionError, TimeoutError) as err:
                if not retry_safe:
                    raise Unreachable(self.url, _why(err)) from None
                raise _Lost(Unreachable(self.url, _why(err))) from None

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(_RETRIES),
            wait=_wait,
            sleep=time.sleep,
            reraise=True,
        )
        try:
            return retrying(once)
        except _Retryable as err:
            raise err.final from None

    def get(
        self, path: str, type_: type[T], query: Mapping[str, str | list[str]] | None = None
    ) -> T:
        """GET ``path`` and decode the answer as ``type_``."""
        return _decode(self.request("GET", path, query=query), type_, f"GET {path}")

    def post(self, path: str, body: object, type_: type[T], *, key: str | None = None) -> T:
        """POST ``body`` (JSON) to ``path`` with an ``Idempotency-Key`` (``key``, else a new
        one) and decode the answer as ``type_``."""
        data = msgspec.json.encode(body)
        raw = self.request("POST", path, body=data, idempotency_key=key or new_idempotency_key())
        return _decode(raw, type_, f"POST {path}")

    # -- routes -------------------------------------------------------------------------------

    def healthy(self) -> bool:
        """Whether ``GET /healthz`` answers 200 (no token needed)."""
        try:
            req = urllib.request.Request(self._url("/healthz"), headers=self._headers())
            with self._opener.open(req, timeout=min(self.timeout_s, 5.0)) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            return False

    def submit(self, body: Mapping[str, Any], *, key: str | None = None) -> SubmitResponse:
        """``POST /v1/jobs``."""
        return self.post("/v1/jobs", body, SubmitResponse, key=key)

    def jobs(
        self,
        states: Sequence[str] | None = None,
        *,
        clusters: Sequence[str] | None = None,
        after: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> JobList:
        """``GET /v1/jobs``: the jobs in ``states`` on ``clusters`` (None or empty: all),
        past job id ``after``, from ``offset``, at most ``limit`` (None: all), filtered and
        paged by the API."""
        query: dict[str, str | list[str]] = {}
        if states:
            query["state"] = list(states)
        if clusters:
            query["cluster"] = list(clusters)
        if after is not None:
            query["after"] = after
        if offset:
            query["offset"] = str(offset)
        if limit is not None:
            query["limit"] = str(limit)
        return self.get("/v1/jobs", JobList, query or None)

    def status(self, job_id: str) -> Status:
        """``GET /v1/jobs/{job}``."""
        return self.get(f"/v1/jobs/{_quote(job_id)}", Status)

    def record(self, job_id: str, after: int = 0) -> RecordResponse:
        """``GET /v1/jobs/{job}/record``."""
        query = {"after": str(after)} if after else None
        return self.get(f"/v1/jobs/{_quote(job_id)}/record", RecordResponse, query)

    def escalations(
        self, *, job_id: str | None = None, delivered: bool | None = None
    ) -> EscalationList:
        """``GET /v1/escalations``."""
        query: dict[str, str | list[str]] = {}
        if job_id is not None:
            query["job"] = job_id
        if delivered is not None:
            query["delivered"] = "true" if delivered else "false"
        return self.get("/v1/escalations", EscalationList, query)

    def command(
        self, job_id: str, command: str, body: Mapping[str, Any], *, key: str | None = None
    ) -> CommandResponse:
        """``POST /v1/jobs/{job}/{command}``."""
        return self.post(f"/v1/jobs/{_quote(job_id)}/{command}", body, CommandResponse, key=key)

    def logs(
        self,
        job_id: str,
        *,
        execution: int | None = None,
        stream: str = "stdout",
        offset: int = 0,
        follow: bool = False,
        limit: int | None = None,
    ) -> OutputResponse:
        """Open ``GET /v1/jobs/{job}/logs``: the output of execution ``execution`` (default:
        the latest), ``stream`` (``stdout`` or ``stderr``) from byte ``offset``, at most
        ``limit`` bytes; with ``follow`` the answer runs until the execution ends (then no
        read timeout applies: a quiet job sends nothing for as long as it is quiet).

        Raises:
            Unreachable: nothing answers at the address.
            ApiError: the API refused it (401, 404 no such job or execution, 501 the
                cluster's backend reads no output, 503 its observer did not answer).
        """
        query: dict[str, str | list[str]] = {"stream": stream}
        if execution is not None:
            query["execution"] = str(execution)
        if offset:
            query["offset"] = str(offset)
        if follow:
            query["follow"] = "true"
        if limit is not None:
            query["limit"] = str(limit)
        req = urllib.request.Request(
            self._url(f"/v1/jobs/{_quote(job_id)}/logs", query),
            headers=self._headers({"Accept": "application/octet-stream"}),
        )
        try:
            response = self._opener.open(req, timeout=None if follow else self.timeout_s)
        except urllib.error.HTTPError as err:
            raise self._error(err) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            reason = err.reason if isinstance(err, urllib.error.URLError) else err
            raise Unreachable(self.url, _why(reason)) from None
        return OutputResponse(self.url, response)

    def stream(
        self, job_id: str, *, last_event_id: str | None = None, read_timeout_s: float = 60.0
    ) -> Iterator[SseMessage]:
        """Yield the events of ``GET /v1/jobs/{job}/stream`` until the server ends it.

        Args:
            job_id: the job.
            last_event_id: sent as ``Last-Event-ID`` (resume after it).
            read_timeout_s: seconds without a byte (heartbeats included) before the stream
                counts as lost.

        Raises:
            Unreachable: the stream can't be opened, or went silent for ``read_timeout_s``.
            ApiError: the API refused to open it (401, 404, ...).
        """
        extra = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            extra["Last-Event-ID"] = last_event_id
        req = urllib.request.Request(
            self._url(f"/v1/jobs/{_quote(job_id)}/stream"), headers=self._headers(extra)
        )
        try:
            response = self._opener.open(req, timeout=read_timeout_s)
        except urllib.error.HTTPError as err:
            raise self._error(err) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            reason = err.reason if isinstance(err, urllib.error.URLError) else err
            raise Unreachable(self.url, _why(reason)) from None
        with response:
            try:
                yield from _parse_sse(response)
            except (http.client.HTTPException, OSError) as err:
                raise Unreachable(self.url, f"the stream was lost: {_why(err)}") from None


class OutputResponse:
    """An execution's output as ``GET /v1/jobs/{job}/logs`` sends it: what it is (the
    headers), then its bytes as they come (iterate; close when done)."""

    def __init__(self, url: str, response: http.client.HTTPResponse) -> None:
        self._url = url
        self._response = response
        headers = response.headers
        self.execution = int(headers.get("Dispatch-Execution", "0") or 0)
        """The execution (submission N) whose output this is."""
        self.object = headers.get("Dispatch-Object", "")
        """The object (``<cluster>/<id>``) whose output this is."""
        self.location = headers.get("Dispatch-Output-Location", "")
        """Where the output is (a file path, a pod), for a person."""
        self.live = headers.get("Dispatch-Output-Live", "") == "true"
        """Whether the object had not ended when the answer began."""

    def __iter__(self) -> Iterator[bytes]:
        """Yield the output's bytes as they arrive, until the API ends the answer.

        Raises:
            Unreachable: the answer was cut short (the observer stopped answering, or the
                connection was lost).
        """
        try:
            while True:
                data = self._response.read1(64 * 1024)
                if not data:
                    return
                yield data
        except (http.client.HTTPException, OSError) as err:
            raise Unreachable(self._url, f"the output was cut short: {_why(err)}") from None

    def close(self) -> None:
        """Close the connection."""
        self._response.close()

    def __enter__(self) -> OutputResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_sse(response: http.client.HTTPResponse) -> Iterator[SseMessage]:
    fields: dict[str, str] = {}
    data: list[str] = []
    while True:
        raw = response.readline()
        if not raw:
            return
        line = raw.decode(errors="replace").rstrip("\r\n")
        if line == "":
            if data or "event" in fields:
                yield SseMessage(
                    event=fields.get("event", "message"), id=fields.get("id"), data="\n".join(data)
                )
            fields, data = {}, []
        elif line.startswith(":"):
            continue  # a heartbeat comment
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            else:
                fields[name] = value


class _Retryable(Exception):
    """A try that may be made again without recording anything twice; ``final`` is what the
    caller gets when no try is left."""

    def __init__(self, final: CliError, retry_after_s: float | None = None) -> None:
        super().__init__(str(final))
        self.final, self.retry_after_s = final, retry_after_s


class _Busy(_Retryable):
    """503 (``busy``, ``unavailable``): try again after its ``Retry-After``."""


class _Lost(_Retryable):
    """The connection was lost after the request was sent (a GET, or a POST with its key)."""


_BACKOFF: Final = tenacity.wait_exponential(multiplier=0.25, max=_MAX_BACKOFF_S)


def _wait(state: tenacity.RetryCallState) -> float:
    """The API's ``Retry-After`` when it sent one, else exponential backoff (0.25 s, 0.5 s,
    ... at most ``_MAX_BACKOFF_S``)."""
    outcome = state.outcome
    err = outcome.exception() if outcome is not None else None
    if isinstance(err, _Retryable) and err.retry_after_s is not None:
        return err.retry_after_s
    return float(_BACKOFF(state))


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _retry_after(value: str | None, default: float | None) -> float | None:
    if not value:
        return default
    try:
        return min(max(float(value), 0.0), _MAX_BACKOFF_S)
    except ValueError:
        return default


def _why(reason: object) -> str:
    match reason:
        case ConnectionRefusedError():
            return "connection refused"
        case socket.gaierror():
            return f"unknown host: {reason}"
        case TimeoutError() | socket.timeout():
            return "timed out"
        case str():
            return reason
        case _:
            return str(reason) or type(reason).__name__

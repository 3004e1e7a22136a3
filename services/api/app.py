"""The aiohttp application: routes, authentication, JSON errors, the SSE status stream.

Routes (every ``/v1`` route needs ``Authorization: Bearer <token>``):

* ``POST /v1/jobs`` submit; ``GET /v1/jobs?state=...`` list; ``GET /v1/jobs/{job}`` Status;
  ``GET /v1/jobs/{job}/record?after=N`` events; ``GET /v1/jobs/{job}/stream`` SSE of Status;
  ``GET /v1/jobs/{job}/logs?execution=&stream=&offset=&follow=&limit=`` an execution's output
  (streamed; asked of the cluster's observer, services/api/output.py);
* ``POST /v1/jobs/{job}/{command}`` for ``hold``, ``release``, ``resubmit``, ``cancel``,
  ``give-up``, ``abandon``, ``supersede``, ``emergency-stop``;
* ``GET /v1/escalations?delivered=true|false&job=...``;
* ``GET /healthz``, ``GET /metrics``, ``GET /openapi.json`` (no token).

Every error, the router's own 404/405/413 included, is ``{"error": {"code", "message",
"field"?}}`` (:class:`~services.api.schemas.ErrorBody`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from dispatch_backends import OUTPUT_CHUNK_LIMIT, OutputStream
from dispatch_core import DecodeError, DispatchError, Status, decode, encode, is_job_id
from dispatch_nats import LatestEntry, NatsStoreError, PayloadTooLarge
from services.api.auth import Authenticator
from services.api.errors import ApiError, BadRequest, NotFound, StoreDown, UnreadableRecord
from services.api.feeds import FeedQueue, SseCounters, end_streams, serve_feed
from services.api.jobindex import parse_listing
from services.api.metrics import ApiMetrics
from services.api.openapi import IDEMPOTENCY_KEY_PATTERN, build_openapi
from services.api.operations import MAX_SEQ, Operations
from services.api.output import (
    OutputClient,
    OutputUnsupported,
    execution_object,
    wait_for_object,
)
from services.api.query import query_bool, query_int
from services.api.schemas import COMMAND_REQUESTS, ErrorBody, ErrorDetail
from services.api.web import mount as mount_web
from services.common.http import health_app

__all__ = ["make_app"]

log = logging.getLogger("services.api")

_JSON: Final = "application/json"
_IDEMPOTENCY_KEY: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)
_HTTP_CODES: Final[dict[int, str]] = {
    400: "invalid",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "too-large",
    415: "unsupported-media-type",
}
_OPS: Final = web.AppKey("ops", Operations)
_AUTH: Final = web.AppKey("auth", Authenticator)
_METRICS: Final = web.AppKey("metrics", ApiMetrics)
_STREAMS: Final[web.AppKey[set[FeedQueue]]] = web.AppKey("streams")
_HEARTBEAT: Final = web.AppKey("heartbeat_s", float)
_OPENAPI: Final = web.AppKey("openapi", bytes)
_OUTPUT: Final = web.AppKey("output", OutputClient)
_MAX_OFFSET: Final = 2**62

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=encode(obj), status=status, content_type=_JSON, headers=headers)


def _error(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    *,
    job_id: str | None = None,
    seq: int | None = None,
) -> web.Response:
    detail = ErrorDetail(code=code, message=message, field=field, job_id=job_id, seq=seq)
    return _json(ErrorBody(error=detail), status, headers)


def _api_error(err: ApiError) -> web.Response:
    headers: dict[str, str] = {}
    if err.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="dispatch"'
    if err.status == 503:
        headers["Retry-After"] = "1"
    return _error(
        err.status,
        err.code,
        err.message,
        err.field,
        headers or None,
        job_id=err.job_id,
        seq=err.seq,
    )


def _route_of(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def _errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every error as JSON, and count every request by route and status."""
    metrics = request.app[_METRICS]
    started = time.monotonic()
    response: web.StreamResponse
    try:
        response = await handler(request)
    except ApiError as err:
        response = _api_error(err)
    except web.HTTPException as exc:
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        code = _HTTP_CODES.get(exc.status, "http-error")
        response = _error(exc.status, code, exc.reason, headers=headers)
    except PayloadTooLarge as err:
        response = _error(413, "too-large", f"the event would be too large to record: {err}")
    except NatsStoreError as err:
        if not err.retryable:
            log.exception("request.store_error", extra={"route": _route_of(request)})
            response = _error(500, "internal", str(err))
        else:
            log.warning("request.store_unavailable", extra={"error": str(err)})
            response = _api_error(StoreDown(str(err)))
    except DispatchError as err:  # a bug: Operations answers an unreadable record itself
        log.exception("request.record_unreadable", extra={"route": _route_of(request)})
        response = _error(500, "internal", str(err))
    except Exception:
        log.exception("request.failed", extra={"route": _route_of(request)})
        response = _error(500, "internal", "internal error; see the API's log")
    route = _route_of(request)
    metrics.requests.labels(route, request.method, str(response.status)).inc()
    metrics.latency.labels(route, request.method).observe(time.monotonic() - started)
    return response


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise BadRequest(
            "Idempotency-Key must be 1 to 200 printable ASCII characters without spaces",
            field="Idempotency-Key",
        )
    return key


async def _submit(request: web.Request) -> web.Response:
    actor = request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    key = _idempotency_key(request)
    body = await request.read()
    answer = await request.app[_OPS].submit(actor, body, key)
    return _json(answer, 201, {"Location": f"/v1/jobs/{answer.job_id}"})


def _command_handler(command: str) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        actor = request.app[_AUTH].authenticate(request.headers.get("Authorization"))
        key = _idempotency_key(request)
        body = await request.read()
        job_id = request.match_info["job"]
        answer = await request.app[_OPS].command(actor, job_id, command, body, key)
        if answer.new_job_id is not None:
            return _json(answer, 201, {"Location": f"/v1/jobs/{answer.new_job_id}"})
        return _json(answer)

    return handle


async def _list_jobs(request: web.Request) -> web.Response:
    request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    q = parse_listing(request.query)
    listing = await request.app[_OPS].list_jobs(
        q.states, clusters=q.clusters, after=q.after, offset=q.offset, limit=q.limit
    )
    return _json(listing)


async def _status(request: web.Request) -> web.Response:
    request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    status, source = await request.app[_OPS].status(request.match_info["job"])
    return _json(status, headers={"Dispatch-Status-Source": source})


async def _record(request: web.Request) -> web.Response:
    request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    after = query_int(request.query, "after", 0, MAX_SEQ) or 0
    return _json(await request.app[_OPS].record(request.match_info["job"], after))


async def _escalations(request: web.Request) -> web.Response:
    request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    delivered = query_bool(request.query, "delivered")
    job_id = request.query.get("job")
    if job_id is not None and not is_job_id(job_id):
        raise BadRequest(f"{job_id!r} is not a job id", field="job")
    return _json(await request.app[_OPS].escalations(delivered=delivered, job_id=job_id))


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _logs(request: web.Request) -> web.StreamResponse:
    """An execution's output, streamed as it is read from the cluster's observer (see
    services/api/output.py); with ``follow=true`` until the execution ends."""
    request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    if _OUTPUT not in request.app:
        raise OutputUnsupported("this API reads no output (it has no NATS connection for it)")
    output = request.app[_OUTPUT]
    ops = request.app[_OPS]
    job_id = request.match_info["job"]
    execution = query_int(request.query, "execution", 1, MAX_SEQ)
    offset = query_int(request.query, "offset", 0, _MAX_OFFSET) or 0
    limit = query_int(request.query, "limit", 0, _MAX_OFFSET)
    follow = query_bool(request.query, "follow") or False
    raw_stream = request.query.get("stream", OutputStream.STDOUT.value)
    try:
        stream = OutputStream(raw_stream)
    except ValueError:
        raise BadRequest(
            f"stream must be stdout or stderr, got {raw_stream!r}", field="stream"
        ) from None
    job = await ops.existing_job(job_id)  # 404 before anything else when there is no such job
    if follow:  # an execution not launched yet is waited for (until the job has an outcome)
        found = await wait_for_object(
            lambda: ops.existing_job(job_id), execution, output.poll_s, lambda: _gone(request)
        )
    else:
        found = execution_object(job, execution)
    if found is None:
        which = f"execution {execution}" if execution is not None else "execution yet"
        raise NotFound(f"job {job_id!r} has no {which} (nothing was launched for it)")
    number, ref = found
    first = await output.read(
        ref, stream, offset, OUTPUT_CHUNK_LIMIT if limit is None else min(limit, OUTPUT_CHUNK_LIMIT)
    )
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            "Dispatch-Execution": str(number),
            "Dispatch-Object": str(ref),
            "Dispatch-Output-Location": first.where,
            "Dispatch-Output-Live": "true" if first.live else "false",
        }
    )
    await response.prepare(request)
    try:
        async for chunk in output.chunks(
            ref, stream, offset, follow=follow, limit=limit, first=first
        ):
            if chunk.data:
                await response.write(chunk.data)
            elif _gone(request):  # a quiet object: nothing written would notice the client left
                return response
    except ApiError as err:
        # The answer is under way: cut it short, so the client sees an incomplete body
        # rather than a complete one.
        log.warning("logs.cut", extra={"job_id": job_id, "object": str(ref), "error": str(err)})
        if request.transport is not None:
            request.transport.close()
        return response
    except ConnectionResetError:
        log.debug("logs.client_gone", extra={"job_id": job_id})
        return response
    await response.write_eof()
    return response


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[_OPENAPI], content_type=_JSON)


# --------------------------------------------------------------------------------- SSE


def _sse(status_json: bytes, seq: int | None) -> bytes:
    head = b"event: status\n" + (f"id: {seq}\n".encode() if seq is not None else b"")
    return head + b"data: " + status_json + b"\n\n"


async def _stream(request: web.Request) -> web.StreamResponse:
    """SSE of the job's Status: the current one, then every change, in order."""
    request.app[_AUTH].authenticate(request.headers.get("Authorization"))
    ops = request.app[_OPS]
    metrics = request.app[_METRICS]
    job_id = request.match_info["job"]
    if not await ops.exists(job_id):
        raise NotFound(f"no job {job_id!r}")
    last_id: int | None = None
    with contextlib.suppress(ValueError):
        last_id = int(request.headers.get("Last-Event-ID", ""))

    async def opening(response: web.StreamResponse, queue: FeedQueue) -> bool:
        # Where the job stands now, read before anything is streamed: a record that can't be
        # read is said at once, even when a Status was published (that one is stale: the
        # supervisor leaves such a job alone, so nothing newer would ever come).
        try:
            status, source = await ops.status(job_id)
        except UnreadableRecord as err:
            # The answer is already under way (200, event stream): say it as an event.
            detail = ErrorDetail(code=err.code, message=err.message, job_id=err.job_id, seq=err.seq)
            await response.write(b"event: error\ndata: " + encode(ErrorBody(error=detail)))
            await response.write(b"\n\n")
            return False
        if last_id is None and queue.empty() and source == "api":
            # Nothing published yet (or not yet delivered): say where the job stands now. The
            # watch started first, so no later change is missed.
            await response.write(_sse(encode(status), None))
            metrics.sse_events.inc()
        return True

    def frame(entry: LatestEntry) -> bytes | None:
        if last_id is not None and entry.seq <= last_id:
            return None
        try:
            decode(entry.payload, Status)
        except DecodeError:
            log.warning("stream.undecodable_status", extra={"job_id": job_id, "seq": entry.seq})
            return None
        return _sse(entry.payload, entry.seq)

    return await serve_feed(
        request,
        ops.watch(job_id),
        frame,
        streams=request.app[_STREAMS],
        what="stream",
        heartbeat_s=request.app[_HEARTBEAT],
        queue_size=1024,
        opening=opening,
        counters=SseCounters(metrics.sse_streams, metrics.sse_events),
    )


async def _close_streams(app: web.Application) -> None:
    """At shutdown, end every SSE stream and stop the jobs index's feeds."""
    await app[_OPS].aclose()
    end_streams(app[_STREAMS])


def make_app(
    ops: Operations,
    auth: Authenticator,
    *,
    registry: CollectorRegistry,
    metrics: ApiMetrics,
    ready: asyncio.Event,
    max_body_bytes: int = 1024 * 1024,
    sse_heartbeat_s: float = 15.0,
    output: OutputClient | None = None,
) -> web.Application:
    """Return the API's aiohttp application.

    Args:
        ops: the operations.
        auth: the bearer tokens.
        registry: the Prometheus registry ``/metrics`` serves.
        metrics: the API's metrics (on ``registry``).
        ready: set once NATS is connected and the streams exist (``/healthz`` answers 200).
        max_body_bytes: the largest request body (413 beyond).
        sse_heartbeat_s: seconds between heartbeat comments on an idle SSE stream.
        output: how output is asked of the observers (``/v1/jobs/{job}/logs``; without it
            that route answers 501).
    """
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors_and_metrics])
    # /healthz and /metrics are every service's own (services.common.http).
    for route in health_app(registry, ready, service="api").router.routes():
        if route.method == "GET" and route.resource is not None:
            app.router.add_get(route.resource.canonical, route.handler)
    app[_OPS] = ops
    app[_AUTH] = auth
    app[_METRICS] = metrics
    app[_STREAMS] = set()
    app[_HEARTBEAT] = sse_heartbeat_s
    app[_OPENAPI] = msgspec.json.encode(build_openapi(ops.clusters))
    if output is not None:
        app[_OUTPUT] = output
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_post("/v1/jobs", _submit)
    app.router.add_get("/v1/jobs", _list_jobs)
    app.router.add_get("/v1/escalations", _escalations)
    app.router.add_get("/v1/jobs/{job}", _status)
    app.router.add_get("/v1/jobs/{job}/record", _record)
    app.router.add_get("/v1/jobs/{job}/stream", _stream)
    app.router.add_get("/v1/jobs/{job}/logs", _logs)
    for command in COMMAND_REQUESTS:
        app.router.add_post(f"/v1/jobs/{{job}}/{command}", _command_handler(command))
    mount_web(app, ops, auth, app[_STREAMS])  # the operator's web page at / (services/api/web)
    return app

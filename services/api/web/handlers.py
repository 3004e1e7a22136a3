"""The web page's routes (see the package docstring): the page, its assets, and the
page-only JSON routes that join what the JSON API serves per job into what one screen shows.

Errors are raised as the API's own (:class:`~services.api.errors.ApiError`), so the API's
middleware answers them as ``{"error": {...}}`` like every ``/v1`` error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
from aiohttp import web

from dispatch_core import (
    Actor,
    DecodeError,
    InvalidPolicy,
    JobCreated,
    State,
    Status,
    decode,
    encode,
    is_job_id,
    make_plan,
)
from dispatch_nats import LatestEntry, NatsStoreError
from services.api.auth import Authenticator
from services.api.errors import ApiError, BadRequest, NotFound, UnreadableRecord
from services.api.operations import Operations
from services.api.schemas import (
    JobSummary,
    SubmitRequest,
    UnreadableJob,
    check_spec,
    decode_body,
)
from services.api.web.escalations import SEVERITY_ORDER, EscalationInfo, describe

__all__ = ["JOBS_PAGE_MAX", "mount"]

log = logging.getLogger("services.api.web")

STATIC: Final = Path(__file__).parent / "static"
_ASSETS: Final[dict[str, str]] = {
    "app.js": "text/javascript",
    "app.css": "text/css",
}
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page may talk to its own origin only: the browser refuses anything else."""
JOBS_PAGE_DEFAULT: Final = 50
JOBS_PAGE_MAX: Final = 500
_HEARTBEAT_S: Final = 15.0
_INDEX_REFRESH_S: Final = 30.0
"""Age (seconds) after which the jobs index is rebuilt in the background."""
_INDEX_RETRY_S: Final = 1.0
"""Wait (seconds) before following the Status changes again after the feed failed."""
_MADE_ID: Final = re.compile(r"^(?P<name>.+)-[a-z2-7]{8}$")

_OPS: Final = web.AppKey("web_ops", Operations)
_AUTH: Final = web.AppKey("web_auth", Authenticator)
_CREATED: Final[web.AppKey[dict[str, _Created]]] = web.AppKey("web_created")
_STREAMS: Final[web.AppKey[set[asyncio.Queue[LatestEntry | None]]]] = web.AppKey("web_streams")
_INDEX: Final[web.AppKey[_Index]] = web.AppKey("web_index")


class _Created(msgspec.Struct, frozen=True, kw_only=True):
    """What never changes of a job after creation (cached per API process)."""

    cluster: str
    at: datetime
    by: str
    checkpoint: str


class _Index:
    """Every job's Status head, kept in the API process for the jobs list.

    Built from ``Operations.list_jobs`` (every published Status, and the jobs with a record
    but no Status yet), then kept current by one feed of every Status change; rebuilt in the
    background when older than :data:`_INDEX_REFRESH_S` (a job submitted while the feed was
    down, a Status the feed missed). A value replaces another only when it is as new or
    newer (record seq, then projection time), so a rebuild racing the feed never goes back.
    A page of 10,000 jobs is then a sort in memory, not 10,000 reads (bench/web_jobs.py).
    """

    def __init__(self, ops: Operations) -> None:
        self._ops = ops
        self._jobs: dict[str, JobSummary] = {}
        self._unreadable: tuple[UnreadableJob, ...] = ()
        self._sorted: list[JobSummary] | None = None
        self._built_at: float | None = None
        self._follower: asyncio.Task[None] | None = None
        self._rebuild: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def _put(self, summary: JobSummary) -> None:
        old = self._jobs.get(summary.job_id)
        if old is None or (summary.seq, summary.at) >= (old.seq, old.at):
            self._jobs[summary.job_id] = summary
            self._sorted = None

    async def _build(self) -> None:
        async with self._lock:
            started = time.monotonic()
            listing = await self._ops.list_jobs()
            fresh = {s.job_id: s for s in listing.jobs}
            for job_id, known in self._jobs.items():
                now = fresh.get(job_id)
                if now is not None and (known.seq, known.at) > (now.seq, now.at):
                    fresh[job_id] = known
            self._jobs = fresh
            self._unreadable = listing.unreadable
            self._sorted = None
            self._built_at = started

    async def _follow(self) -> None:
        while True:
            try:
                async with self._ops.watch_changes() as feed:
                    async for entry in feed:
                        try:
                            status = decode(entry.payload, Status)
                        except DecodeError:
                            continue
                        self._put(JobSummary.of(status))
            except NatsStoreError as err:
                log.warning("web.index_feed_failed", extra={"error": str(err)})
            self._built_at = None  # what the feed missed meanwhile: rebuild on next read
            await asyncio.sleep(_INDEX_RETRY_S)

    async def jobs(self) -> tuple[list[JobSummary], tuple[UnreadableJob, ...]]:
        """Every job by id, and the jobs whose record can't be read.

        Raises:
            NatsStoreError: the first build couldn't read the statuses (a 503 or 500).
        """
        if self._follower is None or self._follower.done():
            self._follower = asyncio.create_task(self._follow())
        if self._built_at is None:
            await self._build()
        elif time.monotonic() - self._built_at > _INDEX_REFRESH_S and (
            self._rebuild is None or self._rebuild.done()
        ):
            self._rebuild = asyncio.create_task(self._build())
        if self._sorted is None:
            self._sorted = [self._jobs[k] for k in sorted(self._jobs)]
        return self._sorted, self._unreadable

    async def close(self) -> None:
        """Stop following (at the API's shutdown)."""
        for task in (self._follower, self._rebuild):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, NatsStoreError):
                    await task


def _actor(request: web.Request) -> Actor:
    return request.app[_AUTH].authenticate(request.headers.get("Authorization"))


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(
        body=encode(obj),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


# ------------------------------------------------------------------------------ assets


async def _index(request: web.Request) -> web.Response:
    return web.Response(
        body=(STATIC / "index.html").read_bytes(),
        content_type="text/html",
        charset="utf-8",
        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"},
    )


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = _ASSETS.get(name)
    if kind is None:
        raise NotFound(f"no asset {name!r}")
    return web.Response(
        body=(STATIC / name).read_bytes(),
        content_type=kind,
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )


# ------------------------------------------------------------------------------ helpers


async def _created(app: web.Application, job_id: str) -> _Created | None:
    """The job's creation (cluster, time, submitter, checkpoint root), read once."""
    cache = app[_CREATED]
    found = cache.get(job_id)
    if found is not None:
        return found
    try:
        record = await app[_OPS].record(job_id, 0)
    except (UnreadableRecord, NotFound):
        return None
    for item in record.events[:1]:
        event = item.event
        if isinstance(event, JobCreated):
            found = _Created(
                cluster=event.spec.cluster,
                at=event.at,
                by=event.by.name,
                checkpoint=event.spec.checkpoint or "",
            )
            cache[job_id] = found
    return found


def _open_items(
    summary: JobSummary, escalations: list[tuple[str, datetime, str]], cluster: str | None
) -> list[dict[str, Any]]:
    """The escalations of one job still waiting for a person, and its hold as ``held:<i>``.

    Open: the job hasn't settled (or, for ``failed:``/``refused:``, it hasn't been
    superseded); ``overdue:<i>`` only while hold ``i`` is in force; ``give-up`` never (it has
    no answer).
    """
    out: list[dict[str, Any]] = []
    hold = summary.hold
    for esc_id, at, detail in escalations:
        info = describe(esc_id, cluster=cluster)
        if not info.answers:
            continue
        if info.kind in ("failed", "refused"):
            if summary.superseded_by is not None:
                continue
        elif summary.settled:
            continue
        if info.kind == "overdue" and (hold is None or str(hold.instance) != info.arg):
            continue
        out.append(_item(summary, esc_id, at, detail, info))
    if hold is not None and not any(i["id"] == f"overdue:{hold.instance}" for i in out):
        esc_id = f"held:{hold.instance}"
        detail = f"{hold.kind} hold by {hold.by.name}: {hold.reason}"
        out.append(_item(summary, esc_id, hold.since, detail, describe(esc_id, cluster=cluster)))
    return out


def _item(
    summary: JobSummary, esc_id: str, at: datetime, detail: str, info: EscalationInfo
) -> dict[str, Any]:
    return {
        "job_id": summary.job_id,
        "id": esc_id,
        "at": at,
        "detail": detail,
        "state": summary.state,
        "hold_kind": None if summary.hold is None else summary.hold.kind,
        **msgspec.to_builtins(info),
    }


async def _job_escalations(ops: Operations, job_id: str) -> list[tuple[str, datetime, str]]:
    try:
        listed = await ops.escalations(job_id=job_id)
    except UnreadableRecord:
        return []
    return [(e.id, e.at, e.detail) for e in listed.escalations]


async def _open_for(app: web.Application, summary: JobSummary) -> list[dict[str, Any]]:
    created = await _created(app, summary.job_id)
    cluster = None if created is None else created.cluster
    escalations = await _job_escalations(app[_OPS], summary.job_id)
    return _open_items(summary, escalations, cluster)


async def _gather(fns: list[Any], limit: int = 16) -> list[Any]:
    slots = asyncio.Semaphore(limit)

    async def one(fn: Any) -> Any:
        async with slots:
            return await fn

    return list(await asyncio.gather(*(one(f) for f in fns)))


def _int(request: web.Request, name: str, default: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= high:
        raise BadRequest(f"{name} must be an integer in 0..{high}, got {raw!r}", field=name)
    return value


def _states(request: web.Request) -> frozenset[State] | None:
    states: set[State] = set()
    for value in request.query.getall("state", []):
        for name in filter(None, (v.strip() for v in value.split(","))):
            try:
                states.add(State(name))
            except ValueError:
                known = ", ".join(s.value for s in State)
                raise BadRequest(
                    f"unknown state {name!r} (states: {known})", field="state"
                ) from None
    return frozenset(states) or None


# ------------------------------------------------------------------------------ routes


async def _me(request: web.Request) -> web.Response:
    actor = _actor(request)
    return _json({"name": actor.name, "kind": actor.kind})


async def _jobs(request: web.Request) -> web.Response:
    """One page of the jobs list (by id, as ``GET /v1/jobs``), with the total that match.

    Query: ``state`` (repeatable or comma-separated), ``cluster``, ``needs=person`` (a job
    with an open escalation or a hold in force), ``offset`` and ``limit`` (at most
    :data:`JOBS_PAGE_MAX`).
    """
    _actor(request)
    app = request.app
    ops = app[_OPS]
    offset = _int(request, "offset", 0, 10**9)
    limit = _int(request, "limit", JOBS_PAGE_DEFAULT, JOBS_PAGE_MAX) or JOBS_PAGE_DEFAULT
    cluster = request.query.get("cluster") or None
    needs = request.query.get("needs")
    if needs not in (None, "", "person"):
        raise BadRequest(f"needs must be 'person', got {needs!r}", field="needs")
    states = _states(request)
    everything, unreadable = await app[_INDEX].jobs()
    rows = [r for r in everything if states is None or r.state in states]
    if cluster is not None:
        created = await _gather([_created(app, r.job_id) for r in rows])
        rows = [r for r, c in zip(rows, created, strict=True) if c and c.cluster == cluster]
    opens: dict[str, list[dict[str, Any]]] = {}
    if needs == "person":
        candidates = [
            r for r in rows if r.hold is not None or not r.settled or r.state == State.FAILED
        ]
        found = await _gather([_open_for(app, r) for r in candidates])
        for r, items in zip(candidates, found, strict=True):
            opens[r.job_id] = items
        rows = [r for r in rows if opens.get(r.job_id)]
    page = rows[offset : offset + limit]
    now = datetime.now(UTC)

    async def row(summary: JobSummary) -> dict[str, Any]:
        created = await _created(app, summary.job_id)
        items = opens.get(summary.job_id)
        if items is None:
            items = await _open_for(app, summary)
        epoch: int | None = None
        with contextlib.suppress(ApiError):
            status, _ = await ops.status(summary.job_id)
            epoch = status.epoch
        match = _MADE_ID.match(summary.job_id)
        return {
            **msgspec.to_builtins(summary),
            "name": match.group("name") if match else summary.job_id,
            "cluster": None if created is None else created.cluster,
            "created_at": None if created is None else created.at,
            "age_s": None if created is None else (now - created.at).total_seconds(),
            "epoch": epoch,
            "open_escalations": [i["id"] for i in items],
        }

    rendered = await _gather([row(s) for s in page])
    return _json(
        {
            "total": len(rows),
            "offset": offset,
            "limit": limit,
            "clusters": ops.clusters,
            "jobs": rendered,
            "unreadable": unreadable,
        }
    )


async def _inbox(request: web.Request) -> web.Response:
    """Open escalations and held jobs, most severe first, then oldest first."""
    _actor(request)
    app = request.app
    ops = app[_OPS]
    job_id = request.query.get("job")
    if job_id is not None and not is_job_id(job_id):
        raise BadRequest(f"{job_id!r} is not a job id", field="job")
    if job_id is not None:  # one job (its page): its Status now, not the index's
        rows = [JobSummary.of((await ops.status(job_id))[0])]
    else:
        rows, _ = await app[_INDEX].jobs()
    candidates = [r for r in rows if r.hold is not None or not r.settled or r.state == "failed"]
    items = [i for group in await _gather([_open_for(app, r) for r in candidates]) for i in group]
    items.sort(key=lambda i: (SEVERITY_ORDER.get(i["severity"], 1), i["at"]))
    return _json({"items": items})


async def _preview(request: web.Request) -> web.Response:
    """A job file -> the body ``POST /v1/jobs`` takes and the plan it would get."""
    _actor(request)
    text = (await request.read()).decode(errors="replace")
    raw: object
    try:
        raw = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as err:
        raise BadRequest(f"the job file is not valid TOML (or JSON): {err}") from err
    if not isinstance(raw, dict):
        raise BadRequest("a job file is a table (TOML) or an object (JSON)")
    body = msgspec.json.encode(raw)
    req = decode_body(SubmitRequest, body)
    check_spec(req.spec)
    ops = request.app[_OPS]
    declarations = ops.declarations_of(req.spec.cluster)
    if declarations is None:
        known = ", ".join(ops.clusters) or "none is configured"
        raise BadRequest(
            f"unknown cluster {req.spec.cluster!r} (known: {known})",
            code="unknown-cluster",
            field="spec.cluster",
        )
    try:
        plan = make_plan(req.spec, req.policy, declarations)
    except InvalidPolicy as err:
        field = f"policy.rules[{err.rule}]" + (".on" if err.cause else "")
        raise BadRequest(str(err), code="invalid-policy", field=field) from err
    return _json({"body": raw, "plan": plan})


# --------------------------------------------------------------------------------- SSE


async def _pump(feed: Any, queue: asyncio.Queue[LatestEntry | None]) -> None:
    try:
        async for entry in feed:
            await queue.put(entry)
    except NatsStoreError as err:
        log.warning("web.changes_feed_failed", extra={"error": str(err)})
    finally:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)


async def _changes(request: web.Request) -> web.StreamResponse:
    """SSE (``event: job``) of each job's Status head (:class:`JobSummary`) as it changes."""
    _actor(request)
    ops = request.app[_OPS]
    queue: asyncio.Queue[LatestEntry | None] = asyncio.Queue(maxsize=4096)
    streams = request.app[_STREAMS]
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    streams.add(queue)
    try:
        async with ops.watch_changes() as feed:
            await response.prepare(request)
            await response.write(b": live\n\n")
            pump = asyncio.create_task(_pump(feed, queue))
            try:
                while True:
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        break
                    try:
                        entry = await asyncio.wait_for(queue.get(), _HEARTBEAT_S)
                    except TimeoutError:
                        await response.write(b": heartbeat\n\n")
                        continue
                    if entry is None:
                        break
                    try:
                        status = decode(entry.payload, Status)
                    except DecodeError:
                        continue
                    data = encode(JobSummary.of(status))
                    await response.write(b"event: job\ndata: " + data + b"\n\n")
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
    except ConnectionResetError:
        log.debug("web.changes_client_gone")
    finally:
        streams.discard(queue)
    return response


async def _close_streams(app: web.Application) -> None:
    await app[_INDEX].close()
    queues = app[_STREAMS]
    for queue in tuple(queues):
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)


def mount(app: web.Application, ops: Operations, auth: Authenticator) -> None:
    """Add the web page's routes (package docstring) to the API's application ``app``."""
    app[_OPS] = ops
    app[_AUTH] = auth
    app[_CREATED] = {}
    app[_STREAMS] = set()
    app[_INDEX] = _Index(ops)
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/", _index)
    app.router.add_get("/ui/static/{name}", _asset)
    app.router.add_get("/ui/api/me", _me)
    app.router.add_get("/ui/api/jobs", _jobs)
    app.router.add_get("/ui/api/inbox", _inbox)
    app.router.add_get("/ui/api/changes", _changes)
    app.router.add_post("/ui/api/preview", _preview)

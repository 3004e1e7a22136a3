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
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
from aiohttp import web

from dispatch_core import (
    Actor,
    DecodeError,
    Job,
    State,
    Status,
    decode,
    encode,
    escalation_open,
    is_job_id,
    job_commands,
)
from dispatch_nats import LatestEntry
from services.api.auth import Authenticator
from services.api.errors import ApiError, BadRequest, NotFound, UnreadableRecord
from services.api.feeds import FeedQueue, serve_feed
from services.api.jobindex import parse_listing
from services.api.operations import Operations
from services.api.schemas import JobSummary
from services.api.web.escalations import HELD_NOTICE, SEVERITY_ORDER, EscalationInfo, describe

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
_MADE_ID: Final = re.compile(r"^(?P<name>.+)-[a-z2-7]{8}$")

_OPS: Final = web.AppKey("web_ops", Operations)
_AUTH: Final = web.AppKey("web_auth", Authenticator)
_STREAMS: Final[web.AppKey[set[FeedQueue]]] = web.AppKey("web_streams")


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


async def _cluster(app: web.Application, job_id: str) -> str | None:
    """The job's cluster, from the API's jobs index (a record is read once per job)."""
    facts = await app[_OPS].index.facts(job_id)
    return None if facts is None else facts.cluster


def _open_items(summary: JobSummary, job: Job | None, cluster: str | None) -> list[dict[str, Any]]:
    """The escalations of one job still waiting for a person (the core's
    :func:`~dispatch_core.escalations.escalation_open`, as ``dispatch escalations``), and
    its hold as the notifier's ``held:<i>`` notice when no ``overdue:<i>`` stands for it.
    """
    out: list[dict[str, Any]] = []
    hold = summary.hold
    hold_kind = None if hold is None else hold.kind
    escalations = () if job is None else job.escalations
    abandoned = () if job is None else job.abandoned
    for esc in escalations:
        delivered = esc.delivered is not None
        if escalation_open(esc.id, delivered=delivered, job=summary, abandoned=abandoned):
            info = describe(esc.id, cluster=cluster, job_id=summary.job_id, hold_kind=hold_kind)
            out.append(_item(summary, esc.id, esc.at, esc.detail, info))
    if hold is not None and not any(i["id"] == f"overdue:{hold.instance}" for i in out):
        esc_id = f"{HELD_NOTICE}:{hold.instance}"
        detail = f"{hold.kind} hold by {hold.by.name}: {hold.reason}"
        info = describe(esc_id, cluster=cluster, job_id=summary.job_id, hold_kind=hold_kind)
        out.append(_item(summary, esc_id, hold.since, detail, info))
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


async def _job(ops: Operations, job_id: str) -> Job | None:
    try:
        return await ops.job(job_id)
    except UnreadableRecord:
        return None


def _may_wait(row: JobSummary) -> bool:
    """Whether a job's record is worth reading for open escalations (the listings read only
    these): held, not settled, or failed (a failure waits for a supersede). A settled job
    with an escalation not yet delivered is left to the notifier, which delivers it at once
    (``dispatch escalations`` lists it meanwhile): reading every settled record would make
    the inbox O(every job's record)."""
    return row.hold is not None or not row.settled or row.state == State.FAILED


async def _open_for(app: web.Application, summary: JobSummary) -> list[dict[str, Any]]:
    cluster = summary.cluster or await _cluster(app, summary.job_id)
    return _open_items(summary, await _job(app[_OPS], summary.job_id), cluster)


async def _gather(fns: list[Any], limit: int = 16) -> list[Any]:
    slots = asyncio.Semaphore(limit)

    async def one(fn: Any) -> Any:
        async with slots:
            return await fn

    return list(await asyncio.gather(*(one(f) for f in fns)))


# ------------------------------------------------------------------------------ routes


async def _me(request: web.Request) -> web.Response:
    actor = _actor(request)
    return _json({"name": actor.name, "kind": actor.kind})


async def _jobs(request: web.Request) -> web.Response:
    """One page of the jobs list (by id, as ``GET /v1/jobs``, from the same jobs index),
    with the total that match.

    Query: as ``GET /v1/jobs`` (``state``, ``cluster``, ``offset``, ``limit`` at most
    :data:`JOBS_PAGE_MAX`), and ``needs=person`` (a job with an open escalation or a hold
    in force: escalations live in the records, so this one reads the candidates').
    """
    _actor(request)
    app = request.app
    ops = app[_OPS]
    q = parse_listing(request.query, default_limit=JOBS_PAGE_DEFAULT, max_limit=JOBS_PAGE_MAX)
    offset, limit = q.offset, q.limit or JOBS_PAGE_DEFAULT
    needs = request.query.get("needs")
    if needs not in (None, "", "person"):
        raise BadRequest(f"needs must be 'person', got {needs!r}", field="needs")
    opens: dict[str, list[dict[str, Any]]] = {}
    if needs == "person":
        rows, unreadable = await ops.index.rows(q.states, q.clusters)
        candidates = [r for r in rows if _may_wait(r)]
        found = await _gather([_open_for(app, r) for r in candidates])
        for r, items in zip(candidates, found, strict=True):
            opens[r.job_id] = items
        rows = [r for r in rows if opens.get(r.job_id)]
        total = len(rows)
        page = await ops.index.with_facts(rows[offset : offset + limit])
    else:
        listing = await ops.list_jobs(q.states, clusters=q.clusters, offset=offset, limit=limit)
        page, total, unreadable = list(listing.jobs), listing.total, listing.unreadable
    now = datetime.now(UTC)

    async def row(summary: JobSummary) -> dict[str, Any]:
        items = opens.get(summary.job_id)
        if items is None:
            items = await _open_for(app, summary)
        epoch: int | None = None
        with contextlib.suppress(ApiError):
            status, _ = await ops.status(summary.job_id)
            epoch = status.epoch
        match = _MADE_ID.match(summary.job_id)
        created = summary.created_at
        return {
            **msgspec.to_builtins(summary),
            "name": match.group("name") if match else summary.job_id,
            "age_s": None if created is None else (now - created).total_seconds(),
            "epoch": epoch,
            "open_escalations": [i["id"] for i in items],
        }

    rendered = await _gather([row(s) for s in page])
    return _json(
        {
            "total": total,
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
    summary: JobSummary | None = None
    if job_id is not None:  # one job (its page): its Status now, not the index's
        summary = JobSummary.of((await ops.status(job_id))[0])
        candidates = [summary]
    else:
        rows, _ = await ops.index.rows()
        candidates = [r for r in rows if _may_wait(r)]
    items = [i for group in await _gather([_open_for(app, r) for r in candidates]) for i in group]
    items.sort(key=lambda i: (SEVERITY_ORDER.get(i["severity"], 1), i["at"]))
    if summary is None:
        return _json({"items": items})
    commands = job_commands(
        summary.state,
        settled=summary.settled,
        hold=None if summary.hold is None else summary.hold.kind,
        open_escalations=[i["id"] for i in items],
    )
    return _json({"items": items, "commands": commands})


async def _preview(request: web.Request) -> web.Response:
    """A job file -> the body ``POST /v1/jobs`` takes and the plan it would get.

    The body is checked as ``POST /v1/jobs`` checks it (:meth:`Operations.check_submission`):
    a file the preview accepts is one submit accepts, and a refusal is submit's own.
    """
    actor = _actor(request)
    text = (await request.read()).decode(errors="replace")
    raw: object
    try:
        raw = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as err:
        raise BadRequest(f"the job file is not valid TOML (or JSON): {err}") from err
    if not isinstance(raw, dict):
        raise BadRequest("a job file is a table (TOML) or an object (JSON)")
    checked = request.app[_OPS].check_submission(actor, msgspec.json.encode(raw))
    plan = checked.plan
    return _json({"body": raw, "plan": plan})


# --------------------------------------------------------------------------------- SSE


async def _changes(request: web.Request) -> web.StreamResponse:
    """SSE (``event: job``) of each job's Status head (:class:`JobSummary`) as it changes."""
    _actor(request)

    async def opening(response: web.StreamResponse, _queue: FeedQueue) -> bool:
        await response.write(b": live\n\n")
        return True

    def frame(entry: LatestEntry) -> bytes | None:
        try:
            status = decode(entry.payload, Status)
        except DecodeError:
            return None
        return b"event: job\ndata: " + encode(JobSummary.of(status)) + b"\n\n"

    return await serve_feed(
        request,
        request.app[_OPS].watch_changes(),
        frame,
        streams=request.app[_STREAMS],
        what="web.changes",
        heartbeat_s=_HEARTBEAT_S,
        queue_size=4096,
        opening=opening,
    )


def mount(
    app: web.Application, ops: Operations, auth: Authenticator, streams: set[FeedQueue]
) -> None:
    """Add the web page's routes (package docstring) to the API's application ``app``; its
    change streams join ``streams``, the API's open streams (all ended at shutdown)."""
    app[_OPS] = ops
    app[_AUTH] = auth
    app[_STREAMS] = streams
    app.router.add_get("/", _index)
    app.router.add_get("/ui/static/{name}", _asset)
    app.router.add_get("/ui/api/me", _me)
    app.router.add_get("/ui/api/jobs", _jobs)
    app.router.add_get("/ui/api/inbox", _inbox)
    app.router.add_get("/ui/api/changes", _changes)
    app.router.add_post("/ui/api/preview", _preview)

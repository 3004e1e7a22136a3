"""``dispatch status`` without a job: the jobs table with each job's cluster, age and latest
checkpoint, filtered by state and cluster, a page at a time.

``GET /v1/jobs`` answers every job's Status head, by id, filtered by state only; a job's
cluster, creation time and checkpoint root are in its record's first event (``job.created``).
So the listing filters by state at the API, then reads the record of each job it shows (one
``GET /v1/jobs/{job}/record`` per row, only for the rows of the page; with ``--cluster``,
until the page is full). Pages are keyset pages on the job id (the API's order): ``--after
JOB`` starts past JOB, and the table's last line names the next page's command.

A job whose record the API can't read (422 ``record-unreadable``) is never a reason for the
listing to fail: the API lists it apart (``unreadable``: the event at fault and why), and a
row it has from an earlier published Status is marked ``unreadable`` (that Status is stale):
the table shows its state as ``unreadable`` and :func:`unreadable_lines` says why.

The latest checkpoint is read from the job's checkpoint root (``spec.checkpoint``) when it
is a path this machine sees (the publication with the greatest epoch, then step:
``dispatch_ckpt``); an ``s3://`` root is not read (``s3``), a root this machine doesn't see
shows ``-``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from datetime import datetime

import msgspec

from dispatch_cli.client import ApiClient, JobSummary, UnreadableJob
from dispatch_cli.errors import ApiError
from dispatch_cli.render import cause_text, hold_brief, table
from dispatch_core import JobCreated, State

__all__ = [
    "JobRow",
    "Page",
    "age_text",
    "jobs_page",
    "latest_checkpoint",
    "rows_table",
    "unreadable_lines",
]


class JobRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the listing: the job's Status head and what its record says of it.

    Attributes:
        job: the Status head from ``GET /v1/jobs``.
        cluster: ``spec.cluster`` (None: the record has no ``job.created`` yet).
        created: when the job was created.
        checkpoint_root: ``spec.checkpoint``, with ``{job}`` expanded.
        latest_checkpoint: the latest published step (``"step 500"``), ``"none"`` when
            nothing is published, ``"s3"`` for a root not read, None when unknown.
    """

    job: JobSummary
    cluster: str | None = None
    created: datetime | None = None
    checkpoint_root: str | None = None
    latest_checkpoint: str | None = None


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """A page of the listing; ``next_after`` is the ``--after`` of the next page (None: the
    last page); ``unreadable``: the jobs whose record the API can't read (on the first page
    only, whatever the filters: each needs a person)."""

    jobs: tuple[JobRow, ...]
    next_after: str | None = None
    unreadable: tuple[UnreadableJob, ...] = ()


def latest_checkpoint(root: str | None) -> str | None:
    """The latest published step under ``root``, as shown in the table.

    Returns:
        ``"step N"``; ``"none"`` when nothing is published; ``"s3"`` for an ``s3://`` root
        (not read: it would take a request per job); ``"?"`` when the root can't be read
        (an entry that doesn't parse); None without a root or for a path this machine
        doesn't see.
    """
    if not root:
        return None
    if root.startswith("s3://"):
        return "s3"
    if not os.path.isdir(root):
        return None
    from dispatch_ckpt import Checkpoints
    from dispatch_ckpt.errors import CkptError

    try:
        latest = Checkpoints.open(root).latest()
    except (CkptError, OSError):
        return "?"
    return "none" if latest is None else f"step {latest.step}"


def _row(client: ApiClient, job: JobSummary, *, checkpoints: bool) -> JobRow:
    try:
        record = client.record(job.job_id)
    except ApiError as err:
        # Gone since the listing (404), or a record the API can't read (422
        # record-unreadable, issue 10 item 4): that job's row shows its Status head alone,
        # and the listing of every other job still answers; `dispatch status JOB` names the
        # job and the event the API could not read.
        if err.status in (404, 422):
            return JobRow(job=job)
        raise
    created = next((e.event for e in record.events if isinstance(e.event, JobCreated)), None)
    if created is None:
        return JobRow(job=job)
    root = created.spec.checkpoint
    return JobRow(
        job=job,
        cluster=created.spec.cluster,
        created=created.at,
        checkpoint_root=root,
        latest_checkpoint=latest_checkpoint(root) if checkpoints else None,
    )


def jobs_page(
    client: ApiClient,
    *,
    states: Collection[State] = (),
    clusters: Collection[str] = (),
    after: str | None = None,
    limit: int = 100,
    checkpoints: bool = True,
) -> Page:
    """Read one page of the listing.

    Args:
        client: the API.
        states: only jobs in one of these states (at the API); empty: all.
        clusters: only jobs on one of these clusters; empty: all.
        after: start past this job id (ids are in the API's order).
        limit: most rows (>= 1).
        checkpoints: read each job's latest checkpoint (see :func:`latest_checkpoint`).

    Raises:
        ApiError: the API refused or failed (a job deleted between the list and its record
            read is shown without its record, never an error).
    """
    listing = client.jobs([s.value for s in states] or None)
    candidates = [j for j in listing.jobs if after is None or j.job_id > after]
    unreadable = listing.unreadable if after is None else ()
    rows: list[JobRow] = []
    for i, job in enumerate(candidates):
        row = _row(client, job, checkpoints=checkpoints)
        if clusters and row.cluster not in clusters:
            continue
        rows.append(row)
        if len(rows) == limit:
            # With --cluster, the jobs left may all be on other clusters: the next page then
            # says "no jobs" (reading their records now would cost what paging saves).
            more = i + 1 < len(candidates)
            return Page(
                jobs=tuple(rows),
                next_after=job.job_id if more else None,
                unreadable=unreadable,
            )
    return Page(jobs=tuple(rows), unreadable=unreadable)


def age_text(created: datetime | None, now: datetime) -> str:
    """``45s``, ``12m``, ``3h``, ``2d`` (rounded down); ``-`` when unknown."""
    if created is None:
        return "-"
    seconds = max(0, int((now - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def rows_table(rows: Sequence[JobRow], now: datetime) -> str:
    """The jobs table: JOB STATE CAUSE CLUSTER AGE CHECKPOINT SUB HOLD SETTLED."""
    lines = []
    for row in rows:
        job = row.job
        lines.append(
            [
                job.job_id,
                "unreadable" if job.unreadable else job.state.value,
                (
                    f"record unreadable (last Status: {job.state.value})"
                    if job.unreadable
                    else cause_text(job.cause, detail=False)
                ),
                row.cluster or "-",
                age_text(row.created, now),
                row.latest_checkpoint or "-",
                "-" if job.submission is None else str(job.submission),
                hold_brief(job.hold),
                "yes" if job.settled else "no",
                f"superseded by {job.superseded_by}" if job.superseded_by else "",
            ]
        )
    headers = ["JOB", "STATE", "CAUSE", "CLUSTER", "AGE", "CHECKPOINT", "SUB", "HOLD", "SETTLED"]
    return table([*headers, ""], lines)


def unreadable_lines(unreadable: Sequence[UnreadableJob]) -> list[str]:
    """What the listings say of jobs whose record the API can't read: one line per job
    naming the event at fault and why, and what to do."""
    if not unreadable:
        return []
    lines = [f"unreadable: {u.job_id}: event seq {u.seq}: {u.message}" for u in unreadable]
    lines.append(
        "  (their reads answer 422 record-unreadable, exit 9; retrying won't help: a person "
        "must look at that event; every other job answers as usual)"
    )
    return lines

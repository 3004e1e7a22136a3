"""``dispatch status`` without a job: the jobs table with each job's cluster, age and latest
checkpoint, filtered by state and cluster, a page at a time.

``GET /v1/jobs`` filters (``state``, ``cluster``) and pages (``after``, ``limit``) at the API,
from its jobs index, and each row carries the job's cluster, creation time and checkpoint
root: the listing is one request whatever the number of jobs. Pages are keyset pages on the
job id (the API's order): ``--after JOB`` starts past JOB, and the table's last line names the
next page's command (the API's ``next_after``) and how many jobs are left.

A job whose record the API can't read is never a reason for the listing to fail: the API
lists it apart (``unreadable``: the event at fault and why), and a row it has from an earlier
published Status is marked ``unreadable`` (that Status is stale): the table shows its state
as ``unreadable`` and :func:`unreadable_lines` says why.

The latest checkpoint is read from the job's checkpoint root (``checkpoint``) when it is a
path this machine sees (the publication with the greatest epoch, then step:
``dispatch_ckpt``); an ``s3://`` root is not read (``s3``), a root this machine doesn't see
shows ``-``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from datetime import datetime

import msgspec

from dispatch_cli.client import ApiClient, JobSummary, UnreadableJob
from dispatch_cli.render import cause_text, hold_brief, table
from dispatch_core import State

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
        cluster: ``spec.cluster``, then ``->`` the current submission's cluster when a
            failover moved the job (``lab2->local``; None: no ``job.created`` yet).
        created: when the job was created.
        checkpoint_root: ``spec.checkpoint``, with ``{job}`` expanded.
        latest_checkpoint: the latest published step (``"step 500"``): as the cluster's
            observer last read it, else read here from a root this machine sees; ``"none"``
            when nothing is published, ``"s3"`` for a root not read, None when unknown.
    """

    job: JobSummary
    cluster: str | None = None
    created: datetime | None = None
    checkpoint_root: str | None = None
    latest_checkpoint: str | None = None


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """A page of the listing; ``next_after`` is the ``--after`` of the next page (None: the
    last page); ``total``: how many jobs match (past ``--after``); ``unreadable``: the jobs
    whose record the API can't read (on the first page only, whatever the filters: each
    needs a person)."""

    jobs: tuple[JobRow, ...]
    next_after: str | None = None
    total: int = 0
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


def _row(job: JobSummary, *, checkpoints: bool) -> JobRow:
    root = job.checkpoint
    if job.published_step is not None:  # read by the cluster's observer: any root, S3 too
        latest: str | None = f"step {job.published_step}"
    else:
        latest = latest_checkpoint(root) if checkpoints else None
    return JobRow(
        job=job,
        cluster=(
            f"{job.cluster}->{job.current_cluster}"
            if job.cluster is not None and job.current_cluster not in (None, job.cluster)
            else job.cluster
        ),
        created=job.created_at,
        checkpoint_root=root,
        latest_checkpoint=latest,
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
    """Read one page of the listing: one ``GET /v1/jobs``, filtered and paged by the API.

    Args:
        client: the API.
        states: only jobs in one of these states; empty: all.
        clusters: only jobs on one of these clusters; empty: all.
        after: start past this job id (ids are in the API's order).
        limit: most rows (>= 1).
        checkpoints: read each job's latest checkpoint (see :func:`latest_checkpoint`).

    Raises:
        ApiError: the API refused or failed.
    """
    listing = client.jobs(
        [s.value for s in states], clusters=list(clusters), after=after, limit=limit
    )
    return Page(
        jobs=tuple(_row(j, checkpoints=checkpoints) for j in listing.jobs),
        next_after=listing.next_after,
        total=listing.total,
        unreadable=listing.unreadable if after is None else (),
    )


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
    """The jobs table: JOB STATE CAUSE CLUSTER AGE CHECKPOINT SUB HOLD SETTLED SUPERSEDED.

    ``SUPERSEDED`` names the job that superseded this one (``-``: none), under its own header.
    """
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
                job.superseded_by or "-",
            ]
        )
    headers = ["JOB", "STATE", "CAUSE", "CLUSTER", "AGE", "CHECKPOINT", "SUB", "HOLD", "SETTLED"]
    return table([*headers, "SUPERSEDED"], lines)


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

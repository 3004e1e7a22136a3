"""Reading jobs' publications for progress-aware recovery (issue 14, part 1).

The observer of a cluster reads, where the cluster's storage is reachable, each job's ``pub/``
listing through ``dispatch_ckpt`` (POSIX or S3; seed 004: only the listing, never the
checkpoint itself) and reports the latest epoch and step in the job's Discovery
(``Discovery.publications``). Reads are batched per poll and bounded: at most ``per_poll``
jobs, ``concurrency`` listings at once, each through a thread (the stores are synchronous).
A root that can't be read is logged and reported as nothing read (``None``), never as
nothing published.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from typing import Final

from dispatch_ckpt import Checkpoints, CkptError
from dispatch_core import JobCreated, Publications, decode_event
from dispatch_core.constants import JOB_PLACEHOLDER

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PER_POLL",
    "PublicationReader",
    "RecordRoots",
    "RootOf",
]

log = logging.getLogger("dispatch.observer")

DEFAULT_PER_POLL: Final = 256
"""Most jobs whose ``pub/`` one poll lists (the rest wait for the next poll)."""

DEFAULT_CONCURRENCY: Final = 16
"""Most listings in flight at once."""

RootOf = Callable[[str], str | None]
"""A job's checkpoint root (``JobSpec.checkpoint``, ``{job}`` not yet replaced), or ``None``."""


class RecordRoots:
    """Each job's checkpoint root, from the first event of its record (``job.created``'s
    ``spec.checkpoint``), read once per job and kept; a read that fails is tried again at the
    next poll.

    Args:
        first_event: the job's first record event's payload, or ``None`` for an unknown job.
        concurrency: most reads at once.
    """

    def __init__(
        self,
        first_event: Callable[[str], Awaitable[bytes | None]],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        self._first_event = first_event
        self._concurrency = concurrency
        self._roots: dict[str, str | None] = {}

    def __call__(self, job_id: str) -> str | None:
        return self._roots.get(job_id)

    async def learn(self, job_ids: Iterable[str]) -> None:
        """Read the root of each job not known yet."""
        unknown = [j for j in dict.fromkeys(job_ids) if j not in self._roots]
        slots = asyncio.Semaphore(self._concurrency)

        async def one(job_id: str) -> None:
            async with slots:
                try:
                    payload = await self._first_event(job_id)
                except Exception as err:  # a store error: try again at the next poll
                    log.warning(
                        "observer.root_unreadable", extra={"job_id": job_id, "error": str(err)}
                    )
                    return
            if payload is None:
                return  # no record yet: the API may not have appended it
            event = decode_event(payload)
            self._roots[job_id] = event.spec.checkpoint if isinstance(event, JobCreated) else None

        await asyncio.gather(*(one(j) for j in unknown))


class PublicationReader:
    """Reads the latest publication of jobs' checkpoint roots, bounded per poll."""

    def __init__(
        self,
        root_of: RootOf,
        *,
        learn: Callable[[Iterable[str]], Awaitable[None]] | None = None,
        per_poll: int = DEFAULT_PER_POLL,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout_s: float = 10.0,
    ) -> None:
        """Read through ``root_of``.

        Args:
            root_of: each job's checkpoint root, or ``None`` for a job without one.
            learn: called with the jobs of a poll before ``root_of`` is asked about them
                (:meth:`RecordRoots.learn`).
            per_poll: most jobs read in one :meth:`read`.
            concurrency: most listings at once.
            timeout_s: on S3, the longest one request may take, in seconds.
        """
        self._root_of = root_of
        self._learn = learn
        self._per_poll = per_poll
        self._concurrency = concurrency
        self._timeout_s = timeout_s

    async def prepare(self, job_ids: Iterable[str]) -> None:
        """Learn the roots of ``job_ids`` (when a ``learn`` was given)."""
        if self._learn is not None:
            await self._learn(job_ids)

    def has_root(self, job_id: str) -> bool:
        """Whether the job has a checkpoint root to read."""
        return bool(self._root_of(job_id))

    async def read(self, job_ids: Iterable[str], now: datetime) -> Mapping[str, Publications]:
        """List ``pub/`` of each job (the first ``per_poll`` with a root), ``now`` the time
        of the reading; a job whose listing failed is left out."""
        wanted: list[tuple[str, str]] = []
        for job_id in dict.fromkeys(job_ids):
            root = self._root_of(job_id)
            if root:
                wanted.append((job_id, root.replace(JOB_PLACEHOLDER, job_id)))
            if len(wanted) >= self._per_poll:
                break
        slots = asyncio.Semaphore(self._concurrency)
        results = await asyncio.gather(*(self._one(job, root, now, slots) for job, root in wanted))
        return {job: pubs for (job, _), pubs in zip(wanted, results, strict=True) if pubs}

    async def _one(
        self, job_id: str, root: str, now: datetime, slots: asyncio.Semaphore
    ) -> Publications | None:
        async with slots:
            try:
                latest = await asyncio.to_thread(self._latest, root)
            except CkptError as err:
                log.warning(
                    "observer.publications_unreadable",
                    extra={"job_id": job_id, "root": root, "error": str(err)},
                )
                return None
        if latest is None:
            return Publications(read_at=now)
        return Publications(read_at=now, epoch=latest[0], step=latest[1])

    def _latest(self, root: str) -> tuple[int, int] | None:
        publication = Checkpoints.open(root, {}, timeout_s=self._timeout_s).latest()
        return None if publication is None else (publication.epoch, publication.step)

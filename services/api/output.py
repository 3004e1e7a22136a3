"""``GET /v1/jobs/{job}/logs``: an object's output, asked of its cluster's observer
(``dispatch logs``; issue 16 item 2).

Only the observer of a cluster holds that cluster's backend, so the API sends it an
:class:`~services.common.output.OutputRequest` on ``dispatch.logs.<cluster>`` (core NATS
request/reply; the reply comes to the API's own inbox) and streams the chunks it answers.

An *execution* is one submission N of the job: its output is the output of the latest object
launched for that submission (the job's current submission by default).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import nats.errors
from nats.aio.client import Client as NATS

from dispatch_backends import OUTPUT_CHUNK_LIMIT, OutputChunk, OutputStream
from dispatch_core import DecodeError, ObjectRef, decode, encode
from dispatch_core.job import Job
from dispatch_nats import Layout
from services.api.errors import ApiError, NotFound, StoreDown
from services.common.output import OutputErrorCode, OutputReply, OutputRequest

__all__ = ["OutputClient", "OutputUnsupported", "execution_object"]

log = logging.getLogger("services.api")

_POLL_S: Final = 1.0
"""Seconds between two reads of a live object's output that found nothing new."""


class OutputUnsupported(ApiError):
    """The cluster's backend can't read output (501)."""

    status = 501
    default_code = "unsupported"


def execution_object(job: Job, execution: int | None) -> tuple[int, ObjectRef] | None:
    """The execution (submission N) and the object whose output is its output: the latest
    object launched for submission ``execution`` (default: the latest object of the job), or
    ``None`` when there is none yet. Duplicates the record never launched are left out."""
    objects = [o for o in job.objects if not o.duplicate]
    if execution is not None:
        objects = [o for o in objects if o.submission == execution]
    if not objects:
        return None
    last = objects[-1]
    return last.submission, last.ref


class OutputClient:
    """Asks observers for output chunks over NATS."""

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        timeout_s: float = 30.0,
        poll_s: float = _POLL_S,
    ) -> None:
        """Ask on ``nc`` under ``layout``.

        Args:
            nc: the API's connection (its inbox prefix receives the replies).
            layout: subject names.
            timeout_s: seconds one request waits for the observer's answer.
            poll_s: seconds between two reads of a live object's output that found nothing
                new (``follow``).
        """
        self._nc = nc
        self._layout = layout
        self._timeout_s = timeout_s
        self.poll_s = poll_s

    async def read(
        self, ref: ObjectRef, stream: OutputStream, offset: int, limit: int = OUTPUT_CHUNK_LIMIT
    ) -> OutputChunk:
        """One chunk of ``ref``'s ``stream`` from byte ``offset``, at most ``limit`` bytes.

        Raises:
            NotFound: the backend has no such object or keeps no output of it.
            OutputUnsupported: the cluster's backend can't read output.
            StoreDown: the observer did not answer (none runs, or it is busy), or could not
                read the output now.
        """
        request = OutputRequest(ref=ref, stream=stream, offset=offset, limit=limit)
        subject = self._layout.logs_subject(ref.cluster)
        try:
            msg = await self._nc.request(subject, encode(request), timeout=self._timeout_s)
        except nats.errors.NoRespondersError:
            raise StoreDown(
                f"no observer of cluster {ref.cluster!r} answers output requests"
            ) from None
        except (TimeoutError, nats.errors.TimeoutError):
            raise StoreDown(
                f"the observer of cluster {ref.cluster!r} did not answer within "
                f"{self._timeout_s:g} s"
            ) from None
        except nats.errors.Error as err:
            raise StoreDown(f"cannot ask the observer of {ref.cluster!r}: {err!r}") from None
        try:
            reply = decode(msg.data, OutputReply)
        except DecodeError as err:
            raise StoreDown(f"the observer of {ref.cluster!r} answered garbage: {err}") from None
        if reply.chunk is not None:
            return reply.chunk
        match reply.error:
            case OutputErrorCode.NOT_FOUND:
                raise NotFound(f"no output of {ref}: {reply.message}")
            case OutputErrorCode.UNSUPPORTED:
                raise OutputUnsupported(reply.message)
            case _:
                raise StoreDown(f"output of {ref} can't be read now: {reply.message}")

    async def chunks(
        self,
        ref: ObjectRef,
        stream: OutputStream,
        offset: int,
        *,
        follow: bool,
        limit: int | None = None,
        first: OutputChunk | None = None,
    ) -> AsyncIterator[OutputChunk]:
        """Yield the chunks of ``ref``'s ``stream`` from ``offset``: everything there is now,
        or (``follow``) until the object has ended and all of it was read. At most ``limit``
        bytes in all (``None``: no bound). ``first``: a chunk already read at ``offset``.

        When the output moves to a new place while it is read (its ``where`` changes: a
        Kubeflow TrainJob's JobSet restarted, and its new trainer pod keeps a new log), the
        new place is read from its start: the offset reached was the old place's.

        Raises:
            NotFound, OutputUnsupported, StoreDown: as :meth:`read`.
        """
        left = limit
        chunk = first
        where = first.where if first is not None else None
        while True:
            if chunk is None:
                want = OUTPUT_CHUNK_LIMIT if left is None else min(left, OUTPUT_CHUNK_LIMIT)
                chunk = await self.read(ref, stream, offset, want)
                if where is not None and chunk.where != where and offset > 0:
                    where, offset, chunk = chunk.where, 0, None
                    continue
            where = chunk.where
            yield chunk
            offset = chunk.next_offset
            if left is not None:
                left -= len(chunk.data)
                if left <= 0:
                    return
            if chunk.next_offset < chunk.size and chunk.data:
                chunk = None  # more is there now
                continue
            if not follow or chunk.complete:
                return
            chunk = None
            await asyncio.sleep(self.poll_s)


async def wait_for_object(
    load: Callable[[], Awaitable[Job]],
    execution: int | None,
    poll_s: float,
    gone: Callable[[], bool] = lambda: False,
) -> tuple[int, ObjectRef] | None:
    """Poll the job's record until it has an object for ``execution`` (``None``: any), or
    the job has an outcome, or ``gone()`` (the client went away; then ``None``).

    Raises:
        NotFound: the job has no record.
    """
    while True:
        job = await load()
        found = execution_object(job, execution)
        if found is not None or job.outcome is not None or gone():
            return found
        await asyncio.sleep(poll_s)

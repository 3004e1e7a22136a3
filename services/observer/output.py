"""The observer's answers to output requests (``dispatch logs``; services/common/output.py).

The observer subscribes to its own cluster's ``dispatch.logs.<cluster>`` (its NATS identity
may subscribe to no other cluster's) and answers each request once, with a bounded chunk read
by its backend (``OutputReader``), or why there is none. Requests are answered concurrently,
at most ``_CONCURRENCY`` at once, each within ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from dispatch_backends import (
    Backend,
    BackendError,
    OutputNotFound,
    OutputReader,
    Unreachable,
)
from dispatch_core import DecodeError, decode, encode
from dispatch_nats import Layout
from services.common.output import OutputErrorCode, OutputReply, OutputRequest

__all__ = ["OutputServer"]

log = logging.getLogger("dispatch.observer")

_CONCURRENCY: Final = 16


class OutputServer:
    """Answers ``dispatch.logs.<cluster>`` with the backend's chunks."""

    def __init__(self, backend: Backend, nc: NATS, *, layout: Layout, timeout_s: float = 20.0):
        """Serve ``backend``'s output on ``nc`` under ``layout``.

        Args:
            backend: the cluster's backend (an ``OutputReader`` or not: one that isn't
                answers ``unsupported``).
            nc: the observer's connection.
            layout: subject names.
            timeout_s: seconds one read may take before it is answered ``unreachable``.
        """
        self._backend = backend
        self._cluster = backend.cluster
        self._nc = nc
        self._layout = layout
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        """Subscribe to the cluster's output requests.

        Raises:
            nats.errors.Error: the subscription failed.
        """
        self._sub = await self._nc.subscribe(
            self._layout.logs_subject(self._cluster), cb=self._on_request
        )

    async def aclose(self) -> None:
        """Stop answering; wait for the answers under way."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error as err:
                log.debug("observer.output_unsubscribe_failed", extra={"error": repr(err)})
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_request(self, msg: Msg) -> None:
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        async with self._slots:
            reply = await self.answer(msg.data)
        if not msg.reply:
            return
        try:
            await msg.respond(encode(reply))
        except nats.errors.Error as err:
            log.warning(
                "observer.output_reply_failed", extra={"cluster": self._cluster, "error": repr(err)}
            )

    async def answer(self, payload: bytes) -> OutputReply:
        """The answer to one encoded :class:`OutputRequest`."""
        try:
            request = decode(payload, OutputRequest)
        except DecodeError as err:
            return OutputReply(error=OutputErrorCode.INVALID, message=str(err))
        if request.ref.cluster != self._cluster:
            return OutputReply(
                error=OutputErrorCode.INVALID,
                message=f"object {request.ref} is not of cluster {self._cluster!r}",
            )
        if not isinstance(self._backend, OutputReader):
            return OutputReply(
                error=OutputErrorCode.UNSUPPORTED,
                message=f"cluster {self._cluster!r}: its backend can't read output",
            )
        try:
            async with asyncio.timeout(self._timeout_s):
                chunk = await self._backend.read_output(
                    request.ref, request.stream, request.offset, request.limit
                )
        except OutputNotFound as err:
            return OutputReply(error=OutputErrorCode.NOT_FOUND, message=str(err))
        except (Unreachable, TimeoutError) as err:
            detail = str(err) or f"cluster {self._cluster!r}: reading output timed out"
            return OutputReply(error=OutputErrorCode.UNREACHABLE, message=detail)
        except ValueError as err:
            return OutputReply(error=OutputErrorCode.INVALID, message=str(err))
        except BackendError as err:
            return OutputReply(error=OutputErrorCode.UNREACHABLE, message=str(err))
        except Exception as err:  # the request boundary: a bug must not stop the observer
            log.exception("observer.output_crashed", extra={"cluster": self._cluster})
            return OutputReply(
                error=OutputErrorCode.UNREACHABLE, message=f"{type(err).__name__}: {err}"
            )
        return OutputReply(chunk=chunk)

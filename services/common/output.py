"""The output request/reply between the API and an observer (``dispatch logs``).

Only the observer of a cluster holds that cluster's backend, so the API asks it, on
``dispatch.logs.<cluster>`` (core NATS request/reply, ``Layout.logs_subject``), for one
bounded chunk of an object's output; the observer answers with an :class:`OutputReply` (a
chunk, or why there is none). Both ends encode with ``dispatch_core.encode`` (the chunk's
bytes as base64).
"""

from __future__ import annotations

import enum

import msgspec

from dispatch_backends import OutputChunk, OutputStream
from dispatch_core import ObjectRef

__all__ = ["OutputErrorCode", "OutputReply", "OutputRequest"]


class OutputRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Read at most ``limit`` bytes of ``ref``'s ``stream`` from byte ``offset``."""

    ref: ObjectRef
    stream: OutputStream
    offset: int
    limit: int


class OutputErrorCode(enum.StrEnum):
    """Why an observer answered without a chunk."""

    NOT_FOUND = "not-found"
    """The backend has no such object, or keeps no output of it."""
    UNSUPPORTED = "unsupported"
    """The cluster's backend can't read output (not an ``OutputReader``)."""
    UNREACHABLE = "unreachable"
    """Where the output is could not be read now (retry later)."""
    INVALID = "invalid"
    """The request could not be decoded, or names another cluster's object."""


class OutputReply(msgspec.Struct, frozen=True, kw_only=True):
    """The observer's answer: ``chunk``, or ``error`` with ``message``."""

    chunk: OutputChunk | None = None
    error: OutputErrorCode | None = None
    message: str = ""

"""Errors of the API service: each one is an HTTP answer with a stable JSON body.

Every error answer has the body ``{"error": {"code", "message", "field"?}}``
(:class:`~services.api.schemas.ErrorBody`). ``code`` is a stable, machine-readable token (a
CLI switches on it); ``message`` is the sentence for a person; ``field`` names the request
field at fault, as a path (``spec.cluster``, ``policy.rules[0].on``), or the header
(``Idempotency-Key``) or query parameter (``state``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar, Final

import msgspec

__all__ = [
    "ApiError",
    "BadRequest",
    "Busy",
    "Forbidden",
    "NotFound",
    "RefusedCommand",
    "StoreDown",
    "Unauthorized",
    "UnreadableRecord",
    "accepted_values",
    "field_of",
]


class ApiError(Exception):
    """Root of the API service's errors: an HTTP status with a code, a message and a field.

    Attributes:
        status: the HTTP status.
        code: the stable error code.
        message: the sentence for a person.
        field: the request field (path), header or query parameter at fault, if one is.
    """

    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal"
    job_id: str | None = None
    """The job whose record is at fault (``record-unreadable`` only)."""
    seq: int | None = None
    """The seq of the record's event at fault (``record-unreadable`` only)."""

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field


class BadRequest(ApiError):
    """A malformed request: a body that isn't the operation's JSON, a bad header or query."""

    status: ClassVar[int] = 400
    default_code: ClassVar[str] = "invalid"


class Unauthorized(ApiError):
    """No bearer token, or one the tokens file doesn't hold; nothing is recorded."""

    status: ClassVar[int] = 401
    default_code: ClassVar[str] = "unauthorized"


class Forbidden(ApiError):
    """The actor may not do this (only a human may abandon)."""

    status: ClassVar[int] = 403
    default_code: ClassVar[str] = "forbidden"


class NotFound(ApiError):
    """No such job (or route)."""

    status: ClassVar[int] = 404
    default_code: ClassVar[str] = "not-found"


class RefusedCommand(ApiError):
    """The record doesn't allow the command now; the message is the core's reason."""

    status: ClassVar[int] = 409
    default_code: ClassVar[str] = "refused"


class IdempotencyKeyReused(ApiError):
    """An ``Idempotency-Key`` given again with a request that differs from the one it first
    committed: answering the first one's result would hide that the new one was never done."""

    status: ClassVar[int] = 409
    default_code: ClassVar[str] = "idempotency-key-reused"

    def __init__(self, key: str, job_id: str, command: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was first used for a different {command} of job "
            f"{job_id!r}; a retry must repeat the same request (use a new key for a new one)",
            field="Idempotency-Key",
        )
        self.key = key


class UnreadableRecord(ApiError):
    """The job's record holds an event that can't be read: it does not decode, or its writer
    may not write it (issue 10, "Poison contained"). Only this job's reads and commands
    answer it; listings go on and list the job apart (``unreadable``).

    422 (Unprocessable Content): the request names a job the API can't process, and trying
    again won't change that (a person must look at the record); a 5xx would say the API
    itself failed and invite retries. The body's ``job_id`` and ``seq`` name the event.
    """

    status: ClassVar[int] = 422
    default_code: ClassVar[str] = "record-unreadable"

    def __init__(self, job_id: str, seq: int, message: str) -> None:
        super().__init__(message)
        self.job_id, self.seq = job_id, seq


class Busy(ApiError):
    """The command lost the race to other writers every time it was decided again."""

    status: ClassVar[int] = 503
    default_code: ClassVar[str] = "busy"


class StoreDown(ApiError):
    """NATS didn't answer, or an append's outcome stayed unknown: retry (with the same
    ``Idempotency-Key`` for a command)."""

    status: ClassVar[int] = 503
    default_code: ClassVar[str] = "unavailable"


_AT: Final = re.compile(r" - at `\$(?P<path>[^`]*)`")
_NAMED: Final = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]+)`")


def field_of(message: str) -> str | None:
    """Return the field a msgspec (or ``dispatch_core`` codec) message is about, as a path.

    ``Expected `int`, got `str` - at `$.spec.max_launch_attempts``` gives
    ``spec.max_launch_attempts``; ``Object missing required field `spec``` gives ``spec``;
    ``Object contains unknown field `x` - at `$.policy``` gives ``policy.x``.

    Args:
        message: the error message.

    Returns:
        The path without the leading ``$.``, or ``None`` when the message is about the body
        as a whole.
    """
    at = _AT.search(message)
    path = at["path"] if at else ""
    named = _NAMED.search(message)
    if named:
        path = f"{path}.{named['name']}"
    path = path.removeprefix(".")
    return path or None


_ENUM: Final = re.compile(
    r"^Invalid enum value .* - at (?:`(?P<key>key)` in )?`\$(?P<path>[^`]*)`$", re.DOTALL
)
_STEP: Final = re.compile(r"\.(?P<name>[^.\[]+)|\[(?P<index>[^\]]*)\]")


def accepted_values(message: str, root: Any) -> tuple[str, ...] | None:
    """Return the values an enum field accepts, when ``message`` is msgspec's refusal of a
    value it doesn't have (``Invalid enum value 'preemptd' - at `$.policy.rules[0].on[0]```).

    msgspec names the path but not the values; the field's type, found by following the path
    from ``root`` (the type that was decoded) through structs, collections, dicts and unions,
    has them: an ``Enum``'s values (the names on the wire) or a ``Literal``'s.

    Args:
        message: the ``ValidationError``'s message.
        root: the type decoded.

    Returns:
        The accepted values, in the type's order; ``None`` when the message isn't about an
        enum value, or the path doesn't lead to exactly one enum.
    """
    match = _ENUM.match(message)
    if match is None:
        return None
    types: list[msgspec.inspect.Type] = [msgspec.inspect.type_info(root)]
    for step in _STEP.finditer(match["path"]):
        types = [t for parent in types for t in _step(parent, step["name"], step["index"])]
    if match["key"]:
        types = [
            t.key_type
            for parent in types
            for t in _members(parent)
            if isinstance(t, msgspec.inspect.DictType)
        ]
    found = {values for t in types for m in _members(t) if (values := _values(m)) is not None}
    return found.pop() if len(found) == 1 else None


def _members(t: msgspec.inspect.Type) -> Iterator[msgspec.inspect.Type]:
    """``t`` without its constraints, and each member of a union."""
    while isinstance(t, msgspec.inspect.Metadata):
        t = t.type
    if isinstance(t, msgspec.inspect.UnionType):
        for member in t.types:
            yield from _members(member)
    else:
        yield t


def _step(
    t: msgspec.inspect.Type, name: str | None, index: str | None
) -> Iterator[msgspec.inspect.Type]:
    """The types one step of a msgspec error path (``.name`` or ``[i]``) leads to from ``t``."""
    for m in _members(t):
        if name is not None:
            fields = getattr(m, "fields", ())
            yield from (f.type for f in fields if f.encode_name == name)
        elif isinstance(m, msgspec.inspect.CollectionType):
            yield m.item_type
        elif isinstance(m, msgspec.inspect.TupleType) and (index or "").isdigit():
            if int(index or 0) < len(m.item_types):
                yield m.item_types[int(index or 0)]
        elif isinstance(m, msgspec.inspect.DictType):
            yield m.value_type


def _values(t: msgspec.inspect.Type) -> tuple[str, ...] | None:
    if isinstance(t, msgspec.inspect.EnumType):
        return tuple(str(member.value) for member in t.cls)
    if isinstance(t, msgspec.inspect.LiteralType):
        return tuple(str(value) for value in t.values)
    return None

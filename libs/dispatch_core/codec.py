"""JSON encoding and decoding of the core's types (seed 000, "Refusing what it doesn't
understand").

Every enum goes on the wire as its name (its ``StrEnum`` value is the seed's spelling), and
decoding refuses a name it doesn't know, an event type it doesn't know, or a value of the
wrong type with a :class:`~dispatch_core.errors.DecodeError` naming the value and its path:
a record written by a newer build is refused, never misread.

Events tolerate fields they don't know (an old reader skips fields a newer writer added,
STYLE.md). Operator commands are API request bodies: a field no command has, at any depth,
is refused, so a typo never silently falls back to a default.

Decoders are built once, at import, for the types below; any other type gets a decoder built
on first use and kept.
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar, overload

import msgspec
import msgspec.inspect as mi

from dispatch_core.commands import (
    Abandon,
    Cancel,
    EmergencyStop,
    GiveUp,
    HoldCommand,
    OperatorCommand,
    Release,
    Resubmit,
    Submit,
    Supersede,
)
from dispatch_core.errors import DecodeError, UndecodableEvent
from dispatch_core.events import JobEvent
from dispatch_core.job import Job, Status
from dispatch_core.state import (
    Declarations,
    Discovery,
    JobSpec,
    ObservedObject,
    Plan,
    RecoveryPolicy,
)
from dispatch_core.steps import AnyStep

__all__ = [
    "AnyStep",
    "decode",
    "decode_command",
    "decode_event",
    "decode_record_event",
    "decode_step",
    "encode",
]

T = TypeVar("T")

_COMMAND_TYPES: Final[tuple[Any, ...]] = (
    OperatorCommand,
    Submit,
    HoldCommand,
    Release,
    Resubmit,
    Cancel,
    GiveUp,
    Abandon,
    Supersede,
    EmergencyStop,
)

# Deterministic order sorts sets and dict keys, so the same value always encodes to the same
# bytes (a frozenset's iteration order depends on the process's hash seed).
_ENCODER: Final = msgspec.json.Encoder(order="deterministic")

_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (
        JobEvent,
        Discovery,
        ObservedObject,
        Status,
        Job,
        AnyStep,
        Plan,
        RecoveryPolicy,
        JobSpec,
        Declarations,
        *_COMMAND_TYPES,
    )
}

# For the request bodies: the type info walked to find fields no command has.
_STRICT: Final[dict[Any, mi.Type]] = {t: mi.type_info(t) for t in _COMMAND_TYPES}

_TAG_ERROR: Final = re.compile(
    r"^Invalid value (?P<value>.+) - at `\$\.(?P<field>type|command|step)`$"
)
_TAG_KIND: Final = {"type": "event type", "command": "command", "step": "step"}


def encode(obj: object) -> bytes:
    """Encode ``obj`` (any core type) as JSON bytes; enums by name, datetimes as RFC 3339."""
    return _ENCODER.encode(obj)


@overload
def decode(data: bytes | str, type_: type[T]) -> T: ...


@overload
def decode(data: bytes | str, type_: Any) -> Any: ...


def decode(data: bytes | str, type_: Any) -> Any:
    """Decode JSON ``data`` as ``type_``.

    Args:
        data: the JSON text.
        type_: a core type, or a union of them (``JobEvent``, ``OperatorCommand``,
            ``AnyStep``); prefer :func:`decode_event`, :func:`decode_command` and
            :func:`decode_step` for the unions, which are typed.

    Returns:
        The decoded value.

    Raises:
        DecodeError: ``data`` isn't valid JSON for ``type_``: an unknown enum name, an
            unknown event type, a value of the wrong type, a missing field, or (commands only)
            a field the command doesn't have. The message names the value and its path.
    """
    decoder = _DECODERS.get(type_)
    if decoder is None:
        decoder = _DECODERS.setdefault(type_, msgspec.json.Decoder(type_))
    try:
        value = decoder.decode(data)
    except msgspec.DecodeError as err:
        raise DecodeError(_name(type_), _detail(str(err))) from err
    strict = _STRICT.get(type_)
    if strict is not None:
        unknown = _unknown_field(msgspec.json.decode(data), strict, "$")
        if unknown is not None:
            raise DecodeError(_name(type_), f"Object contains unknown field - at `{unknown}`")
    return value


def decode_event(data: bytes | str) -> JobEvent:
    """Decode one record event (see :func:`decode`)."""
    result: JobEvent = decode(data, JobEvent)
    return result


def decode_record_event(data: bytes | str, *, job_id: str, seq: int) -> JobEvent:
    """Decode the event at ``seq`` of ``job_id``'s record (see :func:`decode`).

    Raises:
        UndecodableEvent: it doesn't decode; the message names the job, the seq and why
            (issue 10: an unreadable event is that job's problem, never another job's).
    """
    try:
        return decode_event(data)
    except DecodeError as err:
        raise UndecodableEvent(job_id, seq, err.detail) from err


def decode_command(data: bytes | str) -> OperatorCommand:
    """Decode one operator command, refusing unknown fields (see :func:`decode`)."""
    result: OperatorCommand = decode(data, OperatorCommand)
    return result


def decode_step(data: bytes | str) -> AnyStep:
    """Decode one planner step (see :func:`decode`)."""
    result: AnyStep = decode(data, AnyStep)
    return result


def _name(type_: Any) -> str:
    if type_ is JobEvent:
        return "event"
    if type_ is OperatorCommand:
        return "command"
    if type_ is AnyStep:
        return "step"
    return getattr(type_, "__name__", None) or str(type_)


def _detail(message: str) -> str:
    """msgspec's message, saying so when the unknown value is a union's tag."""
    match = _TAG_ERROR.match(message)
    if match is None:
        return message
    return f"unknown {_TAG_KIND[match['field']]} {match['value']} ({message})"


def _unknown_field(raw: Any, info: mi.Type, path: str) -> str | None:
    """Return the path of the first field in ``raw`` that ``info`` doesn't have, or None.

    ``raw`` already decoded as ``info`` (so its shape is right); only extra keys are sought.
    """
    match info:
        case mi.Metadata():
            return _unknown_field(raw, info.type, path)
        case mi.StructType():
            if not isinstance(raw, dict):
                return None
            fields = {f.encode_name: f for f in info.fields}
            for key, value in raw.items():
                if key == info.tag_field:
                    continue
                field = fields.get(key)
                if field is None:
                    return f"{path}.{key}"
                found = _unknown_field(value, field.type, f"{path}.{key}")
                if found is not None:
                    return found
            return None
        case mi.UnionType():
            for member in info.types:
                if _fits(raw, member):
                    return _unknown_field(raw, member, path)
            return None
        case mi.CollectionType():
            if isinstance(raw, list):
                for i, item in enumerate(raw):
                    found = _unknown_field(item, info.item_type, f"{path}[{i}]")
                    if found is not None:
                        return found
            return None
        case mi.DictType():
            if isinstance(raw, dict):
                for key, item in raw.items():
                    found = _unknown_field(item, info.value_type, f"{path}.{key}")
                    if found is not None:
                        return found
            return None
        case _:
            return None


def _fits(raw: Any, member: mi.Type) -> bool:
    """Whether ``raw`` is the value of this member of a union (by tag, or by JSON shape)."""
    if isinstance(member, mi.StructType):
        if member.tag_field is not None:
            return isinstance(raw, dict) and raw.get(member.tag_field) == member.tag
        return isinstance(raw, dict)
    if isinstance(member, mi.DictType):
        return isinstance(raw, dict)
    return isinstance(raw, list) and isinstance(member, mi.CollectionType)

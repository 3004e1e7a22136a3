"""Errors raised by the pure core.

Every error is a subclass of :class:`DispatchError`. Messages say what failed, for
which object, and what was expected against what was found. ``retryable`` tells a
service shell whether to retry (``nak``) or give up on a message (``term``).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "DecodeError",
    "DispatchError",
    "EpochOutOfRange",
    "InvalidPolicy",
    "InvalidSpec",
    "MalformedRecord",
    "OutOfOrderEvent",
    "Refused",
    "UndecodableEvent",
    "WriterRefused",
]


class DispatchError(Exception):
    """Root of every error raised by ``dispatch_core``."""

    retryable: ClassVar[bool] = False


class EpochOutOfRange(DispatchError, ValueError):
    """A component of ``DISPATCH_EPOCH`` is outside its bounds (seed 004, "The epoch").

    Attributes:
        component: ``"generation"``, ``"submission"`` or ``"restart"``.
        value: the value given.
        low, high: the inclusive bounds.
    """

    def __init__(self, component: str, value: int, low: int, high: int) -> None:
        super().__init__(f"epoch: {component} {value} is outside {low}..{high}")
        self.component, self.value, self.low, self.high = component, value, low, high


class DecodeError(DispatchError, ValueError):
    """Bytes that don't decode as the expected type.

    Raised for an unknown enum name, an unknown event type, or a malformed payload,
    never answered with a default (seed 000, "Refusing what it doesn't understand").
    The message is msgspec's path-qualified one, e.g.
    ``Invalid enum value 'evicted' - at `$.cause.kind```.
    """

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"cannot decode {what}: {detail}")
        self.what, self.detail = what, detail


class MalformedRecord(DispatchError):
    """A job's record is not a valid history (first event not a creation, an event
    for another job, an event after the record's end)."""

    def __init__(self, job_id: str, seq: int, problem: str) -> None:
        super().__init__(f"record of job {job_id!r}, event seq {seq}: {problem}")
        self.job_id, self.seq, self.problem = job_id, seq, problem


class OutOfOrderEvent(MalformedRecord):
    """An event's stream sequence is not after the previous one's."""

    def __init__(self, job_id: str, last_seq: int, got: int) -> None:
        super().__init__(job_id, got, f"sequence {got} is not after {last_seq}")
        self.last_seq, self.got = last_seq, got


class WriterRefused(MalformedRecord):
    """An event appended by a kind of writer that may not write its type (DESIGN.md section 5,
    issue 10; the table is ``dispatch_core.writers.WRITERS``): a notifier's operator command,
    a supervisor's job creation. The record is not one dispatch wrote, so ``fold`` refuses it.

    Attributes:
        event_type: the event's tag, e.g. ``cancel.requested``.
        writer: the kind of writer that appended it (``api``, ``supervisor``, ``notifier``).
        allowed: the kinds that may write it, sorted.
    """

    def __init__(
        self, job_id: str, seq: int, event_type: str, writer: str, allowed: tuple[str, ...]
    ) -> None:
        may = ", ".join(allowed) or "no writer"
        super().__init__(
            job_id,
            seq,
            f"{event_type} was appended by a {writer} writer, which may not write it "
            f"(may write it: {may})",
        )
        self.event_type, self.writer, self.allowed = event_type, writer, allowed


class UndecodableEvent(MalformedRecord):
    """An event of a job's record that does not decode (issue 10, "Poison contained"): that
    job's reads fail with this error, naming the job and the sequence; no other job's do.

    Attributes:
        detail: the decoder's message (the value and its path).
    """

    def __init__(self, job_id: str, seq: int, detail: str) -> None:
        super().__init__(job_id, seq, f"the event does not decode: {detail}")
        self.detail = detail


class InvalidPolicy(DispatchError, ValueError):
    """A recovery policy that ``validate`` refuses (seed 000, "Recovery rules").

    Attributes:
        rule: index of the offending rule in ``policy.rules``.
        cause: the cause kind that makes it illegal, when one does.
        reason: the sentence explaining the refusal.
    """

    def __init__(self, rule: int, cause: str | None, reason: str) -> None:
        where = f"rule {rule}" + (f", cause {cause!r}" if cause else "")
        super().__init__(f"invalid recovery policy: {where}: {reason}")
        self.rule, self.cause, self.reason = rule, cause, reason


class InvalidSpec(DispatchError, ValueError):
    """A job spec whose limits the planner can't work with (a duration that isn't a positive,
    finite number of seconds it can add to a time, or launch attempts out of bounds).

    Attributes:
        field: the spec field, e.g. ``"unresolved_age_s"``.
        reason: the sentence explaining the refusal.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid job spec: {field}: {reason}")
        self.field, self.reason = field, reason


class Refused(DispatchError):
    """An operator command the record doesn't allow now (seed 002).

    ``reason`` is the sentence shown to the operator (the API answers 409 with it).
    """

    def __init__(self, job_id: str, command: str, reason: str) -> None:
        super().__init__(f"job {job_id!r}: {command} refused: {reason}")
        self.job_id, self.command, self.reason = job_id, command, reason

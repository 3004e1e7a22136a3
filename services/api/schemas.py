"""Request and response bodies of the HTTP API: msgspec Structs, the one source of both the
decoding and the OpenAPI document (:mod:`services.api.openapi`).

Request bodies refuse fields they don't have, at any depth (STYLE.md: a typo never falls
back to a default); a malformed body is a 400 naming the field (:func:`decode_body`,
:func:`strict_command`). Response bodies always carry every key (``null`` when empty), so a
thin client can index them without guessing; only :class:`ErrorDetail` omits ``field`` when
no field is at fault.

The core's types (``JobSpec``, ``RecoveryPolicy``, ``Plan``, ``Status``, the record's events)
travel as the core encodes them: enums by name, times as RFC 3339.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, TypeVar

import msgspec

from dispatch_core import (
    JOB_ID_PATTERN,
    MAX_HOLD_FOR_S,
    MAX_LAUNCH_ATTEMPTS,
    AbandonTarget,
    Cause,
    DecodeError,
    HoldView,
    InvalidSpec,
    JobEvent,
    JobSpec,
    OperatorCommand,
    Plan,
    RecoveryPolicy,
    State,
    Status,
    UtcDatetime,
    WriterKind,
    decode_command,
    validate_spec,
)
from services.api.errors import BadRequest, field_of

__all__ = [
    "COMMAND_REQUESTS",
    "MAX_LAUNCH_ATTEMPTS",
    "NAME_PATTERN",
    "SPEC_LIMITS",
    "AbandonRequest",
    "CommandResponse",
    "ErrorBody",
    "ErrorDetail",
    "EscalationList",
    "EscalationView",
    "HoldRequest",
    "JobId",
    "JobList",
    "JobSummary",
    "ReasonRequest",
    "RecordResponse",
    "RecordedEvent",
    "SubmitRequest",
    "SubmitResponse",
    "SupersedeRequest",
    "check_spec",
    "decode_body",
    "strict_command",
]

T = TypeVar("T")

JobId = Annotated[str, msgspec.Meta(pattern=JOB_ID_PATTERN, max_length=63)]
"""A job id: 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or
digit (``dispatch_core.is_job_id``)."""

NAME_PATTERN: Final = r"^[a-z0-9](?:[a-z0-9-]{0,52}[a-z0-9])?$"
"""A name the API makes a job id from (``<name>-<8 random characters>``): a job id of at
most 54 characters, so the whole id stays within 63."""

Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=54)]

Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
"""Why the actor gives the command, in their words: required, recorded with the command."""

OptionalReason = Annotated[str, msgspec.Meta(max_length=4096)]

HoldFor = Annotated[float, msgspec.Meta(gt=0, le=MAX_HOLD_FOR_S)]

SPEC_LIMITS: Final[dict[str, tuple[float, float]]] = {
    "unresolved_age_s": (0.0, MAX_HOLD_FOR_S),
    "cleanup_deadline_s": (0.0, MAX_HOLD_FOR_S),
    "stop_overdue_s": (0.0, MAX_HOLD_FOR_S),
}
"""Durations of a ``JobSpec`` the core accepts (``validate_spec``): greater than the first
bound, at most the second; shown in the OpenAPI document."""


# ------------------------------------------------------------------------------ requests


class SubmitRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/jobs``: submit a job.

    Attributes:
        spec: what to run, and where (``spec.cluster`` must be a cluster the API knows).
        policy: the recovery rules; none by default (every cause is then uncovered).
        job_id: the job's id; by default the API makes one, ``<name>-<8 random characters>``.
        name: the prefix of the id the API makes (``job`` by default); ignored with
            ``job_id``.
        reason: why it is submitted (optional).
    """

    spec: JobSpec
    policy: RecoveryPolicy = msgspec.field(default_factory=RecoveryPolicy)
    job_id: JobId | None = None
    name: Name | None = None
    reason: OptionalReason = ""


class ReasonRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``release``, ``resubmit``, ``cancel``, ``give-up`` and ``emergency-stop``.

    Attributes:
        reason: why, in the actor's words (required).
    """

    reason: Reason


class HoldRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``hold``.

    Attributes:
        reason: why, in the actor's words (required).
        for_s: seconds until the hold is overdue (escalated ``overdue:<instance>``; it
            stays in force until released).
    """

    reason: Reason
    for_s: HoldFor = 86400.0


class AbandonRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``abandon`` (a human actor only).

    Attributes:
        reason: why, in the actor's words (required).
        target: exactly one of ``{"submission": N}`` (an all-unknown submission),
            ``{"submission": N, "attempt": a}`` (an unmatched attempt) or
            ``{"foreign": {"cluster": ..., "id": ...}}`` (a foreign object).
    """

    reason: Reason
    target: AbandonTarget


class SupersedeRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``supersede``: a new job from this finished one.

    Attributes:
        reason: why, in the actor's words (required).
        new_job_id: the new job's id; by default the API makes one,
            ``<name>-<8 random characters>``.
        name: the prefix of the id the API makes (by default the old job's id, cut to 54
            characters); ignored with ``new_job_id``.
    """

    reason: Reason
    new_job_id: JobId | None = None
    name: Name | None = None


COMMAND_REQUESTS: Final[dict[str, type[msgspec.Struct]]] = {
    "hold": HoldRequest,
    "release": ReasonRequest,
    "resubmit": ReasonRequest,
    "cancel": ReasonRequest,
    "give-up": ReasonRequest,
    "abandon": AbandonRequest,
    "supersede": SupersedeRequest,
    "emergency-stop": ReasonRequest,
}
"""The operator commands of seed 002, by their path segment (= the core command's tag)."""


# ----------------------------------------------------------------------------- responses


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What went wrong.

    Attributes:
        code: a stable token: ``invalid``, ``invalid-policy``, ``unknown-cluster``,
            ``unauthorized``, ``forbidden``, ``not-found``, ``method-not-allowed``,
            ``too-large``, ``refused``, ``record-unreadable``, ``busy``, ``unavailable``,
            ``internal``.
        message: the sentence for a person (for ``refused``, the core's reason).
        field: the request field at fault as a path (``spec.cluster``,
            ``policy.rules[0].on[1]``), or the header or query parameter; absent when the
            error isn't about one field.
        job_id: for ``record-unreadable``, the job whose record can't be read.
        seq: for ``record-unreadable``, the seq of the event that can't be read.
    """

    code: str
    message: str
    field: str | None = None
    job_id: str | None = None
    seq: int | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every error answer: ``{"error": {"code", "message", "field"?}}``."""

    error: ErrorDetail


class RecordedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event of a job's record.

    Attributes:
        seq: its place in the record (the JetStream stream sequence; increasing, with gaps).
        event: the event, tagged by ``type`` (its ``at`` is when it was decided).
        writer: the kind of writer that appended it (``api``, ``supervisor``, ``notifier``;
            contract v2's record subject says which).
    """

    seq: int
    event: JobEvent
    writer: WriterKind


class SubmitResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a submission (201).

    Attributes:
        job_id: the job's id (the one given, or the one the API made).
        seq: the record seq of its creation.
        plan: how it will be recovered: ``uncovered`` lists the causes no rule covers,
            ``substitutions`` the rules the plan changed and why, ``rules[i].unenforced``
            a rule nobody enforces.
        status: its status right after creation (pending).
        replayed: whether this answers a retry of an earlier request with the same
            ``Idempotency-Key`` (nothing new was recorded).
    """

    job_id: str
    seq: int
    plan: Plan
    status: Status
    replayed: bool = False


class CommandResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to an operator command (200; 201 for ``supersede``).

    Attributes:
        job_id: the job the command was given to.
        command: the command (``hold``, ``release``, ...).
        seq: the record seq of the last event it committed to the job's record.
        events: the events it committed to the job's record, in order.
        status: the job's status right after the command (projected by the API from the
            record and the latest Discovery; the supervisor's next pass may add to it).
        new_job_id: ``supersede`` only: the new job's id.
        plan: ``supersede`` only: the new job's plan.
        replayed: whether this answers a retry of an earlier request with the same
            ``Idempotency-Key`` (nothing new was recorded).
    """

    job_id: str
    command: str
    seq: int
    events: tuple[RecordedEvent, ...]
    status: Status
    new_job_id: str | None = None
    plan: Plan | None = None
    replayed: bool = False


class RecordResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/jobs/{job}/record``: the job's events after ``after`` (all by default)."""

    job_id: str
    events: tuple[RecordedEvent, ...]


class JobSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One job of a listing: the head of its Status.

    Attributes:
        job_id, state, cause, at, seq, settled, hold, submission, supersedes,
        superseded_by: as in :class:`~dispatch_core.Status`.
        unreadable: the job's record can't be read past this Status (an event after
            ``seq`` does not decode, or its writer may not write it): the Status is the
            last one published before, stale; the listing's ``unreadable`` names the event.
        cluster: ``spec.cluster`` (None: not known, e.g. the record can't be read).
        current_cluster: the current submission's cluster, ``Status.cluster`` (after a
            failover not ``cluster``; None: no submission yet, or not known).
        created_at: when the job was created (None: not known).
        checkpoint: ``spec.checkpoint``, the job's checkpoint root (None: none or unknown).
        published_step, published_at: the latest step published under the root as the
            cluster's observer last read it, and when it read it (issue 14; None: not read
            yet, or nothing published).
    """

    job_id: str
    state: State
    cause: Cause
    at: UtcDatetime
    seq: int
    settled: bool
    hold: HoldView | None
    submission: int | None
    supersedes: str | None
    superseded_by: str | None
    unreadable: bool = False
    cluster: str | None = None
    created_at: UtcDatetime | None = None
    checkpoint: str | None = None
    published_step: int | None = None
    published_at: UtcDatetime | None = None
    current_cluster: str | None = None

    @classmethod
    def of(cls, status: Status, *, unreadable: bool = False) -> JobSummary:
        """Return the summary of ``status`` (``unreadable``: its record no longer reads)."""
        return cls(
            job_id=status.job_id,
            state=status.state,
            cause=status.cause,
            at=status.at,
            seq=status.seq,
            settled=status.settled,
            hold=status.hold,
            submission=status.submission,
            supersedes=status.supersedes,
            superseded_by=status.superseded_by,
            unreadable=unreadable,
            published_step=status.published_step,
            published_at=status.published_at,
            current_cluster=status.cluster,
        )


class UnreadableJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job whose record can't be read, listed apart by the listings (issue 10, "Poison
    contained"): its own reads answer 422 ``record-unreadable``.

    Attributes:
        job_id: the job.
        seq: the seq of the event that can't be read.
        message: why (it does not decode, or its writer may not write it).
    """

    job_id: str
    seq: int
    message: str


class JobList(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/jobs``: one page of the jobs matching the filters, by id; jobs whose record
    can't be read, apart.

    Attributes:
        jobs: the page (at most ``limit`` jobs from ``offset``, past ``after``).
        unreadable: every job whose record can't be read (whatever the filters and page:
            each needs a person).
        total: how many jobs match the filters (``state``, ``cluster``, ``after``), on
            every page.
        offset: the page's first job's place among them (0-based).
        limit: the page size asked for (None: every job).
        next_after: the ``after`` of the next page (the page's last job id), None on the
            last page.
    """

    jobs: tuple[JobSummary, ...]
    unreadable: tuple[UnreadableJob, ...] = ()
    total: int = 0
    offset: int = 0
    limit: int | None = None
    next_after: str | None = None


class EscalationView(msgspec.Struct, frozen=True, kw_only=True):
    """One escalation of one job (seed 002).

    Attributes:
        job_id: the job.
        id: unique per job; its prefix says what happened (``overdue:``, ``all-unknown:``,
            ``unmatched:``, ``foreign:``, ``admin-held:``, ``failed:``, ``refused:``,
            ``cleanup-deadline``, ``stop-overdue:``, ``give-up``).
        at: when it was committed.
        detail: the sentence for the person.
        delivered: when a channel accepted it; ``null`` while undelivered.
    """

    job_id: str
    id: str
    at: UtcDatetime
    detail: str
    delivered: UtcDatetime | None


class EscalationList(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/escalations``: escalations across jobs, oldest first; jobs whose record
    can't be read (so whose escalations can't be listed), apart."""

    escalations: tuple[EscalationView, ...]
    unreadable: tuple[UnreadableJob, ...] = ()


# ----------------------------------------------------------------------------- decoding

_REQUEST_TYPES: Final[tuple[type[msgspec.Struct], ...]] = (
    SubmitRequest,
    ReasonRequest,
    HoldRequest,
    AbandonRequest,
    SupersedeRequest,
)
_DECODERS: Final[dict[type[Any], msgspec.json.Decoder[Any]]] = {
    t: msgspec.json.Decoder(t) for t in _REQUEST_TYPES
}


def decode_body(type_: type[T], body: bytes) -> T:
    """Decode a request body as ``type_`` (an empty body is ``{}``).

    Raises:
        BadRequest: not JSON, not an object, a field of the wrong type or out of bounds, a
            missing field or one ``type_`` doesn't have; ``field`` names it.
    """
    decoder = _DECODERS.get(type_) or msgspec.json.Decoder(type_)
    try:
        value: T = decoder.decode(body if body.strip() else b"{}")
    except msgspec.ValidationError as err:
        raise BadRequest(f"invalid request body: {err}", field=field_of(str(err))) from err
    except msgspec.DecodeError as err:
        raise BadRequest(f"the request body is not JSON: {err}") from err
    return value


def strict_command(raw: dict[str, Any]) -> OperatorCommand:
    """Decode a command assembled from a request body with the core's codec, which refuses a
    field the command doesn't have at any depth (``spec.options`` keys aside).

    Args:
        raw: the command as JSON-able builtins, with its ``command`` tag and ``by``.

    Raises:
        BadRequest: the codec refused it; ``field`` names the path.
    """
    try:
        return decode_command(msgspec.json.encode(raw))
    except DecodeError as err:
        raise BadRequest(f"invalid request body: {err.detail}", field=field_of(err.detail)) from err


def check_spec(spec: JobSpec) -> None:
    """Refuse the spec values the planner can't carry out (the core's ``validate_spec``;
    :data:`SPEC_LIMITS` documents the same bounds in the OpenAPI document).

    Raises:
        BadRequest: a duration or the launch attempts out of bounds; ``field`` names it.
    """
    if not spec.command and not spec.script.strip():
        raise BadRequest(
            "spec has neither a command nor a script: there is nothing to run",
            field="spec.command",
        )
    try:
        validate_spec(spec)
    except InvalidSpec as err:
        raise BadRequest(str(err), field=f"spec.{err.field}") from err

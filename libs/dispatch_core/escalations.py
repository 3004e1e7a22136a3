"""The escalations dispatch commits: one table of kinds, their ids, severity, meaning, answers.

Seed 002, "Answer it by its id": "The id's prefix says what happened." An escalation id is
``<prefix>`` or ``<prefix>:<argument>``; the prefix is an :class:`EscalationKind` (its value is
the prefix, exactly as records already hold it), and the argument's shape is the kind's:

==================  ======================  ==========================================
kind                id                      argument
==================  ======================  ==========================================
overdue             ``overdue:<instance>``  the hold's instance, 1, 2, ...
all-unknown         ``all-unknown:<N>``     the submission
unmatched           ``unmatched:<N>/<a>``   the submission and the attempt
foreign             ``foreign:<object id>`` the object's id on its cluster
admin-held          ``admin-held:<id>``     the object's id on its cluster
failed              ``failed:<cause>``      the cause kind that ended the job
refused             ``refused:<N>``         the submission every launch of was refused
cleanup-deadline    ``cleanup-deadline``    none: committed once per job
stop-overdue        ``stop-overdue:<id>``   the object's id on its cluster
give-up             ``give-up``             none: records a decision
no-progress         ``no-progress:<N>``     the rule's ``max_without_progress``
==================  ======================  ==========================================

:data:`ESCALATIONS` says, per kind, its :class:`Severity`, what it means (seed 002's words), what
a person can do about it, and the operator commands that answer it, as the API names them.
The planner builds ids with :func:`escalation_id`; the notifier, the CLI and the web read them
back with :func:`parse_escalation_id` (or :func:`escalation_kind`, which never raises).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Protocol, assert_never

import msgspec

from dispatch_core.errors import DispatchError
from dispatch_core.events import AbandonTarget
from dispatch_core.state import CauseKind, HoldKind, State

if TYPE_CHECKING:
    from dispatch_core.job import HoldView

__all__ = [
    "ESCALATIONS",
    "EscalationInfo",
    "EscalationKind",
    "InvalidEscalationId",
    "Severity",
    "StatusFacts",
    "escalation_id",
    "escalation_info",
    "escalation_kind",
    "escalation_open",
    "hold_answers",
    "job_commands",
    "parse_escalation_id",
]


class EscalationKind(enum.StrEnum):
    """What an escalation is about: its id's prefix (seed 002, "Answer it by its id")."""

    OVERDUE = "overdue"
    ALL_UNKNOWN = "all-unknown"
    UNMATCHED = "unmatched"
    FOREIGN = "foreign"
    ADMIN_HELD = "admin-held"
    FAILED = "failed"
    REFUSED = "refused"
    CLEANUP_DEADLINE = "cleanup-deadline"
    STOP_OVERDUE = "stop-overdue"
    GIVE_UP = "give-up"
    NO_PROGRESS = "no-progress"


class Severity(enum.StrEnum):
    """How urgently a person should hear of an escalation (the notifier routes by it).

    ``critical``: the job failed, or something of it won't stop or settle. ``warning``: it
    waits for a person's decision. ``info``: it records a decision already taken.
    """

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class EscalationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What one kind of escalation is, and how a person answers it.

    Attributes:
        kind: the kind.
        severity: its default severity (a notifier routes file may override it per id).
        meaning: what happened, in seed 002's words.
        advice: what a person can do about it, one or two sentences (``<job>`` stands for the
            job's id).
        answers: the operator commands that answer it, as the API names them (``release``,
            ``resubmit``, ``cancel``, ``give-up``, ``abandon``, ``supersede``,
            ``emergency-stop``); empty when there is nothing to answer.
        argument: how the id's argument reads (``<instance>``, ``<N>/<a>``, ...), or empty
            for a kind whose id is its prefix alone.
    """

    kind: EscalationKind
    severity: Severity
    meaning: str
    advice: str
    answers: tuple[str, ...]
    argument: str = ""

    @property
    def id_format(self) -> str:
        """The id's shape, e.g. ``overdue:<instance>`` or ``cleanup-deadline``."""
        return f"{self.kind}:{self.argument}" if self.argument else str(self.kind)


_K = EscalationKind
_TABLE: Final = (
    EscalationInfo(
        kind=_K.OVERDUE,
        severity=Severity.WARNING,
        meaning="a hold past its deadline; the hold stays in force",
        advice=(
            "A hold is past its deadline and stays in force. Release an actor's hold; for a "
            "recovery hold, resubmit, cancel or give up."
        ),
        answers=("release", "resubmit", "cancel", "give-up"),
        argument="<instance>",
    ),
    EscalationInfo(
        kind=_K.ALL_UNKNOWN,
        severity=Severity.WARNING,
        meaning=(
            "a launch whose outcome nobody knows: no launch of the submission is known to "
            "have made an object"
        ),
        advice=(
            "A launch's outcome stayed unknown. Look for an object named dj-<job> on the "
            "scheduler; if there is none, abandon the submission."
        ),
        answers=("abandon",),
        argument="<N>",
    ),
    EscalationInfo(
        kind=_K.UNMATCHED,
        severity=Severity.WARNING,
        meaning="a launch whose outcome nobody knows, and no object turned up for it",
        advice=(
            "A launch's outcome stayed unknown. Look for an object named dj-<job> on the "
            "scheduler; if there is none, abandon the attempt."
        ),
        answers=("abandon",),
        argument="<N>/<a>",
    ),
    EscalationInfo(
        kind=_K.FOREIGN,
        severity=Severity.WARNING,
        meaning=(
            "an object with the job's name that isn't dispatch's; it blocks the record from "
            "settling, and dispatch never stops or adopts it"
        ),
        advice=(
            "An object named for this job isn't dispatch's. Find out what it is, stop it on the "
            "scheduler if it shouldn't run, then abandon it in the record."
        ),
        answers=("abandon",),
        argument="<object id>",
    ),
    EscalationInfo(
        kind=_K.ADMIN_HELD,
        severity=Severity.WARNING,
        meaning="a gate an administrator holds; dispatch never opens it",
        advice="An administrator holds the job's gate. Ask them, or cancel the job.",
        answers=("cancel",),
        argument="<object id>",
    ),
    EscalationInfo(
        kind=_K.FAILED,
        severity=Severity.CRITICAL,
        meaning="the job failed; the outcome is already committed and final",
        advice="The job failed; the outcome is final. To run it again, supersede it.",
        answers=("supersede",),
        argument="<cause>",
    ),
    EscalationInfo(
        kind=_K.REFUSED,
        severity=Severity.CRITICAL,
        meaning="the job failed: the scheduler refused every attempt to launch",
        advice="The scheduler refused every launch; the job failed. Supersede to retry.",
        answers=("supersede",),
        argument="<N>",
    ),
    EscalationInfo(
        kind=_K.CLEANUP_DEADLINE,
        severity=Severity.CRITICAL,
        meaning=(
            "a cancelled job still stopping: the job has an outcome and its record hasn't "
            "settled by the clean-up deadline"
        ),
        advice=(
            "The job has an outcome but hasn't settled. Stop what is still alive on the "
            "scheduler, or emergency-stop it."
        ),
        answers=("emergency-stop",),
    ),
    EscalationInfo(
        kind=_K.STOP_OVERDUE,
        severity=Severity.CRITICAL,
        meaning=(
            "an object dispatch asked to stop that the scheduler still doesn't show ended; a "
            "replacement's gate stays closed meanwhile"
        ),
        advice=(
            "dispatch asked an object to stop and the scheduler still doesn't show it ended; a "
            "replacement's gate stays closed meanwhile. Stop it on the scheduler yourself, or "
            "emergency-stop the job."
        ),
        answers=("emergency-stop",),
        argument="<object id>",
    ),
    EscalationInfo(
        kind=_K.GIVE_UP,
        severity=Severity.INFO,
        meaning="someone called give-up; it records the decision",
        advice="Someone gave the job up. Nothing to answer.",
        answers=(),
    ),
    EscalationInfo(
        kind=_K.NO_PROGRESS,
        severity=Severity.WARNING,
        meaning=(
            "the job is held: N executions in a row ended by a cause its rule covers without "
            "advancing the published step (issue 14)"
        ),
        advice=(
            "The job keeps ending without publishing a newer step. Look at why it makes no "
            "progress; then resubmit it, give it up, or cancel it."
        ),
        answers=("resubmit", "give-up", "cancel"),
        argument="<N>",
    ),
)

ESCALATIONS: Final[Mapping[EscalationKind, EscalationInfo]] = MappingProxyType(
    {info.kind: info for info in _TABLE}
)
"""Every kind of escalation, in the order seed 002 answers them."""

_NUMBERED: Final = frozenset({_K.OVERDUE, _K.ALL_UNKNOWN, _K.REFUSED, _K.NO_PROGRESS})
_OBJECT: Final = frozenset({_K.FOREIGN, _K.ADMIN_HELD, _K.STOP_OVERDUE})
_BARE: Final = frozenset({_K.CLEANUP_DEADLINE, _K.GIVE_UP})
_CAUSES: Final = frozenset(c.value for c in CauseKind)


class InvalidEscalationId(DispatchError, ValueError):
    """An escalation id (or the argument to build one) that isn't one of seed 002's shapes.

    Attributes:
        escalation_id: the id (or, when building, ``<kind>:<argument>``) that was refused.
        reason: what was expected and what was found.
    """

    def __init__(self, escalation_id: str, reason: str) -> None:
        super().__init__(f"escalation id {escalation_id!r}: {reason}")
        self.escalation_id, self.reason = escalation_id, reason


def _is_number(text: str) -> bool:
    # Canonical decimal >= 1 (as the planner prints an int): no sign, no leading zero.
    return text.isascii() and text.isdigit() and not text.startswith("0")


def _check(kind: EscalationKind, arg: str | None, shown: str) -> None:
    info = ESCALATIONS[kind]
    if kind in _BARE:
        if arg is not None:
            raise InvalidEscalationId(shown, f"expected {kind} alone, found an argument")
        return
    if arg is None:
        raise InvalidEscalationId(shown, f"expected {info.id_format}, found no argument")
    if kind in _NUMBERED:
        ok = _is_number(arg)
    elif kind is _K.UNMATCHED:
        sub, sep, att = arg.partition("/")
        ok = bool(sep) and _is_number(sub) and _is_number(att)
    elif kind is _K.FAILED:
        ok = arg in _CAUSES
    else:  # an object id: whatever text the scheduler gave it
        ok = kind in _OBJECT
    if not ok:
        raise InvalidEscalationId(shown, f"expected {info.id_format}, found {arg!r}")


def escalation_id(kind: EscalationKind, arg: str | int | tuple[int, int] | None = None) -> str:
    """Build an escalation's id (seed 002: "The id's prefix says what happened").

    Args:
        kind: what the escalation is about.
        arg: the id's argument: the hold's instance (``overdue``), the submission
            (``all-unknown``, ``refused``), the rule's ``max_without_progress``
            (``no-progress``), ``(submission, attempt)`` or ``"N/a"``
            (``unmatched``), the object's id (``foreign``, ``admin-held``, ``stop-overdue``),
            the cause kind (``failed``); ``None`` for ``cleanup-deadline`` and ``give-up``.

    Returns:
        ``<prefix>`` or ``<prefix>:<argument>``; :func:`parse_escalation_id` reads it back.

    Raises:
        InvalidEscalationId: the argument doesn't fit the kind.
    """
    if isinstance(arg, tuple):
        text: str | None = f"{arg[0]}/{arg[1]}"
    elif isinstance(arg, int) and not isinstance(arg, bool):
        text = str(arg)
    elif isinstance(arg, str):
        text = str(arg)  # a CauseKind or another StrEnum: its value
    else:
        text = None
    shown = str(kind) if text is None else f"{kind}:{text}"
    _check(kind, text, shown)
    return shown


def parse_escalation_id(escalation_id: str) -> tuple[EscalationKind, str | None]:
    """Read an escalation id back: its kind and its argument (the text after the first ``:``).

    The inverse of :func:`escalation_id`: ``escalation_id(*parse_escalation_id(i)) == i``.

    Raises:
        InvalidEscalationId: the prefix is no kind, or the argument doesn't fit the kind;
            the message names the id.
    """
    prefix, sep, rest = escalation_id.partition(":")
    try:
        kind = EscalationKind(prefix)
    except ValueError:
        known = ", ".join(k.value for k in EscalationKind)
        raise InvalidEscalationId(
            escalation_id, f"expected a prefix of {known}, found {prefix!r}"
        ) from None
    arg = rest if sep else None
    _check(kind, arg, escalation_id)
    return kind, arg


def escalation_kind(escalation_id: str) -> EscalationKind | None:
    """The kind of an escalation id, or ``None`` when it isn't one this build knows.

    For readers that must not fail on an id a newer writer committed (the notifier, the
    CLI, metrics): they fall back to a neutral default.
    """
    try:
        return parse_escalation_id(escalation_id)[0]
    except InvalidEscalationId:
        return None


def escalation_info(escalation_id: str) -> EscalationInfo | None:
    """The table's row for an escalation id, or ``None`` when it isn't one this build knows."""
    kind = escalation_kind(escalation_id)
    return None if kind is None else ESCALATIONS[kind]


class StatusFacts(Protocol):
    """What :func:`escalation_open` reads of a job: a core ``Status``, the API's or the CLI's
    ``JobSummary`` (each has these fields)."""

    @property
    def settled(self) -> bool:
        """The job has an outcome and nothing of it can still act."""

    @property
    def superseded_by(self) -> str | None:
        """The job superseding this one, if any."""

    @property
    def hold(self) -> HoldView | None:
        """The hold in force, if any."""

    @property
    def submission(self) -> int | None:
        """N of the current submission, if one is open."""


def _answered(
    kind: EscalationKind, arg: str | None, job: StatusFacts, abandoned: Collection[AbandonTarget]
) -> bool:
    """Whether what the escalation asked has been answered (or needs no answer)."""
    if kind is _K.GIVE_UP:
        return True  # it records a decision: nothing to answer
    if kind in (_K.FAILED, _K.REFUSED):
        return job.superseded_by is not None
    if kind is _K.OVERDUE:
        return job.hold is None or str(job.hold.instance) != arg
    if kind is _K.ALL_UNKNOWN:
        number = int(arg) if arg is not None else 0
        moved_on = job.submission is not None and job.submission > number
        return moved_on or any(
            t.foreign is None and t.attempt is None and t.submission == number for t in abandoned
        )
    if kind is _K.UNMATCHED and arg is not None:
        sub, _, att = arg.partition("/")
        return any(
            t.foreign is None and (t.submission, t.attempt) == (int(sub), int(att))
            for t in abandoned
        )
    if kind is _K.FOREIGN:
        return any(t.foreign is not None and t.foreign.id == arg for t in abandoned)
    return False  # admin-held, cleanup-deadline, stop-overdue: answered when the job settles


def escalation_open(
    escalation_id: str,
    *,
    delivered: bool,
    job: StatusFacts | None,
    abandoned: Collection[AbandonTarget] = (),
) -> bool:
    """Whether an escalation still waits for a person (the CLI's and the web's "open").

    Seed 002: "An escalation is dispatch asking a person to decide something it won't decide
    alone", answered by its id's prefix. It waits for a person while a person hasn't been
    told (not ``delivered``) or hasn't decided yet, and a job's life says which:

    * ``failed:<cause>``, ``refused:<N>``: the outcome is final; open until someone
      supersedes the job (``Supersede`` answers it, delivered or not);
    * ``overdue:<i>``: open while hold ``i`` is in force (release, resubmit, cancel or
      give-up end the hold: answered);
    * ``all-unknown:<N>``: answered once submission ``N`` is abandoned or the job has moved
      past it (a later submission); ``unmatched:<N>/<a>``: once that attempt is abandoned;
      ``foreign:<id>``: once that object is abandoned;
    * ``give-up``: it records a decision and asks nothing: open only until delivered;
    * the rest (``admin-held:``, ``cleanup-deadline``, ``stop-overdue:``) and an id this
      build doesn't know: open while undelivered or while the job hasn't settled (a settled
      job has nothing left that can act).

    An answered escalation is closed even if undelivered (the person answering knows).

    Args:
        escalation_id: the id as the record holds it.
        delivered: whether a channel accepted it (the record's ``delivered``).
        job: the job's Status (or a ``JobSummary`` of it); ``None`` when the job's Status
            can't be read: then it is open (nothing says it was answered).
        abandoned: the targets a person abandoned (``Job.abandoned``); a Status doesn't
            carry them, so without them an abandoned ``unmatched:``/``foreign:`` escalation
            counts as open until the job settles.
    """
    if job is None:
        return True
    kind = escalation_kind(escalation_id)
    if kind is not None:
        arg = escalation_id.partition(":")[2] or None
        if _answered(kind, arg, job, abandoned):
            return not delivered and kind is _K.GIVE_UP
        if kind in (_K.FAILED, _K.REFUSED):
            return True
    return not delivered or not job.settled


def hold_answers(kind: HoldKind) -> tuple[str, ...]:
    """The operator commands that answer a hold of ``kind`` (seed 002, ``overdue:<instance>``).

    An actor's hold is released; a recovery hold (a hold rule placed it), which release
    can't lift, is resubmitted, cancelled or given up.
    """
    match kind:
        case HoldKind.ACTOR:
            return ("release",)
        case HoldKind.RECOVERY:
            return ("resubmit", "cancel", "give-up")
        case _:
            assert_never(kind)


_ABANDONABLE: Final = frozenset({_K.ALL_UNKNOWN, _K.UNMATCHED, _K.FOREIGN})


def job_commands(
    state: State,
    *,
    settled: bool,
    hold: HoldKind | None,
    open_escalations: Collection[str] = (),
) -> tuple[str, ...]:
    """The operator commands that can apply to a job in its current state (the web's job page).

    * an outcome (succeeded, failed, cancelled): ``supersede``, and ``emergency-stop`` while
      something of it may still act (not ``settled``);
    * held: the answers of its hold's kind (:func:`hold_answers`);
    * otherwise (pending, running, recovering, unknown): ``hold``, ``cancel``,
      ``emergency-stop``;
    * ``abandon`` besides, only while an ``all-unknown:``, ``unmatched:`` or ``foreign:``
      escalation is open (``open_escalations``: the ids :func:`escalation_open` says are open).

    Whether the actor may give one (abandon is a person's) is the caller's to say.
    """
    if state.terminal:
        out: tuple[str, ...] = ("supersede",) if settled else ("supersede", "emergency-stop")
    elif hold is not None:
        out = hold_answers(hold)
    else:
        out = ("hold", "cancel", "emergency-stop")
    if any(escalation_kind(e) in _ABANDONABLE for e in open_escalations):
        out += ("abandon",)
    return out

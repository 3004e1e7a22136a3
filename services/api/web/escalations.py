"""What the web page says about an escalation: the core's table, read for one id.

Meanings, advice, severities and answers are the core's (``dispatch_core.escalations``,
:data:`~dispatch_core.escalations.ESCALATIONS`, seed 002 "Answer it by its id"); this module
only adds what a page needs on top: the id's argument, and for ``abandon`` the target the id
names (the body ``POST /v1/jobs/<job>/abandon`` takes).

``held:<instance>`` is not an escalation of the record: it is the notice the notifier sends
when a job is held (``services/notifier/routing.py`` :data:`HELD_NOTICE`,
``NOTIFIER_HELD_NOTICES``); the inbox lists a held job under it. A hold's answers (of
``held:`` and of ``overdue:``) are those of its kind, the core's
:func:`~dispatch_core.escalations.hold_answers` (seed 002: release an actor's hold; a
recovery hold is resubmitted, cancelled or given up).
"""

from __future__ import annotations

from typing import Final

import msgspec

from dispatch_core.escalations import (
    ESCALATIONS,
    EscalationKind,
    InvalidEscalationId,
    Severity,
    hold_answers,
    parse_escalation_id,
)
from dispatch_core.state import HoldKind
from services.notifier.routing import HELD_NOTICE

__all__ = ["HELD_NOTICE", "SEVERITY_ORDER", "EscalationInfo", "describe"]

SEVERITY_ORDER: Final[dict[str, int]] = {s.value: i for i, s in enumerate(Severity)}
"""Most urgent first (the inbox sorts by it, then by age): the core's order of severities."""

_HELD_MEANING: Final = "the job is held and waits for a person (a notice, not an escalation)"
_HELD_ADVICE: Final = {
    None: (
        "A person's hold: release it. A recovery hold (a hold rule placed it): release is "
        "refused; resubmit, cancel or give up."
    ),
    HoldKind.ACTOR: "A person's hold: release it when the job may run again.",
    HoldKind.RECOVERY: (
        "A hold rule placed it, and release can't lift it: resubmit, cancel or give up."
    ),
}


class EscalationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the page shows of one escalation id.

    Attributes:
        kind: the id's prefix (``overdue``, ``all-unknown``, ..., or ``held``).
        arg: what follows the ``:`` (a hold instance, ``N``, ``N/a``, an object id), or None.
        severity: ``critical``, ``warning`` or ``info`` (the core's :class:`Severity`).
        meaning: what happened, in seed 002's words (the core's).
        advice: what a person can do about it (the core's; ``<job>`` is the job's id).
        answers: the operator commands that answer it, as the API spells them (the core's).
        abandon_target: for ``abandon``, the target the id names (``{"submission": N}``,
            ``{"submission": N, "attempt": a}`` or ``{"foreign": {"cluster", "id"}}``).
    """

    kind: str
    arg: str | None
    severity: str
    meaning: str
    advice: str
    answers: tuple[str, ...]
    abandon_target: dict[str, object] | None = None


def _abandon_target(
    kind: EscalationKind, arg: str | None, cluster: str | None
) -> dict[str, object] | None:
    if arg is None:
        return None
    if kind is EscalationKind.ALL_UNKNOWN:
        return {"submission": int(arg)}
    if kind is EscalationKind.UNMATCHED:
        n, _, a = arg.partition("/")
        return {"submission": int(n), "attempt": int(a)}
    if kind is EscalationKind.FOREIGN and cluster is not None:
        return {"foreign": {"cluster": cluster, "id": arg}}
    return None


def describe(
    escalation_id: str,
    *,
    cluster: str | None = None,
    job_id: str = "",
    hold_kind: HoldKind | None = None,
) -> EscalationInfo:
    """Return what the page shows of ``escalation_id`` (``overdue:3``, ``give-up``, ...).

    Args:
        escalation_id: the escalation's id as the record holds it, or ``held:<instance>``.
        cluster: the job's cluster (the cluster of a ``foreign:<object id>`` object).
        job_id: the job, put in place of ``<job>`` in the advice.
        hold_kind: the kind of the job's hold in force: a hold's escalation (``held:``, and
            ``overdue:`` of that hold) is answered by that kind's answers alone.

    An id the core doesn't know (a newer writer's, or a malformed one) is a ``warning`` with
    no answers and a meaning that says so (never an error: the page lists it as it is).
    """
    prefix, sep, rest = escalation_id.partition(":")
    arg = rest if sep else None
    if prefix == HELD_NOTICE:
        overdue = ESCALATIONS[EscalationKind.OVERDUE]
        return EscalationInfo(
            kind=prefix,
            arg=arg,
            severity=overdue.severity.value,
            meaning=_HELD_MEANING,
            advice=_HELD_ADVICE[hold_kind],
            answers=overdue.answers if hold_kind is None else hold_answers(hold_kind),
        )
    try:
        kind, arg = parse_escalation_id(escalation_id)
    except InvalidEscalationId as err:
        return EscalationInfo(
            kind=prefix,
            arg=arg,
            severity=Severity.WARNING.value,
            meaning=f"dispatch doesn't describe this escalation ({err.reason}); read the detail",
            advice="",
            answers=(),
        )
    info = ESCALATIONS[kind]
    answers = info.answers
    if kind is EscalationKind.OVERDUE and hold_kind is not None:
        answers = hold_answers(hold_kind)
    return EscalationInfo(
        kind=kind.value,
        arg=arg,
        severity=info.severity.value,
        meaning=info.meaning,
        advice=info.advice.replace("<job>", job_id) if job_id else info.advice,
        answers=answers,
        abandon_target=_abandon_target(kind, arg, cluster) if "abandon" in info.answers else None,
    )

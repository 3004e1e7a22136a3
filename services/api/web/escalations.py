"""What the web page says about an escalation: its meaning and the answers that apply.

The page reads escalations through :func:`describe` alone, so that when the core's table
(``dispatch_core.escalations``, ``ESCALATIONS``: kind, severity, meaning, answers) lands,
only this function changes. Until then the table below is derived from seed 002 ("Answer it
by its id"), the same sentences the notifier's channels show, and the notifier's default
severities (``services/notifier/routing.py``).

``held:<instance>`` is not an escalation of the record: it is the notice the notifier sends
when a job is held (``NOTIFIER_HELD_NOTICES``); the inbox lists a held job under it, with
the answers of ``overdue:`` (seed 002: release an actor's hold; for a recovery hold release
is refused, and resubmit, cancel or give-up answer it).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

__all__ = ["EscalationInfo", "describe"]

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER: Final[dict[str, int]] = {"critical": 0, "warning": 1, "info": 2}
"""Most urgent first (the inbox sorts by it, then by age)."""


class EscalationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the page shows of one escalation id.

    Attributes:
        kind: the id's prefix without its ``:`` (``overdue``, ``all-unknown``, ...).
        arg: what follows the ``:`` (a hold instance, ``N``, ``N/a``, an object id), or None.
        severity: ``critical``, ``warning`` or ``info``.
        meaning: seed 002's answer for the prefix, in a sentence.
        answers: the operator commands that answer it, as the API spells them.
        abandon_target: for ``abandon``, the target the id names (``{"submission": N}``,
            ``{"submission": N, "attempt": a}`` or ``{"foreign": {"cluster", "id"}}``).
    """

    kind: str
    arg: str | None
    severity: Severity
    meaning: str
    answers: tuple[str, ...]
    abandon_target: dict[str, object] | None = None


_HOLD_ANSWERS: Final = ("release", "resubmit", "cancel", "give-up")
_TABLE: Final[dict[str, tuple[Severity, str, tuple[str, ...]]]] = {
    "overdue": (
        "warning",
        "A hold is past its deadline and stays in force; dispatch never releases it on its "
        "own. Release an actor's hold; for a recovery hold (a hold rule placed it) release is "
        "refused: resubmit, cancel or give up.",
        _HOLD_ANSWERS,
    ),
    "held": (
        "warning",
        "The job is held and waits for a person. Release an actor's hold; for a recovery "
        "hold (a hold rule placed it) release is refused: resubmit, cancel or give up.",
        _HOLD_ANSWERS,
    ),
    "all-unknown": (
        "warning",
        "A launch's outcome stayed unknown for the job's unresolved age and no object turned "
        "up. Look for an object named dj-<job> on the scheduler; if there is none, abandon "
        "the submission (the next one is then launched).",
        ("abandon", "cancel"),
    ),
    "unmatched": (
        "warning",
        "A launch attempt's outcome stayed unknown and no object turned up for it. Look for "
        "an object named dj-<job> on the scheduler; if there is none, abandon the attempt.",
        ("abandon", "cancel"),
    ),
    "foreign": (
        "warning",
        "An object named for this job isn't dispatch's, and it blocks the record from "
        "settling. Find out what it is, stop it on the scheduler if it shouldn't run, then "
        "abandon it in the record.",
        ("abandon",),
    ),
    "admin-held": (
        "warning",
        "An administrator holds the launched object's gate; dispatch never opens it. Ask "
        "whoever holds it, or cancel the job.",
        ("cancel",),
    ),
    "failed": (
        "critical",
        "The job failed; the outcome is committed and final. To run it again, supersede it: "
        "a new job with the same spec and a higher epoch.",
        ("supersede",),
    ),
    "refused": (
        "critical",
        "The scheduler refused every attempt to launch; the job failed. Supersede it to try again.",
        ("supersede",),
    ),
    "cleanup-deadline": (
        "critical",
        "The job has an outcome but its record hasn't settled past the clean-up deadline. "
        "Stop what is still alive on the scheduler, or emergency-stop the job.",
        ("emergency-stop",),
    ),
    "stop-overdue": (
        "critical",
        "dispatch asked an object to stop and the scheduler still doesn't show it ended; a "
        "replacement's gate stays closed meanwhile. Stop it on the scheduler, or "
        "emergency-stop the job.",
        ("emergency-stop",),
    ),
    "give-up": ("info", "Someone gave the job up. It records the decision; nothing to answer.", ()),
}


def _abandon_target(kind: str, arg: str | None, cluster: str | None) -> dict[str, object] | None:
    if arg is None:
        return None
    if kind == "all-unknown" and arg.isdigit():
        return {"submission": int(arg)}
    if kind == "unmatched":
        n, _, a = arg.partition("/")
        if n.isdigit() and a.isdigit():
            return {"submission": int(n), "attempt": int(a)}
    if kind == "foreign" and cluster is not None:
        return {"foreign": {"cluster": cluster, "id": arg}}
    return None


def describe(escalation_id: str, *, cluster: str | None = None) -> EscalationInfo:
    """Return what the page shows of ``escalation_id`` (``overdue:3``, ``give-up``, ...).

    Args:
        escalation_id: the escalation's id as the record holds it, or ``held:<instance>``.
        cluster: the job's cluster (the cluster of a ``foreign:<object id>`` object).

    An id with a prefix the table doesn't know is a ``warning`` with no answers and a
    meaning that says so (never an error: the page lists it as it is).
    """
    kind, sep, rest = escalation_id.partition(":")
    arg = rest if sep else None
    found = _TABLE.get(kind)
    if found is None:
        return EscalationInfo(
            kind=kind,
            arg=arg,
            severity="warning",
            meaning=f"dispatch doesn't describe escalations of kind {kind!r}; read the detail.",
            answers=(),
        )
    severity, meaning, answers = found
    return EscalationInfo(
        kind=kind,
        arg=arg,
        severity=severity,
        meaning=meaning,
        answers=answers,
        abandon_target=_abandon_target(kind, arg, cluster) if "abandon" in answers else None,
    )

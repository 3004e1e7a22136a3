"""Operator commands (seed 002, "Answer it by its id"): decided by ``decide`` against the
folded record, which returns the events they commit or raises ``Refused``.

Every command names the :class:`~dispatch_core.state.Actor` who gave it and carries a reason.
"""

from __future__ import annotations

import msgspec

from dispatch_core.events import AbandonTarget
from dispatch_core.state import Actor, Declarations, JobSpec, RecoveryPolicy

__all__ = [
    "Abandon",
    "Cancel",
    "Command",
    "EmergencyStop",
    "GiveUp",
    "HoldCommand",
    "OperatorCommand",
    "Release",
    "Resubmit",
    "Submit",
    "Supersede",
]


class Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="command"):
    """Base of every command.

    Attributes:
        by: who gives it.
        reason: why, in the actor's words.
    """

    by: Actor
    reason: str = ""


class Submit(Command, frozen=True, kw_only=True, tag="submit"):
    """Create a job: validate the policy, make the plan, open the record.

    Attributes:
        job_id: the new job's id (the caller makes it; the core has no randomness).
        spec, policy: what to run and how to recover it.
        declarations: the declarations of the spec's cluster's backend.
    """

    job_id: str
    spec: JobSpec
    policy: RecoveryPolicy
    declarations: Declarations


class HoldCommand(Command, frozen=True, kw_only=True, tag="hold"):
    """Place an actor hold: no launch and no gate opens until it is released.

    Attributes:
        for_s: seconds until the hold is overdue (escalated; it stays in force).
    """

    for_s: float = 86400.0


class Release(Command, frozen=True, kw_only=True, tag="release"):
    """Release an actor hold (refused for a recovery hold: resubmit, cancel or give up)."""


class Resubmit(Command, frozen=True, kw_only=True, tag="resubmit"):
    """Lift a recovery hold and run a new submission."""


class Cancel(Command, frozen=True, kw_only=True, tag="cancel"):
    """Cancel the job: its outcome is ``cancelled`` and its live objects are stopped."""


class GiveUp(Command, frozen=True, kw_only=True, tag="give-up"):
    """Fail a held job with the cause that ended it."""


class Abandon(Command, frozen=True, kw_only=True, tag="abandon"):
    """Close an unknown launch or dispose of a foreign object; a human actor only."""

    target: AbandonTarget


class Supersede(Command, frozen=True, kw_only=True, tag="supersede"):
    """Create a new job from one with a committed outcome: same spec and policy,
    generation + 1, naming the old one.

    Attributes:
        new_job_id: the new job's id (made by the caller).
    """

    new_job_id: str


class EmergencyStop(Command, frozen=True, kw_only=True, tag="emergency-stop"):
    """Kill every live object of the job at once (the backend's emergency stop)."""


OperatorCommand = (
    Submit
    | HoldCommand
    | Release
    | Resubmit
    | Cancel
    | GiveUp
    | Abandon
    | Supersede
    | EmergencyStop
)
"""Every command ``decide`` takes."""

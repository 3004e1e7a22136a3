"""Constants the seeds name, shared by ``make_plan``, ``decide`` and the planner."""

from __future__ import annotations

from typing import Final

from dispatch_core.state import Actor, ActorKind

__all__ = [
    "CESSATION_INTERVAL_S",
    "JOB_PLACEHOLDER",
    "MAX_HOLD_FOR_S",
    "NO_CAPACITY_WAIT_S",
    "SHARED_HOLD_FOR_S",
    "SUPERVISOR",
]

SHARED_HOLD_FOR_S: Final = 86400.0
"""Seconds a shared-checkpoint hold stands before it is overdue: 24 h (seed 004, "When a job
can't isolate", ``dispatch.SharedHoldFor``)."""

CESSATION_INTERVAL_S: Final = 60.0
"""Seconds between two asks of a backend's cessation signal while a shared-checkpoint hold
stands: a minute (seed 004, ``dispatch.CessationInterval``)."""

MAX_HOLD_FOR_S: Final = 100 * 365 * 86400.0
"""The longest hold, in seconds (100 years): a deadline past the year 9999 can't be computed,
so ``validate`` and ``decide`` refuse a longer one rather than fail in the planner."""

NO_CAPACITY_WAIT_S: Final = 600.0
"""Seconds a rule covering ``no-capacity`` tolerates a no-capacity wait when it doesn't say
(``RecoveryRule.wait_s``): 10 minutes, long enough for a node reboot or a drain to clear,
short enough that a job moves on within the hour (docs/core-semantics.md, "No capacity")."""

JOB_PLACEHOLDER: Final = "{job}"
"""The token in ``JobSpec.checkpoint`` that ``decide`` replaces with the job's id when it
creates the job (like Slurm's ``%j`` in ``--output``), so one job file gives every job a root
of its own."""

SUPERVISOR: Final = Actor(name="dispatch-supervisor", kind=ActorKind.SERVICE)
"""The actor of everything the supervisor decides: recovery holds, cessation releases."""

"""``DISPATCH_EPOCH``: the number that orders a job's executions (seed 004, "The epoch orders
executions").

    DISPATCH_EPOCH = G * 10**12 + N * 10**6 + R

G is the job's generation (0 for a new job, one more than the superseded job's for a job
made by supersede), N the submission number (1..999,999), R the backend's restart count for
the object (0..999,999). A resubmission raises N, a native requeue raises R, and a
supersession raises G, so each raises the epoch.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from dispatch_core.errors import EpochOutOfRange

__all__ = [
    "MAX_EPOCH",
    "MAX_GENERATION",
    "MAX_RESTART",
    "MAX_SUBMISSION",
    "EpochParts",
    "epoch",
    "split_epoch",
]

MAX_SUBMISSION: Final = 999_999
MAX_RESTART: Final = 999_999
#: The epoch is printed in 20 decimal digits in a publication's name (seed 004), so the
#: generation may use the digits left above the 12 of N and R.
MAX_GENERATION: Final = 10**8 - 1
MAX_EPOCH: Final = MAX_GENERATION * 10**12 + MAX_SUBMISSION * 10**6 + MAX_RESTART


class EpochParts(NamedTuple):
    """The three components of an epoch."""

    generation: int
    submission: int
    restart: int


def _check(component: str, value: int, low: int, high: int) -> None:
    # bool is an int; an epoch computed from True would hide a bug upstream.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"epoch: {component} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise EpochOutOfRange(component, value, low, high)


def epoch(generation: int, submission: int, restart: int) -> int:
    """Compute ``DISPATCH_EPOCH`` for one execution (seed 004, "The epoch").

    Args:
        generation: G, 0 for a new job, +1 per supersession; 0..``MAX_GENERATION``.
        submission: N, the submission number, 1..999,999.
        restart: R, the backend's restart count of the object, 0..999,999.

    Returns:
        ``G * 10**12 + N * 10**6 + R``.

    Raises:
        EpochOutOfRange: a component is outside its bounds (naming which).
        TypeError: a component is not an ``int``.
    """
    _check("generation", generation, 0, MAX_GENERATION)
    _check("submission", submission, 1, MAX_SUBMISSION)
    _check("restart", restart, 0, MAX_RESTART)
    return generation * 10**12 + submission * 10**6 + restart


def split_epoch(value: int) -> EpochParts:
    """Split an epoch into its components; the inverse of :func:`epoch`.

    Raises:
        EpochOutOfRange: ``value`` is not an epoch :func:`epoch` could have produced
            (negative, too large, or with submission 0).
    """
    _check("epoch", value, 0, MAX_EPOCH)
    generation, rest = divmod(value, 10**12)
    submission, restart = divmod(rest, 10**6)
    _check("submission", submission, 1, MAX_SUBMISSION)
    return EpochParts(generation, submission, restart)

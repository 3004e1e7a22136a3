"""Time limits in Slurm's ``--time`` format, the one every backend reads from
``JobSpec.options["time"]`` (so a spec means the same on each).

Pure (stdlib only): the local and kubeflow backends parse a launch's limit with
:func:`parse_time_limit`, the Slurm backend checks one with it before ``sbatch`` sees it, and
:func:`dispatch_backends.check_options` checks a submission's with it, so a limit is refused
at submission exactly when a launch would refuse it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["TIME_FORMATS", "parse_time_limit"]

TIME_FORMATS: Final = "M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or 0, UNLIMITED, INFINITE for none"
"""The forms :func:`parse_time_limit` accepts, as its error messages list them."""

_NONE: Final = frozenset({"UNLIMITED", "INFINITE", "-1"})


def parse_time_limit(value: str) -> int | None:
    """Parse a time limit in Slurm's ``--time`` format into seconds.

    Args:
        value: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` or ``D-H:M:S`` (a bare number is
            minutes, as in Slurm; every part is decimal digits), or ``UNLIMITED`` /
            ``INFINITE`` (any case) or ``-1``, which sbatch also takes for no limit.

    Returns:
        The limit in seconds, or ``None`` for no limit (also for a limit of 0, as in Slurm).

    Raises:
        ValueError: ``value`` is not in one of those forms; the message quotes it and lists
            the forms.
    """
    text = value.strip()
    if text.upper() in _NONE:
        return None
    invalid = ValueError(f"invalid time limit {value!r} (Slurm's --time formats: {TIME_FORMATS})")
    days = 0
    if "-" in text:
        day_text, _, text = text.partition("-")
        if not (day_text.isascii() and day_text.isdigit()):
            raise invalid
        days = int(day_text)
        parts = text.split(":")
        if not 1 <= len(parts) <= 3:
            raise invalid
        parts += ["0"] * (3 - len(parts))  # D-H, D-H:M, D-H:M:S
    else:
        parts = text.split(":")
        parts = {1: ["0", parts[0], "0"], 2: ["0", *parts], 3: parts}.get(len(parts), [])
        if not parts:
            raise invalid
    # isdigit() alone takes "²" and other Unicode digits, which int() refuses.
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise invalid
    hours, minutes, seconds = (int(p) for p in parts)
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None

"""The execution's identity: ``DISPATCH_ATTEMPT`` and ``DISPATCH_EPOCH`` (seed 004).

dispatch sets both for every execution it starts. ``DISPATCH_ATTEMPT`` is an opaque token,
different for every execution, naming its private folder ``<root>/exec/<attempt>/``.
``DISPATCH_EPOCH`` orders executions (``G*10**12 + N*10**6 + R``) and is validated with the
core's bounds. A backend that can't compute the restart count R when it sets the
environment (Kubeflow: an environment variable can't add, and JobSet restarts re-run the same
pod template) sets ``DISPATCH_EPOCH`` to the execution's base epoch (R = 0) and
``DISPATCH_RESTART`` to R; the epoch is then their sum. This module only reads the mapping
it is given; the CLI and the framework integrations pass ``os.environ`` at their boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from dispatch_ckpt.errors import InvalidEnvironment, MissingEnvironment
from dispatch_core.epoch import MAX_EPOCH, split_epoch
from dispatch_core.epoch import epoch as epoch_of
from dispatch_core.errors import EpochOutOfRange

__all__ = [
    "ATTEMPT_VAR",
    "EPOCH_VAR",
    "RESTART_VAR",
    "ExecutionEnv",
    "check_attempt",
    "parse_epoch",
]

ATTEMPT_VAR: Final = "DISPATCH_ATTEMPT"
EPOCH_VAR: Final = "DISPATCH_EPOCH"
RESTART_VAR: Final = "DISPATCH_RESTART"
"""Set beside a base ``DISPATCH_EPOCH`` (R = 0) by a backend that learns R only at run time."""
#: An attempt token becomes one path component (POSIX NAME_MAX is 255 bytes).
_MAX_ATTEMPT_BYTES: Final = 128


def check_attempt(value: str, *, variable: str = ATTEMPT_VAR) -> str:
    """Validate an attempt token for use as the execution folder's name.

    The token is opaque, but it becomes one path component, so it must be non-empty, at
    most 128 bytes, not ``.`` or ``..``, and hold no ``/``, NUL or other control character.

    Args:
        value: the token.
        variable: the name to report in an error.

    Returns:
        ``value`` unchanged.

    Raises:
        InvalidEnvironment: the token can't name a folder.
    """
    if not value:
        raise InvalidEnvironment(variable, value, "expected a non-empty token")
    if value in (".", ".."):
        raise InvalidEnvironment(variable, value, "expected a token, found a relative path")
    if "/" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidEnvironment(
            variable, value, "expected one path component: no '/' and no control characters"
        )
    if len(value.encode("utf-8")) > _MAX_ATTEMPT_BYTES:
        raise InvalidEnvironment(
            variable, value, f"expected at most {_MAX_ATTEMPT_BYTES} bytes of UTF-8"
        )
    return value


def parse_epoch(text: str, *, variable: str = EPOCH_VAR) -> int:
    """Parse ``DISPATCH_EPOCH`` and validate it with the core's bounds (seed 004).

    Args:
        text: the decimal text, e.g. ``"1000002"`` (G=0, N=1, R=2).
        variable: the name to report in an error.

    Returns:
        The epoch.

    Raises:
        InvalidEnvironment: not plain decimal digits, or outside the bounds of
            :func:`dispatch_core.epoch.split_epoch` (saying which component).
    """
    if not text.isascii() or not text.isdigit():
        raise InvalidEnvironment(variable, text, "expected a decimal number (digits 0-9 only)")
    if len(text) > len(str(MAX_EPOCH)):
        raise InvalidEnvironment(variable, text, f"expected at most {MAX_EPOCH}")
    value = int(text)
    try:
        split_epoch(value)
    except EpochOutOfRange as err:
        raise InvalidEnvironment(variable, text, f"expected G*10^12 + N*10^6 + R: {err}") from err
    return value


def _add_restart(base: int, text: str) -> int:
    """The epoch of an execution whose base epoch (R = 0) and restart count R were given
    apart (``DISPATCH_EPOCH`` + ``DISPATCH_RESTART``)."""
    if not text.isascii() or not text.isdigit():
        raise InvalidEnvironment(RESTART_VAR, text, "expected a decimal number (digits 0-9 only)")
    generation, submission, restart = split_epoch(base)
    if restart != 0:
        raise InvalidEnvironment(
            EPOCH_VAR,
            str(base),
            f"expected a base epoch with R = 0 when {RESTART_VAR} is set, found R = {restart}",
        )
    try:
        return epoch_of(generation, submission, int(text))
    except EpochOutOfRange as err:
        raise InvalidEnvironment(RESTART_VAR, text, str(err)) from err


class ExecutionEnv(msgspec.Struct, frozen=True, kw_only=True):
    """Which execution this process belongs to (seed 004, "Each execution writes into its
    own folder" and "The epoch orders executions").

    Either field may be missing outside dispatch; what needs it says so (see
    :meth:`require_attempt`, :meth:`require_epoch`).
    """

    attempt: str | None = None
    """``DISPATCH_ATTEMPT``: the opaque token naming ``<root>/exec/<attempt>/``."""
    epoch: int | None = None
    """``DISPATCH_EPOCH``: ``G*10**12 + N*10**6 + R``, validated with the core's bounds."""

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        attempt: str | None = None,
        epoch: int | str | None = None,
    ) -> ExecutionEnv:
        """Read the identity from ``env``; values given explicitly take precedence.

        Args:
            env: the environment (``os.environ`` at the CLI's boundary).
            attempt: an attempt token given explicitly (e.g. ``--attempt``).
            epoch: an epoch given explicitly (e.g. ``--epoch``), as int or decimal text.

        Raises:
            InvalidEnvironment: a value is present but unusable.
        """
        raw_attempt = attempt if attempt is not None else env.get(ATTEMPT_VAR)
        checked_attempt = None if raw_attempt is None else check_attempt(raw_attempt)
        checked_epoch: int | None
        if epoch is None:
            raw_epoch = env.get(EPOCH_VAR)
            checked_epoch = None if raw_epoch is None else parse_epoch(raw_epoch)
            raw_restart = env.get(RESTART_VAR)
            if checked_epoch is not None and raw_restart:
                checked_epoch = _add_restart(checked_epoch, raw_restart)
        else:
            checked_epoch = parse_epoch(str(epoch), variable="epoch")
        return cls(attempt=checked_attempt, epoch=checked_epoch)

    def require_attempt(self, needed_for: str) -> str:
        """Return the attempt token, or refuse.

        Raises:
            MissingEnvironment: ``DISPATCH_ATTEMPT`` was neither set nor given.
        """
        if self.attempt is None:
            raise MissingEnvironment(ATTEMPT_VAR, needed_for)
        return self.attempt

    def require_epoch(self, needed_for: str) -> int:
        """Return the epoch, or refuse.

        Raises:
            MissingEnvironment: ``DISPATCH_EPOCH`` was neither set nor given.
        """
        if self.epoch is None:
            raise MissingEnvironment(EPOCH_VAR, needed_for)
        return self.epoch

"""The ``JobSpec.options`` the local backend reads, checked at submission."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from dispatch_backends.options import InvalidOption
from dispatch_backends.time_limit import parse_time_limit

OPTIONS: Final = frozenset({"chdir", "time"})
"""The ``JobSpec.options`` the local backend reads (see the module docstring)."""


def check_options(options: Mapping[str, str]) -> None:
    """Refuse, at submission, the options the local backend would not honour.

    Args:
        options: a spec's ``options``.

    Raises:
        InvalidOption: an option not in :data:`OPTIONS` (the message lists them), or a
            ``time`` that :func:`parse_time_limit` refuses (so :meth:`LocalBackend.start`
            would refuse the launch).
    """
    for key, value in options.items():
        if key not in OPTIONS:
            raise InvalidOption(
                key,
                f"the local backend has no option {key!r} (its options: "
                f"{', '.join(sorted(OPTIONS))})",
            )
        if key == "time":
            try:
                parse_time_limit(value)
            except ValueError as err:
                raise InvalidOption(key, str(err)) from None

"""One config object per service, built once in ``__main__`` from the environment.

Each service defines a frozen msgspec Struct with ``forbid_unknown_fields=True`` and builds it
with :func:`from_env`; nothing else reads ``os.environ``. A typo in a variable name or a bad
value fails at start-up with msgspec's path-qualified message, as a :class:`ConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

import msgspec

__all__ = ["ConfigError", "from_env"]

T = TypeVar("T", bound=msgspec.Struct)


class ConfigError(Exception):
    """A service's configuration is invalid; the message names the variable."""


def from_env(cls: type[T], env: Mapping[str, str], prefix: str) -> T:
    """Build ``cls`` from the variables of ``env`` that start with ``prefix``.

    ``SUPERVISOR_HTTP_PORT=9000`` fills field ``http_port`` of a config built with prefix
    ``SUPERVISOR_``. Values are converted from strings (``"9000"`` -> ``9000``); list fields
    take comma-separated values.

    Raises:
        ConfigError: an unknown variable (a typo) or a value of the wrong type, naming it.
    """
    raw: dict[str, object] = {}
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    for key, value in env.items():
        if not key.startswith(prefix):
            continue
        name = key.removeprefix(prefix).lower()
        field = fields.get(name)
        if field is not None and _is_sequence(field.type):
            raw[name] = [v for v in value.split(",") if v]
        else:
            raw[name] = value
    try:
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigError(f"invalid configuration: {_name_variables(str(err), prefix)}") from err


def _name_variables(message: str, prefix: str) -> str:
    """Rewrite msgspec's field paths (`$.http_port`, unknown field `http_prot`) as the
    environment variables a user set (SUPERVISOR_HTTP_PORT)."""
    message = re.sub(r"`\$\.(\w+)`", lambda m: prefix + m.group(1).upper(), message)
    unknown = r"unknown field `(\w+)`"
    message = re.sub(unknown, lambda m: f"unknown variable {prefix}{m.group(1).upper()}", message)
    return message.replace(" - at `$`", "")


def _is_sequence(tp: object) -> bool:
    origin = getattr(tp, "__origin__", None)
    return origin in (list, tuple, frozenset, set)

"""Reading a route's query parameters: one refusal for each kind of bad value (400, the
parameter named in ``field``), shared by the API's routes and the jobs listing."""

from __future__ import annotations

from multidict import MultiMapping

from services.api.errors import BadRequest

__all__ = ["query_bool", "query_int"]


def query_int(query: MultiMapping[str], name: str, low: int, high: int) -> int | None:
    """The integer ``name`` (None when absent).

    Raises:
        BadRequest: not an integer in ``low..high`` (``field`` ``name``).
    """
    raw = query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadRequest(f"{name} must be an integer in {low}..{high}, got {raw!r}", field=name)
    return value


def query_bool(query: MultiMapping[str], name: str) -> bool | None:
    """The boolean ``name``, spelt ``true`` or ``false`` (None when absent).

    Raises:
        BadRequest: any other spelling (``field`` ``name``).
    """
    raw = query.get(name)
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false, got {raw!r}", field=name)
    return raw == "true"

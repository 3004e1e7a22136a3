"""Which channels an escalation goes to: by id pattern or by severity, first match wins.

An escalation's severity comes from its id's kind, as the core's table
(:data:`dispatch_core.escalations.ESCALATIONS`) says: a job that failed, a launch refused every
time and a job that won't settle are ``critical``; what waits for a person's decision is
``warning``; a give-up, which records a decision already taken, is ``info``. A routes file may
override this per id pattern.
"""

from __future__ import annotations

import fnmatch
from typing import Final

import msgspec

from dispatch_core.escalations import ESCALATIONS, Severity

__all__ = ["DEFAULT_SEVERITY", "Route", "Router", "Severity", "parse_route"]

SEVERITIES: Final[tuple[Severity, ...]] = tuple(Severity)

HELD_NOTICE: Final = "held"
"""The prefix of the notice (not an escalation) sent when a job is held: ``held:<instance>``."""

DEFAULT_SEVERITY: Final[tuple[tuple[str, Severity], ...]] = (
    *((f"{i.kind}:*" if i.argument else str(i.kind), i.severity) for i in ESCALATIONS.values()),
    (f"{HELD_NOTICE}:*", Severity.WARNING),
)
"""Id glob -> severity, in order, from the core's escalation table; an id that matches none
is a ``warning``."""


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """Escalations whose id matches one of ``ids`` and whose severity is one of ``severities``
    (an empty tuple matches everything) go to ``channels``."""

    ids: tuple[str, ...] = ()
    severities: tuple[Severity, ...] = ()
    channels: tuple[str, ...]

    def matches(self, esc_id: str, severity: Severity) -> bool:
        """Whether this route takes the escalation ``esc_id`` of ``severity``."""
        if self.ids and not any(fnmatch.fnmatchcase(esc_id, p) for p in self.ids):
            return False
        return not self.severities or severity in self.severities

    def describe(self) -> str:
        """The route in the environment's syntax, for messages."""
        left = "|".join([*self.ids, *(f"@{s}" for s in self.severities)]) or "*"
        return f"{left}={'+'.join(self.channels)}"


class Router(msgspec.Struct, frozen=True, kw_only=True):
    """Routes in order, the default channels, and the severity table's overrides."""

    routes: tuple[Route, ...] = ()
    default: tuple[str, ...] = ("terminal",)
    severity: tuple[tuple[str, Severity], ...] = ()
    """Id glob -> severity, tried before :data:`DEFAULT_SEVERITY`."""

    def severity_of(self, esc_id: str) -> Severity:
        """Return the escalation's severity (``warning`` when no pattern matches)."""
        for pattern, severity in (*self.severity, *DEFAULT_SEVERITY):
            if fnmatch.fnmatchcase(esc_id, pattern):
                return severity
        return Severity.WARNING

    def channels_for(self, esc_id: str) -> tuple[str, ...]:
        """Return the channels of the first route that matches, else the default ones."""
        severity = self.severity_of(esc_id)
        for route in self.routes:
            if route.matches(esc_id, severity):
                return route.channels
        return self.default


def parse_route(text: str) -> Route:
    """Parse a route in the environment's syntax: ``<patterns>=<channel>[+<channel>...]``.

    ``<patterns>`` is ``|``-separated; each is an id glob (``failed:*``, ``cleanup-deadline``,
    ``*``) or ``@<severity>`` (``@critical``). Id globs and severities combine as in
    :class:`Route`: any of the globs, and any of the severities.

    Raises:
        ValueError: no ``=``, no channel, an empty pattern or an unknown severity.
    """
    left, sep, right = text.strip().rpartition("=")
    channels = tuple(c.strip() for c in right.split("+") if c.strip())
    if not sep or not left.strip() or not channels:
        raise ValueError(f"route {text!r} is not <id glob|@severity>=<channel>[+<channel>...]")
    ids: list[str] = []
    severities: list[Severity] = []
    for raw in left.split("|"):
        pattern = raw.strip()
        if not pattern:
            raise ValueError(f"route {text!r} has an empty pattern")
        if pattern.startswith("@"):
            name = pattern[1:]
            for known in SEVERITIES:
                if name == known:
                    severities.append(known)
                    break
            else:
                raise ValueError(
                    f"route {text!r}: unknown severity {name!r} (one of {', '.join(SEVERITIES)})"
                )
        elif pattern != "*":
            ids.append(pattern)
    return Route(ids=tuple(ids), severities=tuple(severities), channels=channels)

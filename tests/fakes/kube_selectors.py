"""Label and field selectors as the Kubernetes API server parses them (part of the test double).

Grammar of ``labelSelector`` (k8s.io/apimachinery ``labels.Parse``): requirements joined by commas,
each one of ``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)``,
``key notin (a,b)``, ``key>N``, ``key<N``. ``!=`` and ``notin`` also match objects without the key.
``fieldSelector`` supports ``=``, ``==`` and ``!=`` on the fields each kind allows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FieldSelector", "LabelSelector", "SelectorError"]

_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class SelectorError(ValueError):
    """A selector string that the API server would refuse with 400 BadRequest."""


@dataclass(frozen=True, kw_only=True)
class _Requirement:
    key: str
    op: str  # "exists" "!" "=" "!=" "in" "notin" "gt" "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case "exists":
                return present
            case "!":
                return not present
            case "=" | "in":
                return present and value in self.values
            case "!=" | "notin":
                return not present or value not in self.values
            case "gt" | "lt":
                if value is None:
                    return False
                try:
                    number = int(value)
                except ValueError:
                    return False
                bound = int(self.values[0])
                return number > bound if self.op == "gt" else number < bound
            case _:
                raise AssertionError(self.op)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _check_key(key: str, raw: str) -> str:
    if not _QUALIFIED_NAME.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {raw!r}")
    return key


def _check_value(value: str, raw: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise SelectorError(
            f"unable to parse requirement: invalid label value {value!r} in {raw!r}"
        )
    return value


_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([^=!<>\s]+)\s*(==|=|!=|>|<)\s*(\S*)\s*$")


@dataclass(frozen=True)
class LabelSelector:
    """A parsed ``labelSelector``; the empty selector matches everything."""

    requirements: tuple[_Requirement, ...]

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """Parse a label selector string.

        Raises:
            SelectorError: the string is not a valid selector.
        """
        if text is None or not text.strip():
            return cls(())
        reqs: list[_Requirement] = []
        for raw in _split_top_level(text):
            part = raw.strip()
            if not part:
                raise SelectorError(f"found '', expected: identifier in {text!r}")
            if m := _SET_RE.match(part):
                key, op, body = m.group(1), m.group(2), m.group(3)
                values = tuple(_check_value(v.strip(), text) for v in body.split(","))
                if values == ("",):
                    values = ()
                reqs.append(_Requirement(key=_check_key(key, text), op=op, values=values))
            elif part.startswith("!"):
                reqs.append(_Requirement(key=_check_key(part[1:].strip(), text), op="!"))
            elif m := _CMP_RE.match(part):
                key, op, value = m.group(1), m.group(2), m.group(3)
                if op in (">", "<"):
                    if not value.lstrip("-").isdigit():
                        raise SelectorError(
                            f"unable to parse requirement: for 'gt', 'lt' operators, "
                            f"the value must be an integer: {part!r}"
                        )
                    reqs.append(
                        _Requirement(
                            key=_check_key(key, text),
                            op="gt" if op == ">" else "lt",
                            values=(value,),
                        )
                    )
                else:
                    reqs.append(
                        _Requirement(
                            key=_check_key(key, text),
                            op="!=" if op == "!=" else "=",
                            values=(_check_value(value, text),),
                        )
                    )
            elif re.fullmatch(r"\S+", part):
                reqs.append(_Requirement(key=_check_key(part, text), op="exists"))
            else:
                raise SelectorError(f"unable to parse requirement: {part!r} in {text!r}")
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Tell whether an object's labels satisfy every requirement."""
        actual = labels or {}
        return all(r.matches(actual) for r in self.requirements)


def _dotted(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed ``fieldSelector`` over the fields one kind supports."""

    terms: tuple[tuple[str, bool, str], ...]  # (field, equal?, value)

    @classmethod
    def parse(cls, text: str | None, supported: frozenset[str]) -> FieldSelector:
        """Parse a field selector string against the kind's supported fields.

        Raises:
            SelectorError: the syntax is wrong or a field is not supported for the kind.
        """
        if text is None or not text.strip():
            return cls(())
        terms: list[tuple[str, bool, str]] = []
        for raw in text.split(","):
            part = raw.strip()
            m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", part)
            if m is None:
                raise SelectorError(f"invalid selector: {text!r}; can't understand {part!r}")
            field, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
            if field not in supported:
                raise SelectorError(f'field label not supported: "{field}"')
            terms.append((field, op != "!=", value))
        return cls(tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Tell whether an object satisfies every term."""
        return all((_dotted(obj, f) == v) is eq for f, eq, v in self.terms)

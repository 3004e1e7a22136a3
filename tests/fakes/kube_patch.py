"""PATCH bodies as the Kubernetes API server applies them (part of the test double).

- ``application/merge-patch+json``: RFC 7386 (``null`` deletes a key, lists are replaced whole).
- ``application/json-patch+json``: RFC 6902 (add, remove, replace, move, copy, test).
- ``application/strategic-merge-patch+json``: a **minimal** strategic merge, built-in kinds only.
  It merges the lists that carry ``patchStrategy=merge`` in k8s.io/api by their ``patchMergeKey``
  for the fields listed in :data:`STRATEGIC_LIST_KEYS` (pods, jobs, nodes, and ``metadata``) and
  replaces every other list; it honours ``$patch: delete|replace|merge``, ``$retainKeys`` and
  ``$deleteFromPrimitiveList/<field>``, and drops ``$setElementOrder/<field>`` (order only).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = [
    "STRATEGIC_LIST_KEYS",
    "PatchError",
    "PatchTestFailed",
    "apply_json_patch",
    "apply_merge_patch",
    "apply_strategic_merge_patch",
]

JsonObject = dict[str, Any]

_METADATA_LISTS: dict[tuple[str, ...], str] = {
    ("metadata", "finalizers"): "",  # primitive list, merged as a set
    ("metadata", "ownerReferences"): "uid",
}
_POD_SPEC_LISTS: dict[tuple[str, ...], str] = {
    ("containers",): "name",
    ("initContainers",): "name",
    ("ephemeralContainers",): "name",
    ("volumes",): "name",
    ("imagePullSecrets",): "name",
    ("containers", "env"): "name",
    ("containers", "ports"): "containerPort",
    ("containers", "volumeMounts"): "mountPath",
    ("initContainers", "env"): "name",
    ("initContainers", "ports"): "containerPort",
    ("initContainers", "volumeMounts"): "mountPath",
}

STRATEGIC_LIST_KEYS: dict[str, dict[tuple[str, ...], str]] = {
    "Pod": {
        **_METADATA_LISTS,
        **{("spec", *k): v for k, v in _POD_SPEC_LISTS.items()},
        ("status", "conditions"): "type",
    },
    "Job": {
        **_METADATA_LISTS,
        **{("spec", "template", "spec", *k): v for k, v in _POD_SPEC_LISTS.items()},
        ("status", "conditions"): "type",
    },
    "Node": {
        **_METADATA_LISTS,
        ("spec", "podCIDRs"): "",
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
    },
    "Event": dict(_METADATA_LISTS),
}
"""Merge keys of lists with ``patchStrategy=merge`` per kind; ``""`` marks a primitive list."""


class PatchError(ValueError):
    """A patch that cannot be decoded or applied."""


class PatchTestFailed(PatchError):
    """A JSON patch ``test`` operation (or a path it needs) did not hold."""


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch and return the result (inputs are not changed)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: JsonObject = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"JSON pointer must be empty or start with '/': {pointer!r}")
    return [_unescape(t) for t in pointer[1:].split("/")]


def _resolve_parent(doc: Any, tokens: list[str], op: str, pointer: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise PatchTestFailed(
                f'{op} operation does not apply: doc is missing path: "{pointer}": missing value'
            )
    return node


def _list_index(node: list[Any], token: str, *, allow_end: bool, op: str, pointer: str) -> int:
    if token == "-" and allow_end:
        return len(node)
    if not token.isdigit():
        raise PatchTestFailed(
            f'{op} operation does not apply: invalid index "{token}" in {pointer}'
        )
    index = int(token)
    limit = len(node) if allow_end else len(node) - 1
    if index > limit:
        raise PatchTestFailed(
            f"{op} operation does not apply: index out of bounds: {index} in {pointer}"
        )
    return index


def _get(doc: Any, pointer: str, op: str) -> Any:
    tokens = _split_pointer(pointer)
    if not tokens:
        return doc
    parent = _resolve_parent(doc, tokens, op, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchTestFailed(
                f"{op} operation does not apply: doc is missing key: {pointer}: missing value"
            )
        return parent[last]
    if isinstance(parent, list):
        return parent[_list_index(parent, last, allow_end=False, op=op, pointer=pointer)]
    raise PatchTestFailed(f"{op} operation does not apply: {pointer} is not a container")


def _remove(doc: Any, pointer: str, op: str) -> Any:
    tokens = _split_pointer(pointer)
    if not tokens:
        raise PatchError(f"{op} operation does not apply: cannot remove the whole document")
    parent = _resolve_parent(doc, tokens, op, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchTestFailed(
                f"{op} operation does not apply: doc is missing key: {pointer}: missing value"
            )
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, last, allow_end=False, op=op, pointer=pointer))
    raise PatchTestFailed(f"{op} operation does not apply: {pointer} is not a container")


def _add(doc: Any, pointer: str, value: Any, op: str) -> Any:
    tokens = _split_pointer(pointer)
    if not tokens:
        return value
    parent = _resolve_parent(doc, tokens, op, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, last, allow_end=True, op=op, pointer=pointer), value)
    else:
        raise PatchTestFailed(f"{op} operation does not apply: {pointer} is not a container")
    return doc


def apply_json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch and return the result (the input is not changed).

    Raises:
        PatchError: the patch is not a list of operations (the server answers 400).
        PatchTestFailed: an operation does not apply, or a ``test`` fails (the server answers 422).
    """
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, Mapping) or "op" not in operation:
            raise PatchError(f"invalid JSON patch operation: {operation!r}")
        op = operation["op"]
        path = operation.get("path")
        if not isinstance(path, str):
            raise PatchError(f'{op} operation does not apply: missing "path"')
        match op:
            case "add":
                doc = _add(doc, path, copy.deepcopy(operation.get("value")), op)
            case "remove":
                _remove(doc, path, op)
            case "replace":
                _get(doc, path, op)  # must exist
                if _split_pointer(path):
                    _remove(doc, path, op)
                doc = _add(doc, path, copy.deepcopy(operation.get("value")), op)
            case "move" | "copy":
                source = operation.get("from")
                if not isinstance(source, str):
                    raise PatchError(f'{op} operation does not apply: missing "from"')
                value = (
                    _remove(doc, source, op)
                    if op == "move"
                    else copy.deepcopy(_get(doc, source, op))
                )
                doc = _add(doc, path, value, op)
            case "test":
                if _get(doc, path, op) != operation.get("value"):
                    raise PatchTestFailed(f"testing value {path} failed: test failed")
            case _:
                raise PatchError(f"Unexpected kind: {op}")
    return doc


def _strategic_list(
    original: list[Any],
    patch: list[Any],
    key: str,
    path: tuple[str, ...],
    table: Mapping[tuple[str, ...], str],
) -> list[Any]:
    if key == "":
        merged = list(original)
        merged.extend(v for v in patch if v not in merged)
        return merged
    if any(isinstance(i, Mapping) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and "$patch" in i)]
    result = [copy.deepcopy(i) for i in original]
    for item in patch:
        if not isinstance(item, Mapping) or key not in item:
            raise PatchError(f"map: {item!r} does not contain declared merge key: {key}")
        position = next(
            (
                n
                for n, old in enumerate(result)
                if isinstance(old, Mapping) and old.get(key) == item[key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                result.pop(position)
            continue
        if position is None:
            result.append(_strategic_map({}, item, path, table))
        else:
            result[position] = _strategic_map(result[position], item, path, table)
    return result


def _strategic_map(
    original: Mapping[str, Any],
    patch: Mapping[str, Any],
    path: tuple[str, ...],
    table: Mapping[tuple[str, ...], str],
) -> JsonObject:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    result: JsonObject = copy.deepcopy(dict(original))
    retain = patch.get("$retainKeys")
    for field, value in patch.items():
        if field in ("$patch", "$retainKeys") or field.startswith("$setElementOrder/"):
            continue
        if field.startswith("$deleteFromPrimitiveList/"):
            name = field.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        child = (*path, field)
        if value is None:
            result.pop(field, None)
        elif isinstance(value, Mapping):
            old = result.get(field)
            result[field] = _strategic_map(
                old if isinstance(old, Mapping) else {}, value, child, table
            )
        elif isinstance(value, list) and child in table and isinstance(result.get(field), list):
            result[field] = _strategic_list(result[field], value, table[child], child, table)
        elif isinstance(value, list) and child in table:
            result[field] = _strategic_list([], value, table[child], child, table)
        else:
            result[field] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def apply_strategic_merge_patch(target: Mapping[str, Any], patch: Any, kind: str) -> JsonObject:
    """Apply a (minimal) strategic merge patch to a built-in kind.

    Raises:
        PatchError: the patch is not an object, or a keyed list item lacks its merge key.
    """
    if not isinstance(patch, Mapping):
        raise PatchError("strategic merge patch must be a JSON object")
    return _strategic_map(target, patch, (), STRATEGIC_LIST_KEYS.get(kind, {}))

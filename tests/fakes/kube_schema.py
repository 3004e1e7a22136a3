"""Structural-schema handling of custom resources, as a recent API server does it (a checker for
unit tests: what the lane's kube-apiserver 1.20 can't check, CEL rules and ``fieldValidation=
Strict``, is checked with it against the unchanged Trainer v2.3.0 CRD, :data:`TRAINJOB_SCHEMA`).

For a CRD's served version this module reproduces, in the API server's order:

1. **Pruning** of fields the schema does not declare, reported per ``fieldValidation``:
   ``Ignore`` drops them silently, ``Warn`` (the default since v1.23) drops them and returns
   ``unknown field "<path>"`` warnings for the ``Warning`` header, ``Strict`` refuses the request
   (400 BadRequest, ``strict decoding error: ...``). ``null`` values of non-nullable fields are
   dropped, as the server does before defaulting. Top-level ``metadata`` is checked against
   ObjectMeta's fields.
2. **Defaulting** from ``default``.
3. **Validation** (OpenAPI v3 subset used by controller-gen): ``type`` (with
   ``x-kubernetes-int-or-string`` and ``anyOf`` of types), ``format`` int32/int64/date-time,
   ``required``, ``enum``, ``minimum``/``maximum`` (and exclusive), ``minLength``/``maxLength``
   (characters), ``minItems``/``maxItems``, ``minProperties``/``maxProperties``, ``pattern``,
   ``x-kubernetes-list-type`` ``map``/``set`` uniqueness.
4. **x-kubernetes-validations** (CEL): there is no CEL interpreter here. Rules whose text has one
   of these shapes are enforced exactly: ``self == oldSelf`` (transition rule, list-map items
   correlated by key), ``self in ['a', ...]``, ``self.matches('re')``,
   ``self == '' || self.matches('re')``, ``has(self.f)``, ``size(self.metadata.name) <= N`` and
   ``self.metadata.name.matches('re')``. Every other rule is **not enforced** and is listed in
   :attr:`CrdSchema.unenforced_rules`; for the Trainer v2.3.0 TrainJob CRD that list is empty
   (all its 17 rules have the shapes above), a test pins this.

Errors carry the API server's ``field.Error`` wording (``spec.x: Invalid value: ...``), close to,
but not byte for byte, what kube-openapi prints.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CRD_DIR", "TRAINJOB_SCHEMA", "CrdSchema", "FieldError", "StrictDecodingError"]

JsonObject = dict[str, Any]

_OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


class StrictDecodingError(ValueError):
    """Unknown fields under ``fieldValidation=Strict`` (the server answers 400 BadRequest)."""

    def __init__(self, unknown: list[str]) -> None:
        super().__init__(
            "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown)
        )
        self.unknown = unknown


def _render_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return "null"
    return '"object"' if isinstance(value, Mapping) else '"array"'


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return "null"


@dataclass(frozen=True, kw_only=True)
class FieldError:
    """One ``field.Error`` of the API server: its type (cause reason), path and message body."""

    reason: str
    """Cause reason, e.g. ``FieldValueInvalid``, ``FieldValueRequired``."""
    field: str
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@dataclass(frozen=True, kw_only=True)
class _Rule:
    rule: str
    message: str


@dataclass(kw_only=True)
class _Walk:
    field_validation: str
    unknown: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)


def _cel_check(rule: str, value: Any, old: Any, has_old: bool) -> bool | None:
    """Evaluate a recognised rule; None means "shape not recognised" (or not applicable)."""
    if rule == "self == oldSelf":
        return value == old if has_old else True
    if m := re.fullmatch(r"self in \[(.*)\]", rule):
        options = [o.strip().strip("'\"") for o in m.group(1).split(",")]
        return value in options
    if m := re.fullmatch(r"self\.matches\('(.*)'\)", rule):
        return isinstance(value, str) and re.search(m.group(1), value) is not None
    if m := re.fullmatch(r"self == '' \|\| self\.matches\('(.*)'\)", rule):
        return value == "" or (isinstance(value, str) and re.search(m.group(1), value) is not None)
    if m := re.fullmatch(r"has\(self\.(\w+)\)", rule):
        return isinstance(value, Mapping) and m.group(1) in value
    name = value.get("metadata", {}).get("name", "") if isinstance(value, Mapping) else ""
    if m := re.fullmatch(r"size\(self\.metadata\.name\) <= (\d+)", rule):
        return len(name) <= int(m.group(1))
    if m := re.fullmatch(r"self\.metadata\.name\.matches\('(.*)'\)", rule):
        return re.search(m.group(1), name) is not None
    return None


def _recognised(rule: str) -> bool:
    return _cel_check(rule, {}, None, has_old=False) is not None or rule == "self == oldSelf"


class CrdSchema:
    """The structural schema of one served version of a CRD."""

    def __init__(self, crd: Mapping[str, Any], version: str | None = None) -> None:
        spec = crd["spec"]
        served = [v for v in spec["versions"] if v.get("served", True)]
        chosen = next(
            (v for v in served if v["name"] == version)
            if version
            else (v for v in served if v.get("storage")),
            None,
        )
        if chosen is None:
            raise ValueError(f"CRD {crd['metadata']['name']} serves no version {version!r}")
        self.group: str = spec["group"]
        self.version: str = chosen["name"]
        self.kind: str = spec["names"]["kind"]
        self.plural: str = spec["names"]["plural"]
        self.namespaced: bool = spec["scope"] == "Namespaced"
        self.has_status: bool = "status" in (chosen.get("subresources") or {})
        self.root: JsonObject = chosen["schema"]["openAPIV3Schema"]
        self.unenforced_rules: list[tuple[str, str]] = [
            (path, rule.rule)
            for path, rule in self._rules(self.root, "")
            if not _recognised(rule.rule)
        ]

    @classmethod
    def load(cls, path: Path, version: str | None = None) -> CrdSchema:
        """Read a CRD YAML file (the storage version unless ``version`` is given)."""
        with path.open("rb") as handle:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            return cls(yaml.load(handle, Loader=loader), version)

    def _rules(self, schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, _Rule]]:
        for raw in schema.get("x-kubernetes-validations") or ():
            yield path, _Rule(rule=raw["rule"], message=raw.get("message", raw["rule"]))
        for name, sub in (schema.get("properties") or {}).items():
            yield from self._rules(sub, _join(path, name))
        if isinstance(schema.get("items"), Mapping):
            yield from self._rules(schema["items"], path + "[*]")
        if isinstance(schema.get("additionalProperties"), Mapping):
            yield from self._rules(schema["additionalProperties"], path + "[*]")

    def admit(
        self,
        obj: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        *,
        field_validation: str,
    ) -> tuple[JsonObject, list[str], list[FieldError]]:
        """Prune, default and validate one object.

        Args:
            obj: the decoded request body (already reduced to what the verb may change).
            old: the stored object on update, for transition rules; None on create.
            field_validation: ``Ignore``, ``Warn`` or ``Strict``.

        Returns:
            The pruned and defaulted object, the warnings for the ``Warning`` header, and the
            validation errors (empty when valid).

        Raises:
            StrictDecodingError: unknown fields under ``Strict``.
        """
        walk = _Walk(field_validation=field_validation)
        result = copy.deepcopy(dict(obj))
        self._prune_root(result, walk)
        if walk.unknown and field_validation == "Strict":
            raise StrictDecodingError(walk.unknown)
        self._default(result, self.root)
        self._validate(result, self.root, "", walk, old, old is not None)
        warnings = (
            [f'unknown field "{p}"' for p in walk.unknown] if field_validation == "Warn" else []
        )
        return result, warnings, walk.errors

    # -- pruning -------------------------------------------------------------------------------

    def _prune_root(self, obj: JsonObject, walk: _Walk) -> None:
        props = self.root.get("properties") or {}
        for key in list(obj):
            if key in ("apiVersion", "kind"):
                continue
            if key == "metadata":
                meta = obj["metadata"]
                if isinstance(meta, dict):
                    for mkey in list(meta):
                        if mkey not in _OBJECT_META_FIELDS:
                            walk.unknown.append(f"metadata.{mkey}")
                            del meta[mkey]
                continue
            if key not in props:
                walk.unknown.append(key)
                del obj[key]
            else:
                obj[key] = self._prune(obj[key], props[key], key, walk)
                if obj[key] is None:
                    del obj[key]

    def _prune(self, value: Any, schema: Mapping[str, Any], path: str, walk: _Walk) -> Any:
        if value is None:
            return None if not schema.get("nullable") else value
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return value
        if isinstance(value, dict) and schema.get("type") == "object":
            props = schema.get("properties")
            extra = schema.get("additionalProperties")
            for key in list(value):
                if props is not None and key in props:
                    sub = props[key]
                elif isinstance(extra, Mapping):
                    sub = extra
                elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                    continue
                else:
                    walk.unknown.append(_join(path, key))
                    del value[key]
                    continue
                pruned = self._prune(value[key], sub, _join(path, key), walk)
                if pruned is None:
                    del value[key]
                else:
                    value[key] = pruned
            return value
        if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            return [
                self._prune(item, schema["items"], f"{path}[{n}]", walk)
                for n, item in enumerate(value)
            ]
        return value

    # -- defaulting ----------------------------------------------------------------------------

    def _default(self, value: Any, schema: Mapping[str, Any]) -> None:
        if isinstance(value, dict):
            for key, sub in (schema.get("properties") or {}).items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    self._default(value[key], sub)
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping):
                for item in value.values():
                    self._default(item, extra)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            for item in value:
                self._default(item, schema["items"])

    # -- validation ----------------------------------------------------------------------------

    def _type_ok(self, value: Any, schema: Mapping[str, Any]) -> bool:
        if schema.get("x-kubernetes-int-or-string"):
            return isinstance(value, str) or (
                isinstance(value, int) and not isinstance(value, bool)
            )
        wanted = schema.get("type")
        if wanted is None:
            alternatives = schema.get("anyOf") or schema.get("oneOf")
            if alternatives:
                return any(self._type_ok(value, alt) for alt in alternatives)
            return True
        actual = _type_name(value)
        return actual == wanted or (wanted == "number" and actual == "integer")

    def _validate(
        self,
        value: Any,
        schema: Mapping[str, Any],
        path: str,
        walk: _Walk,
        old: Any,
        has_old: bool,
    ) -> None:
        shown = path or "<nil>"
        errors = walk.errors
        if not self._type_ok(value, schema):
            wanted = "integer" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
            errors.append(
                FieldError(
                    reason="FieldValueTypeInvalid",
                    field=shown,
                    body=f"Invalid value: {_render_value(value)}: {shown} in body must be of type "
                    f"{wanted}: {json.dumps(_type_name(value))}",
                )
            )
            return
        if "enum" in schema and value not in schema["enum"]:
            supported = ", ".join(json.dumps(v) for v in schema["enum"])
            errors.append(
                FieldError(
                    reason="FieldValueNotSupported",
                    field=shown,
                    body=f"Unsupported value: {_render_value(value)}: "
                    f"supported values: {supported}",
                )
            )
        if isinstance(value, str):
            self._validate_string(value, schema, shown, errors)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self._validate_number(value, schema, shown, errors)
        elif isinstance(value, list):
            self._validate_list(value, schema, path, walk, old, has_old)
        elif isinstance(value, dict):
            self._validate_object(value, schema, path, walk, old, has_old)
        for raw in schema.get("x-kubernetes-validations") or ():
            outcome = _cel_check(raw["rule"], value, old, has_old)
            if outcome is False:
                kind = "object" if isinstance(value, dict) else _type_name(value)
                errors.append(
                    FieldError(
                        reason="FieldValueInvalid",
                        field=shown,
                        body=f'Invalid value: "{kind}": {raw.get("message", raw["rule"])}',
                    )
                )

    def _validate_string(
        self, value: str, schema: Mapping[str, Any], shown: str, errors: list[FieldError]
    ) -> None:
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                FieldError(
                    reason="FieldValueTooLong",
                    field=shown,
                    body=f"Too long: may not be more than {schema['maxLength']} bytes",
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                FieldError(
                    reason="FieldValueInvalid",
                    field=shown,
                    body=f"Invalid value: {_render_value(value)}: {shown} in body should be at "
                    f"least {schema['minLength']} chars long",
                )
            )
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            errors.append(
                FieldError(
                    reason="FieldValueInvalid",
                    field=shown,
                    body=f"Invalid value: {_render_value(value)}: {shown} in body should match "
                    f"'{schema['pattern']}'",
                )
            )
        if schema.get("format") == "date-time" and not _DATE_TIME.match(value):
            errors.append(
                FieldError(
                    reason="FieldValueInvalid",
                    field=shown,
                    body=f"Invalid value: {_render_value(value)}: {shown} in body must be of type "
                    f"date-time: {json.dumps(value)}",
                )
            )

    def _validate_number(
        self, value: float, schema: Mapping[str, Any], shown: str, errors: list[FieldError]
    ) -> None:
        bounds = _INT_RANGES.get(schema.get("format", ""))
        if bounds and not bounds[0] <= value <= bounds[1]:
            errors.append(
                FieldError(
                    reason="FieldValueInvalid",
                    field=shown,
                    body=f"Invalid value: {value}: {shown} in body must be of type "
                    f"{schema['format']}: {json.dumps(str(value))}",
                )
            )
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                rel = (
                    "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                )
                errors.append(
                    FieldError(
                        reason="FieldValueInvalid",
                        field=shown,
                        body=f"Invalid value: {value}: {shown} in body should be {rel} {low}",
                    )
                )
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                rel = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                errors.append(
                    FieldError(
                        reason="FieldValueInvalid",
                        field=shown,
                        body=f"Invalid value: {value}: {shown} in body should be {rel} {high}",
                    )
                )

    def _validate_list(
        self,
        value: list[Any],
        schema: Mapping[str, Any],
        path: str,
        walk: _Walk,
        old: Any,
        has_old: bool,
    ) -> None:
        shown = path or "<nil>"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            walk.errors.append(
                FieldError(
                    reason="FieldValueTooMany",
                    field=shown,
                    body=f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            walk.errors.append(
                FieldError(
                    reason="FieldValueInvalid",
                    field=shown,
                    body=f"Invalid value: {len(value)}: {shown} in body should have at least "
                    f"{schema['minItems']} items",
                )
            )
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: list[Any] = []
        old_items: dict[str, Any] = {}
        if list_type == "map" and has_old and isinstance(old, list):
            for item in old:
                if isinstance(item, Mapping):
                    old_items[json.dumps([item.get(k) for k in keys])] = item
        items = schema.get("items")
        for n, item in enumerate(value):
            identity: Any = item
            if list_type == "map" and isinstance(item, Mapping):
                identity = [item.get(k) for k in keys]
            if list_type in ("map", "set"):
                if identity in seen:
                    walk.errors.append(
                        FieldError(
                            reason="FieldValueDuplicate",
                            field=f"{path}[{n}]",
                            body=f"Duplicate value: {json.dumps(identity)}",
                        )
                    )
                seen.append(identity)
            if isinstance(items, Mapping):
                key = json.dumps(identity) if list_type == "map" else None
                old_item = old_items.get(key) if key is not None else None
                self._validate(item, items, f"{path}[{n}]", walk, old_item, old_item is not None)

    def _validate_object(
        self,
        value: Mapping[str, Any],
        schema: Mapping[str, Any],
        path: str,
        walk: _Walk,
        old: Any,
        has_old: bool,
    ) -> None:
        shown = path or "<nil>"
        for name in schema.get("required") or ():
            if name not in value:
                walk.errors.append(
                    FieldError(
                        reason="FieldValueRequired", field=_join(path, name), body="Required value"
                    )
                )
        for bound, word, cmp in (
            ("minProperties", "at least", -1),
            ("maxProperties", "at most", 1),
        ):
            if bound in schema and (len(value) - schema[bound]) * cmp > 0:
                walk.errors.append(
                    FieldError(
                        reason="FieldValueInvalid" if cmp < 0 else "FieldValueTooMany",
                        field=shown,
                        body=f"Invalid value: {len(value)}: {shown} in body should have {word} "
                        f"{schema[bound]} properties",
                    )
                )
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        old_map = old if has_old and isinstance(old, Mapping) else {}
        for key, item in value.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            sub = props.get(key) if key in props else extra if isinstance(extra, Mapping) else None
            if sub is None:
                continue
            child = _join(path, key) if key in props else f"{path}[{key}]"
            self._validate(item, sub, child, walk, old_map.get(key), key in old_map)


CRD_DIR = Path(__file__).resolve().parent.parent / "data" / "kubeflow-crds"
TRAINJOB_SCHEMA = CrdSchema.load(CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml")
"""The storage version (v1alpha1) of the unchanged Trainer v2.3.0 TrainJob CRD."""

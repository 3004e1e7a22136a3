"""The core's Structs are not tracked by the garbage collector (``gc=False``, issue 11:
speed), which is safe only while none of them can be part of a reference cycle: each is
frozen, and every field holds values that can't refer back to it (scalars, enums, tuples
and frozensets of those, other such Structs, and ``dict[str, str]``).

A new field of a mutable type that could hold an object (a list of Structs, a ``dict`` of
``Any``) fails here: give that Struct ``gc=True``, or the field an immutable type.
"""

from __future__ import annotations

import datetime as dt
import enum
import gc
import importlib
import pkgutil
import types
import typing
from typing import Annotated, Literal, Union, get_args, get_origin

import msgspec
import pytest

import dispatch_core
from dispatch_core import Job, JobSpec

_SCALARS: frozenset[object] = frozenset(
    {str, int, float, bool, bytes, dt.datetime, dt.timedelta, dt.date, type(None)}
)


def _core_structs() -> list[type[msgspec.Struct]]:
    found: dict[str, type[msgspec.Struct]] = {}
    for info in pkgutil.iter_modules(dispatch_core.__path__):
        module = importlib.import_module(f"dispatch_core.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, msgspec.Struct)
                and obj.__module__ == module.__name__
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


_STRUCTS = _core_structs()
_UNTRACKED = [s for s in _STRUCTS if not s.__struct_config__.gc]


def _acyclic(tp: object, path: str) -> None:
    """Fail unless values of type ``tp`` can't refer back to what holds them."""
    if tp in _SCALARS:
        return
    origin = get_origin(tp)
    if origin is Annotated:
        _acyclic(get_args(tp)[0], path)
    elif origin is Literal:
        return
    elif origin in (Union, types.UnionType, tuple, frozenset):
        for arg in get_args(tp):
            if arg is not Ellipsis:
                _acyclic(arg, path)
    elif origin is dict:
        key, value = get_args(tp)
        assert key in _SCALARS, f"{path}: {tp} may hold objects"
        assert value in _SCALARS, f"{path}: {tp} may hold objects"
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        return
    elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        assert tp.__struct_config__.frozen, f"{path}: {tp.__qualname__} is not frozen"
        if tp.__struct_config__.gc and tp not in _CHECKING:
            # Job: tracked, but what it holds must be acyclic all the same (its __dict__
            # caches tuples of positions and dicts of keys to positions).
            _CHECKING.add(tp)
            _fields_acyclic(tp)
    else:
        pytest.fail(f"{path}: {tp!r} is not known to be free of cycles")


def test_most_core_structs_are_untracked() -> None:
    # Job keeps a __dict__ for its cached lookups (msgspec refuses dict=True with gc=False).
    assert {s for s in _STRUCTS if s.__struct_config__.gc} == {Job}
    assert len(_UNTRACKED) > 30


_CHECKING: set[type[msgspec.Struct]] = set()


def _fields_acyclic(struct: type[msgspec.Struct]) -> None:
    hints = typing.get_type_hints(struct, include_extras=True)
    for name in struct.__struct_fields__:
        _acyclic(hints[name], f"{struct.__qualname__}.{name}")


@pytest.mark.parametrize("struct", _UNTRACKED, ids=lambda s: s.__qualname__)
def test_an_untracked_struct_is_frozen_and_holds_no_mutable_objects(
    struct: type[msgspec.Struct],
) -> None:
    assert struct.__struct_config__.frozen
    _fields_acyclic(struct)


def test_an_untracked_struct_is_not_tracked_even_holding_a_container() -> None:
    spec = JobSpec(cluster="c", command=("train",), env={"A": "1"})
    assert not gc.is_tracked(spec)

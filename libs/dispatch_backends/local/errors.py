"""The local backend's errors (besides the protocol's)."""

from __future__ import annotations

from dispatch_backends.protocol import (
    BackendError,
)

# -- errors ------------------------------------------------------------------------------


class ObjectNotFound(BackendError):
    """No object with that id exists in the data directory (never made, or archived)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"no object {object_id!r}")
        self.object_id = object_id


class AdminHeldError(BackendError):
    """:meth:`LocalBackend.open_gate` was asked to open a gate held by an admin; dispatch
    never opens that one (seed 002, ``admin-held:<object id>``)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"object {object_id}: the gate is held by an admin")
        self.object_id = object_id


class FaultError(ValueError):
    """A fault could not be injected (no such object, or not in a state it applies to)."""

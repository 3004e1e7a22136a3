"""dispatch_backends: one adapter per scheduler behind one Protocol (DESIGN.md section 7)."""

from dispatch_backends.protocol import (
    Backend,
    BackendError,
    CessationAnswer,
    CessationSignal,
    EmergencyStopper,
    LaunchRefusedError,
    LaunchUnknownError,
    Snapshot,
    Unreachable,
    object_name,
)

__all__ = [
    "Backend",
    "BackendError",
    "CessationAnswer",
    "CessationSignal",
    "EmergencyStopper",
    "LaunchRefusedError",
    "LaunchUnknownError",
    "Snapshot",
    "Unreachable",
    "object_name",
]

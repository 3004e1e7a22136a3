"""dispatch_backends: one adapter per scheduler behind one Protocol (DESIGN.md section 7)."""

from dispatch_backends.config import (
    BackendNotAvailable,
    ClusterConfig,
    ClustersConfig,
    ClustersConfigError,
    declarations_of,
    load_clusters,
    make_backend,
)
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
    "BackendNotAvailable",
    "CessationAnswer",
    "CessationSignal",
    "ClusterConfig",
    "ClustersConfig",
    "ClustersConfigError",
    "EmergencyStopper",
    "LaunchRefusedError",
    "LaunchUnknownError",
    "Snapshot",
    "Unreachable",
    "declarations_of",
    "load_clusters",
    "make_backend",
    "object_name",
]

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
from dispatch_backends.options import InvalidOption, check_options
from dispatch_backends.protocol import (
    Backend,
    BackendError,
    CessationAnswer,
    CessationSignal,
    Closable,
    EmergencyStopper,
    LaunchRefusedError,
    LaunchUnknownError,
    Snapshot,
    Unreachable,
    close_backend,
    object_name,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendNotAvailable",
    "CessationAnswer",
    "CessationSignal",
    "Closable",
    "ClusterConfig",
    "ClustersConfig",
    "ClustersConfigError",
    "EmergencyStopper",
    "InvalidOption",
    "LaunchRefusedError",
    "LaunchUnknownError",
    "Snapshot",
    "Unreachable",
    "check_options",
    "close_backend",
    "declarations_of",
    "load_clusters",
    "make_backend",
    "object_name",
]

"""Cluster configuration shared by every service: which clusters exist and how to reach them.

One clusters file (TOML, or JSON) lists every cluster dispatch runs jobs on. Each entry has a
``name`` (the cluster token of subjects and ``ObjectRef``), a ``backend`` (``local``,
``slurm`` or ``kubeflow``) and that backend's settings, flat beside them::

    [[clusters]]
    name = "local"
    backend = "local"
    data_dir = "/var/lib/dispatch/local"
    kill_wait_s = 10
    node_loss_window_s = 60

The observer of a cluster and every supervisor replica read the same file, so they build the
same backend for a cluster (the local backend's objects live in ``data_dir``, which they
share). :func:`load_clusters` parses and checks it; :func:`make_backend` builds the backend of
one entry.

Each backend's settings are the fields of its settings struct (``LocalCluster``,
:class:`~dispatch_backends.slurm.settings.SlurmSettings`,
:class:`~dispatch_backends.kubeflow.settings.KubeflowSettings`); unknown fields are refused,
naming the entry.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Final

import msgspec

from dispatch_backends.kubeflow.settings import KubeflowSettings, kubeflow_declarations
from dispatch_backends.protocol import Backend
from dispatch_backends.slurm.settings import SlurmSettings
from dispatch_core.state import Declarations, is_job_id

__all__ = [
    "DEFAULT_POLL_INTERVAL_S",
    "BackendNotAvailable",
    "ClusterConfig",
    "ClustersConfig",
    "ClustersConfigError",
    "KubeflowCluster",
    "LocalCluster",
    "SlurmCluster",
    "declarations_of",
    "load_clusters",
    "make_backend",
    "parse_clusters",
    "poll_interval_s",
]

DEFAULT_POLL_INTERVAL_S: Final = {"local": 1.0, "slurm": 3.0, "kubeflow": 5.0}
"""An observer's poll interval per backend kind, in seconds, when its config sets none.

Slurm: one poll is three commands (squeue, sinfo, sacct) however many jobs dispatch has, so
3 s costs slurmctld little and lets dispatch recover faster than Slurm's own requeue (which
waits cred_expire + 1 s before the job is eligible); at 10 s dispatch took about 1.5x as
long (bench/slurm_recovery.py)."""


class ClustersConfigError(ValueError):
    """The clusters file is missing, unreadable or invalid; the message names the file and
    the offending entry or field."""


class BackendNotAvailable(ClustersConfigError):
    """The cluster's backend kind has no implementation in this build yet."""

    def __init__(self, cluster: str, backend: str) -> None:
        super().__init__(
            f"cluster {cluster!r}: the {backend} backend is not available yet in this build "
            "(only 'local' is); remove the cluster or run a build that has it"
        )
        self.cluster, self.backend = cluster, backend


class LocalCluster(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag_field="backend",
    tag="local",
):
    """A cluster of process groups on this machine (``dispatch_backends.local``).

    Attributes:
        name: the cluster's name (lower-case letters, digits and ``-``).
        data_dir: where its objects live; every process serving the cluster uses the same.
        kill_wait_s: seconds between SIGTERM and SIGKILL when an object is stopped.
        node_loss_window_s: the declared node-loss window, in seconds.
        node: the name of this machine as a node.
        start_timeout_s: seconds a start waits for the object's runner before its outcome
            is unknown.
        retain_ended_s: seconds an ended object stays visible before it is archived; ``null``
            (JSON only) keeps them all.
        workdir: default working directory of commands (default: the service's own).
        idempotent_start: whether a second start of a launch returns the object the first
            one made (default); ``false`` stands for a scheduler that cannot tell, so a
            launch a crash cut off is left to a person (``all-unknown:<N>``).
    """

    name: str
    data_dir: str
    kill_wait_s: float = 10.0
    node_loss_window_s: float = 60.0
    node: str = "local"
    start_timeout_s: float = 10.0
    retain_ended_s: float | None = 300.0
    workdir: str | None = None
    idempotent_start: bool = True


class SlurmCluster(SlurmSettings, frozen=True, kw_only=True, tag_field="backend", tag="slurm"):
    """A Slurm cluster: its ``name`` and the fields of
    :class:`~dispatch_backends.slurm.settings.SlurmSettings` (unknown fields are refused)."""

    name: str


class KubeflowCluster(
    KubeflowSettings,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag_field="backend",
    tag="kubeflow",
):
    """A Kubernetes cluster running Kubeflow Trainer: its ``name`` and the fields of
    :class:`~dispatch_backends.kubeflow.settings.KubeflowSettings` (unknown fields are
    refused). Importing this does not load the ``kubernetes`` client."""

    name: str


ClusterConfig = LocalCluster | SlurmCluster | KubeflowCluster
"""One entry of the clusters file, by its ``backend`` field."""


class ClustersConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The clusters file: every cluster, by name."""

    clusters: tuple[ClusterConfig, ...] = ()

    def get(self, name: str) -> ClusterConfig:
        """Return the cluster called ``name``.

        Raises:
            ClustersConfigError: no cluster has that name.
        """
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        known = ", ".join(c.name for c in self.clusters) or "none"
        raise ClustersConfigError(f"no cluster named {name!r} (clusters: {known})")

    @property
    def names(self) -> tuple[str, ...]:
        """The clusters' names, in file order."""
        return tuple(c.name for c in self.clusters)


_BACKEND_KINDS: Final = tuple(
    str(kind.__struct_config__.tag) for kind in (LocalCluster, SlurmCluster, KubeflowCluster)
)


def _backend_kind(cluster: ClusterConfig) -> str:
    match cluster:
        case LocalCluster():
            return "local"
        case SlurmCluster():
            return "slurm"
        case KubeflowCluster():
            return "kubeflow"


def poll_interval_s(cluster: ClusterConfig) -> float:
    """Return the default observer poll interval of ``cluster``'s backend, in seconds."""
    return DEFAULT_POLL_INTERVAL_S[_backend_kind(cluster)]


def parse_clusters(raw: object, *, source: str = "clusters") -> ClustersConfig:
    """Check a decoded clusters document (a mapping with a ``clusters`` list).

    Args:
        raw: the document, as ``tomllib`` or ``json`` decoded it.
        source: what to call it in error messages (the file name).

    Raises:
        ClustersConfigError: a field of the wrong type, an unknown field of a cluster or
            of the file, an unknown ``backend`` (the message lists the known ones), a name
            that is not a token, or a name used twice.
    """
    try:
        config = msgspec.convert(raw, ClustersConfig, strict=False)
    except msgspec.ValidationError as err:
        # msgspec names the tag it doesn't know, not the ones it does.
        known = ""
        if str(err).startswith("Invalid value") and str(err).endswith(".backend`"):
            known = f" (backends: {', '.join(_BACKEND_KINDS)})"
        raise ClustersConfigError(f"{source}: {err}{known}") from err
    seen: set[str] = set()
    for i, cluster in enumerate(config.clusters):
        if not is_job_id(cluster.name):
            raise ClustersConfigError(
                f"{source}: clusters[{i}].name {cluster.name!r} must be lower-case letters, "
                "digits and '-' (it is a subject token)"
            )
        if cluster.name in seen:
            raise ClustersConfigError(f"{source}: cluster {cluster.name!r} is listed twice")
        seen.add(cluster.name)
    return config


def load_clusters(path: str | Path) -> ClustersConfig:
    """Read the clusters file at ``path``: TOML when it ends in ``.toml``, else JSON.

    Raises:
        ClustersConfigError: the file can't be read or parsed, or is invalid (see
            :func:`parse_clusters`).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ClustersConfigError(f"cannot read the clusters file {str(path)!r}: {err}") from err
    try:
        raw: object = tomllib.loads(data.decode()) if path.suffix == ".toml" else json.loads(data)
    except (tomllib.TOMLDecodeError, ValueError) as err:
        raise ClustersConfigError(f"{path}: not valid {_format(path)}: {err}") from err
    return parse_clusters(raw, source=str(path))


def _format(path: Path) -> str:
    return "TOML" if path.suffix == ".toml" else "JSON"


def make_backend(cluster: ClusterConfig) -> Backend:
    """Build the backend serving ``cluster``.

    Raises:
        BackendNotAvailable: the cluster's backend can't be built in this installation.
        BackendError: the Kubernetes client configuration can't be loaded (kubeflow).
        ValueError: a setting the backend refuses (e.g. a negative kill wait).
        OSError: the local backend's data directory can't be made.
    """
    match cluster:
        case LocalCluster():
            from dispatch_backends.local import LocalBackend

            return LocalBackend(
                cluster.name,
                cluster.data_dir,
                kill_wait_s=cluster.kill_wait_s,
                node_loss_window_s=cluster.node_loss_window_s,
                node=cluster.node,
                start_timeout_s=cluster.start_timeout_s,
                retain_ended_s=cluster.retain_ended_s,
                workdir=cluster.workdir,
                idempotent_start=cluster.idempotent_start,
            )
        case SlurmCluster():
            from dispatch_backends.slurm import make_slurm_backend

            return make_slurm_backend(cluster.name, cluster)
        case KubeflowCluster():
            from dispatch_backends.kubeflow import KubeflowBackend

            return KubeflowBackend.from_settings(cluster.name, cluster)


def declarations_of(cluster: ClusterConfig) -> Declarations:
    """What ``cluster``'s backend declares, for a reader that plans without acting (the api
    makes a job's plan at submission): no Kubernetes client is loaded for a kubeflow cluster.

    Raises:
        BackendNotAvailable, ValueError, OSError: as :func:`make_backend`, for the backends
            whose declarations are read from a built backend.
    """
    match cluster:
        case KubeflowCluster():
            return kubeflow_declarations(cluster)
        case LocalCluster() | SlurmCluster():
            return make_backend(cluster).declarations()

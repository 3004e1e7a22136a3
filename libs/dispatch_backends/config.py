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

Every kind also takes ``shared_paths``: the path prefixes of the file systems the cluster's
jobs see, so a job that may fail over to it (``clusters = [...]`` on a resubmit rule, issue
14) can be refused when it could not read its checkpoint root there (:func:`sees_checkpoint`).
An ``s3://`` root is reachable from every cluster. A Slurm or Kubeflow cluster sees no local
path unless it lists one (``shared_paths = ["/shared"]``); a local cluster runs its jobs on
this machine and sees every path of it unless it lists some (then only those).

The observer of a cluster and every supervisor replica read the same file, so they build the
same backend for a cluster (the local backend's objects live in ``data_dir``, which they
share). :func:`load_clusters` parses and checks it; :func:`make_backend` builds the backend of
one entry.

Each cluster kind describes itself (:class:`ClusterKind`): its entry builds its backend
(``make_backend``), says what the backend declares (``declarations``, without acting), checks
a spec's options as its launch would (``check_options``) and names its observer's poll
interval (``default_poll_interval_s``). :data:`CLUSTER_KINDS` is the one table of kinds; the
functions below only ask the entry, so a new kind is one struct added to :data:`ClusterConfig`.

Each backend's settings are the fields of its settings struct (``LocalCluster``,
:class:`~dispatch_backends.slurm.settings.SlurmSettings`,
:class:`~dispatch_backends.kubeflow.settings.KubeflowSettings`); unknown fields are refused,
naming the entry.
"""

from __future__ import annotations

import json
import posixpath
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Final, Protocol, get_args

import msgspec

from dispatch_backends.kubeflow.settings import KubeflowSettings, kubeflow_declarations
from dispatch_backends.protocol import Backend
from dispatch_backends.slurm.settings import SlurmSettings
from dispatch_core.state import Declarations, is_job_id

__all__ = [
    "CLUSTER_KINDS",
    "DEFAULT_POLL_INTERVAL_S",
    "BackendNotAvailable",
    "ClusterConfig",
    "ClusterKind",
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
    "sees_checkpoint",
]


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


class ClusterKind(Protocol):
    """What every kind of cluster entry says of itself (each struct of
    :data:`ClusterConfig`)."""

    default_poll_interval_s: ClassVar[float]
    """Seconds between an observer's polls when its config sets none."""
    path_fields: ClassVar[tuple[str, ...]]
    """The fields holding file system paths (made absolute relative to the clusters file
    by ``dispatch up --clusters``)."""

    @property
    def name(self) -> str:
        """The cluster's name."""
        ...

    @property
    def shared_paths(self) -> tuple[str, ...] | None:
        """The path prefixes the cluster's jobs see (``None``: every path of this machine,
        a local cluster's default)."""
        ...

    @property
    def kind(self) -> str:
        """The backend kind: the entry's ``backend`` field."""
        ...

    def make_backend(self) -> Backend:
        """Build the backend serving this cluster (see :func:`make_backend`)."""
        ...

    def declarations(self) -> Declarations:
        """What the backend declares, without acting (see :func:`declarations_of`)."""
        ...

    def check_options(self, options: Mapping[str, str]) -> None:
        """Refuse the spec ``options`` the backend would refuse at launch (pure).

        Raises:
            dispatch_backends.options.InvalidOption: the first option refused.
        """
        ...


def _kind(cluster: msgspec.Struct) -> str:
    return str(type(cluster).__struct_config__.tag)


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
        shared_paths: the path prefixes its jobs see; unset (the default): every path of
            this machine (see :func:`sees_checkpoint`).
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
    shared_paths: tuple[str, ...] | None = None

    default_poll_interval_s: ClassVar[float] = 1.0
    path_fields: ClassVar[tuple[str, ...]] = ("data_dir", "workdir")

    @property
    def kind(self) -> str:
        """``local``."""
        return _kind(self)

    def make_backend(self) -> Backend:
        """A :class:`~dispatch_backends.local.LocalBackend` on ``data_dir`` (made if
        missing).

        Raises:
            ValueError: a negative kill wait or a non-positive node-loss window.
            OSError: ``data_dir`` can't be made.
        """
        from dispatch_backends.local import LocalBackend

        return LocalBackend(
            self.name,
            self.data_dir,
            kill_wait_s=self.kill_wait_s,
            node_loss_window_s=self.node_loss_window_s,
            node=self.node,
            start_timeout_s=self.start_timeout_s,
            retain_ended_s=self.retain_ended_s,
            workdir=self.workdir,
            idempotent_start=self.idempotent_start,
        )

    def declarations(self) -> Declarations:
        """Read from the built backend (which makes ``data_dir``). Raises as
        :meth:`make_backend`."""
        return self.make_backend().declarations()

    def check_options(self, options: Mapping[str, str]) -> None:
        """:func:`dispatch_backends.local.check_options`: only ``chdir`` and ``time``, the
        latter in Slurm's format."""
        from dispatch_backends.local import check_options

        check_options(options)


class SlurmCluster(SlurmSettings, frozen=True, kw_only=True, tag_field="backend", tag="slurm"):
    """A Slurm cluster: its ``name``, the path prefixes its nodes see (``shared_paths``,
    default none: see :func:`sees_checkpoint`) and the fields of
    :class:`~dispatch_backends.slurm.settings.SlurmSettings` (unknown fields are refused)."""

    name: str
    shared_paths: tuple[str, ...] = ()

    default_poll_interval_s: ClassVar[float] = 3.0
    """One poll is three commands (squeue, sinfo, sacct) however many jobs dispatch has, so
    3 s costs slurmctld little and lets dispatch recover faster than Slurm's own requeue
    (which waits cred_expire + 1 s before the job is eligible); at 10 s dispatch took about
    1.5x as long (bench/slurm_recovery.py)."""
    path_fields: ClassVar[tuple[str, ...]] = ("workdir", "output_dir", "bin_dir", "slurm_conf")

    @property
    def kind(self) -> str:
        """``slurm``."""
        return _kind(self)

    def make_backend(self) -> Backend:
        """:func:`dispatch_backends.slurm.make_slurm_backend` of these settings (it runs
        nothing until called)."""
        from dispatch_backends.slurm import make_slurm_backend

        return make_slurm_backend(self.name, self)

    def declarations(self) -> Declarations:
        """Read from the built backend (building it calls no Slurm command)."""
        return self.make_backend().declarations()

    def check_options(self, options: Mapping[str, str]) -> None:
        """:func:`dispatch_backends.slurm.script.check_option` of each option: every other
        option goes to ``sbatch`` as ``--<name>=<value>``."""
        from dispatch_backends.options import InvalidOption
        from dispatch_backends.slurm.script import InvalidSpec, check_option

        for key, value in options.items():
            try:
                check_option(key, value)
            except InvalidSpec as err:
                raise InvalidOption(key, str(err)) from err


class KubeflowCluster(
    KubeflowSettings,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag_field="backend",
    tag="kubeflow",
):
    """A Kubernetes cluster running Kubeflow Trainer: its ``name``, the path prefixes its
    pods see (``shared_paths``, default none: see :func:`sees_checkpoint`) and the fields of
    :class:`~dispatch_backends.kubeflow.settings.KubeflowSettings` (unknown fields are
    refused). Importing this does not load the ``kubernetes`` client."""

    name: str
    shared_paths: tuple[str, ...] = ()

    default_poll_interval_s: ClassVar[float] = 5.0
    path_fields: ClassVar[tuple[str, ...]] = ("kubeconfig",)

    @property
    def kind(self) -> str:
        """``kubeflow``."""
        return _kind(self)

    def make_backend(self) -> Backend:
        """``KubeflowBackend.from_settings`` of these settings (loads the Kubernetes client).

        Raises:
            BackendError: the Kubernetes client configuration can't be loaded.
        """
        from dispatch_backends.kubeflow import KubeflowBackend

        return KubeflowBackend.from_settings(self.name, self)

    def declarations(self) -> Declarations:
        """:func:`~dispatch_backends.kubeflow.settings.kubeflow_declarations`: from the
        settings alone, no Kubernetes client is loaded."""
        return kubeflow_declarations(self)

    def check_options(self, options: Mapping[str, str]) -> None:
        """:func:`dispatch_backends.kubeflow.body.check_options` (options it doesn't read
        are ignored)."""
        from dispatch_backends.kubeflow.body import InvalidLaunch
        from dispatch_backends.kubeflow.body import check_options as check_kubeflow
        from dispatch_backends.options import InvalidOption

        try:
            check_kubeflow(options, self)
        except InvalidLaunch as err:
            raise InvalidOption(err.option or "", str(err)) from err


ClusterConfig = LocalCluster | SlurmCluster | KubeflowCluster
"""One entry of the clusters file, by its ``backend`` field: the one list of cluster kinds."""

CLUSTER_KINDS: Final[tuple[type[ClusterConfig], ...]] = get_args(ClusterConfig)
"""Every kind of cluster entry (the members of :data:`ClusterConfig`), in that order."""

DEFAULT_POLL_INTERVAL_S: Final = {
    str(kind.__struct_config__.tag): kind.default_poll_interval_s for kind in CLUSTER_KINDS
}
"""An observer's poll interval per backend kind, in seconds, when its config sets none
(each kind's ``default_poll_interval_s``)."""


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


_BACKEND_KINDS: Final = tuple(DEFAULT_POLL_INTERVAL_S)


def poll_interval_s(cluster: ClusterKind) -> float:
    """Return the default observer poll interval of ``cluster``'s backend, in seconds."""
    return cluster.default_poll_interval_s


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


def make_backend(cluster: ClusterKind) -> Backend:
    """Build the backend serving ``cluster`` (its kind's ``make_backend``).

    Raises:
        BackendNotAvailable: the cluster's backend can't be built in this installation.
        BackendError: the Kubernetes client configuration can't be loaded (kubeflow).
        ValueError: a setting the backend refuses (e.g. a negative kill wait).
        OSError: the local backend's data directory can't be made.
    """
    return cluster.make_backend()


S3_SCHEME: Final = "s3://"
"""A checkpoint root with this prefix is in S3, reachable from every cluster."""


def sees_checkpoint(cluster: ClusterKind, root: str) -> bool:
    """Whether ``cluster``'s jobs can reach the checkpoint root ``root`` (issue 14, part 2).

    An ``s3://`` root: always. A path: when the cluster's ``shared_paths`` is ``None`` (a
    local cluster that lists none: every path of this machine), or the path, normalised, is
    one of its prefixes or under one (component by component: ``/shared`` covers
    ``/shared/ckpt`` but not ``/shared2``). Pure: nothing is read from any file system.
    """
    if root.startswith(S3_SCHEME):
        return True
    prefixes = cluster.shared_paths
    if prefixes is None:
        return True
    path = posixpath.normpath(root)
    for prefix in prefixes:
        base = posixpath.normpath(prefix)
        if base == "/" and path.startswith("/"):
            return True
        if path == base or path.startswith(base.rstrip("/") + "/"):
            return True
    return False


def declarations_of(cluster: ClusterKind) -> Declarations:
    """What ``cluster``'s backend declares, for a reader that plans without acting (the api
    makes a job's plan at submission): no Kubernetes client is loaded for a kubeflow cluster.

    Raises:
        BackendNotAvailable, ValueError, OSError: as :func:`make_backend`, for the backends
            whose declarations are read from a built backend.
    """
    return cluster.declarations()

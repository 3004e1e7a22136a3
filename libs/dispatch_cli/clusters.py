"""The clusters ``dispatch up`` serves: its built-in local cluster, plus those of
``--clusters FILE``.

FILE is a clusters file in the format every service reads (``dispatch_backends.config``:
TOML when it ends in ``.toml``, else JSON). ``up`` checks it before it starts anything:

* the loader's checks (a known ``backend``, each backend's fields and their values, names
  that are subject tokens and unique), then each backend's own (as the API and the
  supervisor will build it: a negative kill wait, a local data directory that can't be made);
* a cluster named ``local`` is refused: that is the built-in cluster, whose objects live in
  ``<data dir>/local`` (rename yours, e.g. ``local-2``);
* no two local clusters share a data directory (each one's observer reports every object
  of its directory as its own).

Relative paths in FILE (``data_dir`` and ``workdir`` of a local cluster; ``workdir``,
``output_dir``, ``bin_dir`` and ``slurm_conf`` of a Slurm one; ``kubeconfig``) are taken
from FILE's directory, and ``~`` is expanded: the services run in ``<data dir>/work``, where
a relative path would mean something else. ``up`` then writes the built-in cluster and
FILE's, re-encoded as JSON, to ``<data dir>/clusters.json``, the file the observers, the
supervisor and the API read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from dispatch_backends.config import (
    ClusterConfig,
    ClustersConfig,
    ClustersConfigError,
    LocalCluster,
    declarations_of,
    load_clusters,
)
from dispatch_cli.errors import UsageError

__all__ = ["BUILTIN", "backend_of", "builtin_cluster", "clusters_document", "read_clusters_file"]

BUILTIN: Final = "local"
"""The name of ``up``'s own local cluster (``<data dir>/local``)."""


def builtin_cluster(data_dir: Path, *, kill_wait_s: float) -> LocalCluster:
    """Return ``up``'s own local cluster on the data directory ``data_dir``."""
    return LocalCluster(
        name=BUILTIN,
        data_dir=str(data_dir / "local"),
        kill_wait_s=kill_wait_s,
        node_loss_window_s=60.0,
        retain_ended_s=3600.0,
        workdir=str(data_dir / "work"),
    )


def backend_of(cluster: ClusterConfig) -> str:
    """Return the backend kind of ``cluster`` (its ``backend`` field)."""
    return cluster.kind


def read_clusters_file(path: Path, *, builtin: LocalCluster) -> tuple[ClusterConfig, ...]:
    """Read and check the clusters file of ``dispatch up --clusters`` (module docstring).

    Args:
        path: the file.
        builtin: ``up``'s own local cluster, which FILE's clusters must not clash with.

    Returns:
        FILE's clusters, in file order, their relative paths made absolute.

    Raises:
        UsageError: the file can't be read or parsed, or a cluster is invalid or clashes;
            the message names the file and the cluster or field.
    """
    where = f"--clusters {path}"
    try:
        config = load_clusters(path)
    except ClustersConfigError as err:
        raise UsageError(f"--clusters: {err}") from err
    if not config.clusters:
        raise UsageError(f"{where}: the file names no cluster (add [[clusters]] entries)")
    base = path.expanduser().resolve().parent
    clusters = tuple(_absolute(cluster, base) for cluster in config.clusters)
    data_dirs = {Path(builtin.data_dir).resolve(): f"the built-in cluster {BUILTIN!r}"}
    for cluster in clusters:
        if cluster.name == BUILTIN:
            raise UsageError(
                f"{where}: cluster {BUILTIN!r} is dispatch up's own local cluster (its jobs "
                f"are in {builtin.data_dir}); give yours another name, e.g. 'local-2'"
            )
        if isinstance(cluster, LocalCluster):
            data_dir = Path(cluster.data_dir).resolve()
            if data_dir in data_dirs:
                raise UsageError(
                    f"{where}: cluster {cluster.name!r}: data_dir {str(data_dir)!r} is that "
                    f"of {data_dirs[data_dir]}; each local cluster needs a directory of its own"
                )
            data_dirs[data_dir] = f"cluster {cluster.name!r}"
        try:
            declarations_of(cluster)
        except (ClustersConfigError, ValueError, OSError) as err:
            raise UsageError(f"{where}: cluster {cluster.name!r}: {err}") from err
    return clusters


def clusters_document(clusters: Sequence[ClusterConfig]) -> bytes:
    """Return the clusters file of ``clusters`` (JSON, which the loader reads as it reads
    TOML; ``retain_ended_s = null`` has no TOML spelling)."""
    return msgspec.json.format(msgspec.json.encode(ClustersConfig(clusters=tuple(clusters))))


def _absolute(cluster: ClusterConfig, base: Path) -> ClusterConfig:
    changes: dict[str, str] = {}
    for name in cluster.path_fields:
        value = getattr(cluster, name)
        if value:
            changes[name] = os.path.normpath(base / Path(value).expanduser())
    return msgspec.structs.replace(cluster, **changes) if changes else cluster

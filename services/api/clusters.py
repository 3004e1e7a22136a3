"""Each cluster's backend declarations, which a submission's plan is made against, and its
configuration, which a submission's options are checked against.

``decide(Submit)`` needs the declarations of the spec's cluster (node-loss window, native
actions, cessation signal, emergency stop). The API reads them from the clusters file every
service shares (:mod:`dispatch_backends.config`), asking each cluster's backend, as the
supervisor does, so the plan a user is shown is made against the declarations the
supervisor will plan with. Building a backend only reads its settings (no scheduler call).

The same entries are kept (:func:`load_clusters_file`) so that a submission's
``spec.options`` can be checked by :func:`dispatch_backends.check_options`, which reads the
settings only (no backend client is built).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

from dispatch_backends import (
    BackendNotAvailable,
    ClusterConfig,
    ClustersConfigError,
    declarations_of,
    load_clusters,
)
from dispatch_core import Declarations
from services.common.config import ConfigError

__all__ = ["ApiClusters", "load_clusters_file", "load_declarations"]

log = logging.getLogger("services.api")


class ApiClusters(NamedTuple):
    """The clusters a submission may name, by name."""

    declarations: dict[str, Declarations]
    """Each cluster's backend declarations (the plan is made against them)."""
    configs: dict[str, ClusterConfig]
    """Each cluster's entry of the clusters file (its options are checked against it)."""


def load_clusters_file(path: str | Path) -> ApiClusters:
    """Read the shared clusters file at ``path`` and ask each cluster's backend for its
    declarations.

    A cluster whose backend isn't available in this build is left out (a submission naming
    it is refused as an unknown cluster) and logged.

    Raises:
        ConfigError: the file is unreadable or invalid, or a backend refuses its settings;
            the message names the file and the cluster.
    """
    try:
        clusters = load_clusters(path)
    except ClustersConfigError as err:
        raise ConfigError(str(err)) from err
    out = ApiClusters(declarations={}, configs={})
    for cluster in clusters.clusters:
        try:
            declarations = declarations_of(cluster)
        except BackendNotAvailable as err:
            log.warning("clusters.unavailable", extra={"cluster": cluster.name, "error": str(err)})
            continue
        except (ClustersConfigError, ValueError, OSError) as err:
            raise ConfigError(f"clusters file {str(path)!r}: {err}") from err
        out.declarations[cluster.name] = declarations
        out.configs[cluster.name] = cluster
    return out


def load_declarations(path: str | Path) -> dict[str, Declarations]:
    """Return the declarations of :func:`load_clusters_file`: cluster name -> its backend's
    declarations.

    Raises:
        ConfigError: as :func:`load_clusters_file`.
    """
    return load_clusters_file(path).declarations

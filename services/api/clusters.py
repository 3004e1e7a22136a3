"""Each cluster's backend declarations, which a submission's plan is made against.

``decide(Submit)`` needs the declarations of the spec's cluster (node-loss window, native
actions, cessation signal, emergency stop). The API reads them from the clusters file every
service shares (:mod:`dispatch_backends.config`), asking each cluster's backend, as the
supervisor does, so the plan a user is shown is made against the declarations the
supervisor will plan with. Building a backend only reads its settings (no scheduler call).
"""

from __future__ import annotations

import logging
from pathlib import Path

from dispatch_backends import (
    BackendNotAvailable,
    ClustersConfigError,
    declarations_of,
    load_clusters,
)
from dispatch_core import Declarations
from services.common.config import ConfigError

__all__ = ["load_declarations"]

log = logging.getLogger("services.api")


def load_declarations(path: str | Path) -> dict[str, Declarations]:
    """Read the shared clusters file at ``path`` and ask each cluster's backend for its
    declarations.

    A cluster whose backend isn't available in this build is left out (a submission naming
    it is refused as an unknown cluster) and logged.

    Returns:
        Cluster name -> its backend's declarations.

    Raises:
        ConfigError: the file is unreadable or invalid, or a backend refuses its settings;
            the message names the file and the cluster.
    """
    try:
        clusters = load_clusters(path)
    except ClustersConfigError as err:
        raise ConfigError(str(err)) from err
    out: dict[str, Declarations] = {}
    for cluster in clusters.clusters:
        try:
            declarations = declarations_of(cluster)
        except BackendNotAvailable as err:
            log.warning("clusters.unavailable", extra={"cluster": cluster.name, "error": str(err)})
            continue
        except (ClustersConfigError, ValueError, OSError) as err:
            raise ConfigError(f"clusters file {str(path)!r}: {err}") from err
        out[cluster.name] = declarations
    return out

"""``python -m services.observer``: run one cluster's observer (configuration in
:mod:`services.observer.config`); SIGTERM or SIGINT stops it within its shutdown grace.

Exit status: 0 after a clean stop, 2 for a configuration error (the clusters file's
included), 1 for a failure (:func:`services.common.lifecycle.service_main`).
"""

from __future__ import annotations

import sys

from dispatch_backends import ClustersConfigError
from services.common.lifecycle import service_main
from services.observer.config import ObserverConfig
from services.observer.service import run


def main() -> int:
    """Build the config from the environment and run the observer; return the exit status."""
    return service_main(
        "observer", ObserverConfig.from_env, run, config_errors=(ClustersConfigError,)
    )


if __name__ == "__main__":
    sys.exit(main())

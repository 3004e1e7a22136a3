"""``python -m services.api``: run the HTTP API (configuration in :mod:`services.api.config`,
``API_*`` variables); SIGTERM or SIGINT stops it, letting requests in flight finish.

Exit status: 0 after a clean stop, 2 for a configuration error, 1 for a failure
(:func:`services.common.lifecycle.service_main`).
"""

from __future__ import annotations

import sys

from services.api.config import ApiConfig
from services.api.service import run
from services.common.lifecycle import service_main


def main() -> int:
    """Build the config from the environment and run the API; return the exit status."""
    return service_main("api", ApiConfig.from_env, run)


if __name__ == "__main__":
    sys.exit(main())

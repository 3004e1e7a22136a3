"""``python -m services.api``: run the HTTP API (configuration in :mod:`services.api.config`,
``API_*`` variables); SIGTERM or SIGINT stops it, letting requests in flight finish.

Exit status: 0 after a clean stop, 2 for a configuration error, 1 for a failure.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from services.api.config import ApiConfig
from services.api.service import run
from services.common.config import ConfigError
from services.common.logs import setup_logging

log = logging.getLogger("services.api")


async def _main(cfg: ApiConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run(cfg, stop)
    except ConfigError as err:
        # Said plainly on stderr (like a bad variable in main): someone is starting it.
        print(f"api: {err}", file=sys.stderr)
        return 2
    except Exception:
        log.exception("api.failed")
        return 1
    return 0


def main() -> int:
    """Build the config from the environment and run the API; return the exit status."""
    try:
        cfg = ApiConfig.from_env(os.environ)
    except ConfigError as err:
        print(f"api: {err}", file=sys.stderr)
        return 2
    setup_logging("api", cfg.log_level, json=cfg.log_json)
    return asyncio.run(_main(cfg))


if __name__ == "__main__":
    sys.exit(main())

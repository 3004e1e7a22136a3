"""``python -m services.observer``: run one cluster's observer (configuration in
:mod:`services.observer.config`); SIGTERM or SIGINT stops it within its shutdown grace.

Exit status: 0 after a clean stop, 2 for a configuration error, 1 for a failure.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from dispatch_backends import ClustersConfigError
from services.common.config import ConfigError
from services.common.logs import setup_logging
from services.observer.config import ObserverConfig
from services.observer.service import run

log = logging.getLogger("dispatch.observer")


async def _main(cfg: ObserverConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run(cfg, stop)
    except ClustersConfigError as err:
        log.error("observer.config_error", extra={"error": str(err)})
        return 2
    except Exception:
        log.exception("observer.failed")
        return 1
    return 0


def main() -> int:
    """Build the config from the environment and run the observer; return the exit status."""
    try:
        cfg = ObserverConfig.from_env(os.environ)
    except ConfigError as err:
        print(f"observer: {err}", file=sys.stderr)
        return 2
    setup_logging("observer", cfg.log_level, json=cfg.log_json)
    return asyncio.run(_main(cfg))


if __name__ == "__main__":
    sys.exit(main())

"""``python -m services.notifier``: configure from the environment, run until SIGTERM/SIGINT.

Exit status: 0 after a clean shutdown, 2 for a configuration error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys

from dispatch_nats import StreamConfigConflict
from services.common.config import ConfigError
from services.common.logs import setup_logging
from services.notifier.config import load_config
from services.notifier.service import run

log = logging.getLogger("dispatch.notifier")


async def _main(cfg_env: dict[str, str]) -> int:
    try:
        cfg = load_config(cfg_env)
    except ConfigError as err:
        print(f"notifier: {err}", file=sys.stderr)
        return 2
    setup_logging("notifier", cfg.log_level, json=cfg.log_json)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run(cfg, stop, jitter=random.Random().random)
    except (ConfigError, StreamConfigConflict) as err:
        log.error("notifier.config_error", extra={"error": str(err)})
        return 2
    return 0


def main() -> int:
    """Run the notifier; return the process's exit status."""
    return asyncio.run(_main(dict(os.environ)))


if __name__ == "__main__":
    sys.exit(main())

"""``python -m services.supervisor``: run one supervisor replica (configuration in
:mod:`services.supervisor.config`); SIGTERM or SIGINT stops it within its shutdown grace,
letting the passes in flight finish.

Exit status: 0 after a clean stop, 2 for a configuration error, 1 for a failure.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from dispatch_backends import ClustersConfigError
from services.common.config import ConfigError
from services.common.logs import setup_logging
from services.supervisor.config import SupervisorConfig
from services.supervisor.service import load_deliver, run

log = logging.getLogger("dispatch.supervisor")


async def _main(cfg: SupervisorConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Backends call their blocking clients through asyncio.to_thread: enough threads that
    # the passes running at once don't queue for them.
    loop.set_default_executor(ThreadPoolExecutor(cfg.backend_threads, thread_name_prefix="backend"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        deliver = load_deliver(cfg.deliver)
    except ValueError as err:
        log.error("supervisor.config_error", extra={"error": str(err)})
        return 2
    try:
        await run(cfg, stop, deliver=deliver)
    except ClustersConfigError as err:
        log.error("supervisor.config_error", extra={"error": str(err)})
        return 2
    except Exception:
        log.exception("supervisor.failed")
        return 1
    return 0


def main() -> int:
    """Build the config from the environment and run the replica; return the exit status."""
    try:
        cfg = SupervisorConfig.from_env(os.environ)
    except ConfigError as err:
        print(f"supervisor: {err}", file=sys.stderr)
        return 2
    setup_logging("supervisor", cfg.log_level, json=cfg.log_json)
    return asyncio.run(_main(cfg))


if __name__ == "__main__":
    sys.exit(main())

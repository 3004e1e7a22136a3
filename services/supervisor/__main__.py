"""``python -m services.supervisor``: run one supervisor replica (configuration in
:mod:`services.supervisor.config`); SIGTERM or SIGINT stops it within its shutdown grace,
letting the passes in flight finish.

Exit status: 0 after a clean stop, 2 for a configuration error (the clusters file and
``SUPERVISOR_DELIVER`` included), 1 for a failure
(:func:`services.common.lifecycle.service_main`).
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

from dispatch_backends import ClustersConfigError
from services.common.config import ConfigError
from services.common.lifecycle import service_main
from services.supervisor.config import SupervisorConfig
from services.supervisor.service import load_deliver, run


async def _run(cfg: SupervisorConfig, stop: asyncio.Event) -> None:
    # Backends call their blocking clients through asyncio.to_thread: enough threads that
    # the passes running at once don't queue for them.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(cfg.backend_threads, thread_name_prefix="backend")
    )
    try:
        deliver = load_deliver(cfg.deliver)
    except ValueError as err:
        raise ConfigError(f"SUPERVISOR_DELIVER: {err}") from err
    await run(cfg, stop, deliver=deliver)


def main() -> int:
    """Build the config from the environment and run the replica; return the exit status."""
    return service_main(
        "supervisor", SupervisorConfig.from_env, _run, config_errors=(ClustersConfigError,)
    )


if __name__ == "__main__":
    sys.exit(main())

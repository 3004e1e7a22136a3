"""``python -m services.notifier``: configure from the environment, run until SIGTERM/SIGINT.

Exit status: 0 after a clean shutdown, 2 for a configuration error (a stream configured
otherwise included), 1 for a failure (:func:`services.common.lifecycle.service_main`).
"""

from __future__ import annotations

import asyncio
import random
import sys

from dispatch_nats import StreamConfigConflict
from services.common.lifecycle import service_main
from services.notifier.config import NotifierConfig, load_config
from services.notifier.service import run


async def _run(cfg: NotifierConfig, stop: asyncio.Event) -> None:
    await run(cfg, stop, jitter=random.Random().random)


def main() -> int:
    """Run the notifier; return the process's exit status."""
    return service_main("notifier", load_config, _run, config_errors=(StreamConfigConflict,))


if __name__ == "__main__":
    sys.exit(main())

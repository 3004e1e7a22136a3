"""The benches' many jobs behind the API (``bench/status_list.py``, ``bench/web_jobs.py``):
``jobs`` written with ``tests/browser/many.py`` into a private nats-server with the API
service alone in front, and ``dispatch status`` timed as a user runs it (a subprocess)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.browser.many import TOKEN, ManyJobs
from tests.e2e.cli.support import cli_env, run_cli

__all__ = ["TOKEN", "many_jobs", "time_status"]


@contextmanager
def many_jobs(jobs: int, prefix: str) -> Iterator[tuple[ManyJobs, float]]:
    """Write ``jobs`` jobs and start the API in front of them; yield them and the seconds
    that took (printed). Everything is stopped and removed on leaving."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        many = ManyJobs(Path(tmp), jobs)
        started = time.monotonic()
        try:
            many.start()
            setup_s = time.monotonic() - started
            print(f"{jobs} jobs written and the API up in {setup_s:.1f} s", flush=True)
            yield many, setup_s
        finally:
            many.stop()


def time_status(api: str, *args: str, timeout_s: float = 900.0) -> float:
    """Run ``dispatch status ARGS`` against ``api``; return its wall seconds (it must exit 0)."""
    env = cli_env({"DISPATCH_API": api, "DISPATCH_TOKEN": TOKEN})
    started = time.monotonic()
    result = run_cli("status", *args, env=env, timeout_s=timeout_s)
    took = time.monotonic() - started
    assert result.code == 0, str(result)
    return took

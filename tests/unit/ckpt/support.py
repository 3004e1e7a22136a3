"""Helpers shared by the checkpoint helper's tests (unit and integration).

* `run_cli(...)`: run `dispatch-ckpt` in a subprocess, as a job script would.
* `race_publish(...)`: many processes publish the same name at the same moment.
* `clean_env(...)`: the test process's environment without DISPATCH_*/AWS_* variables.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Final

from dispatch_ckpt import AlreadyPublished, Checkpoints

REPO: Final = Path(__file__).resolve().parents[3]
#: The project's import roots, so a subprocess imports this working tree's code.
PYTHONPATH: Final = os.pathsep.join(str(REPO / p) for p in ("libs/ckpt", "libs", "."))


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return os.environ without DISPATCH_*/AWS_* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "AWS_"))}
    env["PYTHONPATH"] = PYTHONPATH
    env.update(extra or {})
    return env


def cli_command(*args: str) -> list[str]:
    """Return the command line running `dispatch-ckpt ARGS` with this interpreter."""
    return [sys.executable, "-m", "dispatch_ckpt.cli", *args]


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `dispatch-ckpt ARGS` to completion; `env` is added to a clean environment."""
    return subprocess.run(
        cli_command(*args),
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _publish_child(
    root: str,
    environ: dict[str, str],
    step: int,
    path: str,
    barrier: Barrier,
    results: multiprocessing.Queue[str],
) -> None:
    os.environ.update(environ)  # S3: boto3 reads its endpoint and credentials from here
    try:
        ckpt = Checkpoints.open(root, environ)
        ckpt.store.exists("")  # connect before the start line, not after it
        barrier.wait(60)
        ckpt.publish(step, path)
        results.put("published")
    except AlreadyPublished:
        results.put("already-published")
    except BaseException as err:  # reported to the test, which fails on it
        results.put(f"error: {type(err).__name__}: {err}")


def race_publish(
    root: str, environ: Mapping[str, str], step: int, path: str, processes: int
) -> list[str]:
    """Start `processes` processes that each publish (step, path) once all are ready.

    Each opens the root (and, on S3, its connection) first, then waits at a barrier, so
    the publications are made as nearly at once as the machine allows.

    Returns:
        One outcome per process: "published", "already-published" or "error: ...".
    """
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(processes)
    results: multiprocessing.Queue[str] = ctx.Queue()
    procs = [
        ctx.Process(target=_publish_child, args=(root, dict(environ), step, path, barrier, results))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    outcomes: list[str] = []
    try:
        for _ in range(processes):
            outcomes.append(results.get(timeout=120))
    except queue.Empty:
        outcomes.append("error: a process reported nothing within 120 s")
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return outcomes

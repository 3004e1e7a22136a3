"""Side by side with another checkout (``--baseline-libs DIR``), for the benches that measure
a library change (``bench/local_idle.py``, ``bench/local_starts.py``): the same bench run again
in a subprocess with ``DIR`` first on ``sys.path`` (e.g. ``/work/main/libs``, the code before
the change), in its ``--raw`` mode (one measure, its JSON the last line)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_baseline_options", "run_baseline"]

_ROOT = Path(__file__).resolve().parents[1]


def add_baseline_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--baseline-libs DIR`` and the hidden ``--raw`` (one measure, for a baseline run)."""
    parser.add_argument("--baseline-libs", type=Path, default=None)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)


def run_baseline(script: str, libs: Path, args: Sequence[str]) -> dict[str, Any]:
    """Run ``script --raw ARGS`` with ``libs`` (then this checkout, for ``bench.*`` and
    ``tests.*``) first on ``sys.path``; return the JSON object its last line prints.

    Raises:
        subprocess.CalledProcessError: the run failed.
    """
    env = dict(os.environ, PYTHONPATH=f"{libs.resolve()}{os.pathsep}{_ROOT}")
    out = subprocess.run(
        [sys.executable, script, "--raw", *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result

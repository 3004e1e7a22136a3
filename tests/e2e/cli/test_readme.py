"""The README's first command, run as written in a fresh virtual environment (issue 5).

``scripts/install.sh && .venv/bin/dispatch demo``: the install goes into a new venv of
this test (``DISPATCH_VENV``, the README's ``.venv`` pointed at it) so the checkout's own
is left alone; pip reuses what this machine has downloaded already (its cache and
``PIP_FIND_LINKS``). The README's second command, ``scripts/test.sh``, is what CI runs
(``.ci/run``): running it from inside the suite would recurse.

It takes about 6 minutes on a 2-core machine with a warm pip cache (5.5 of them installing
torch, transformers, lightning and scikit-learn).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cli.support import REPO

pytestmark = [pytest.mark.e2e]

FIRST_COMMAND = "scripts/install.sh && .venv/bin/dispatch demo"


def readme_commands() -> list[str]:
    """The commands of the README's "Set up" section, one per ```sh block."""
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", setup, re.DOTALL)]


@pytest.mark.timeout(2400)
def test_the_readmes_first_command_installs_everything_and_runs_the_demo(
    tmp_path: Path,
) -> None:
    """Run it with bash from the checkout's root, in an environment without this test
    session's Python paths, and check the demo's verdict."""
    commands = readme_commands()
    assert commands[:2] == [FIRST_COMMAND, "scripts/test.sh"], commands
    venv = tmp_path / "venv"
    as_run = FIRST_COMMAND.replace(".venv/bin/", f"{venv}/bin/")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DISPATCH_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["DISPATCH_VENV"] = str(venv)
    env["DISPATCH_DATA_DIR"] = str(tmp_path / "data")  # no `up` of the user's is found
    log = tmp_path / "readme.log"
    with log.open("wb") as out:
        proc = subprocess.run(
            ["bash", "-c", as_run],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=2300,
            check=False,
        )
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output[-6000:]
    assert (venv / "bin" / "dispatch").is_file()
    assert "install: done:" in output
    assert "demo done: preempted, resubmitted by its rule, resumed from step" in output, output[
        -6000:
    ]

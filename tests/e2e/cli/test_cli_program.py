"""The CLI's hints name a command the user can run as printed (``dispatch_cli.program``):
``scripts/install.sh`` puts ``dispatch`` in ``.venv/bin``, not on ``PATH``. The installed
console script (the one beside this interpreter) is run as a user runs it, against an API
that isn't there, and the command its hint names is then run as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_cli.embedded import free_port
from tests.e2e.cli.support import PROGRAM, cli_env, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCRIPT = Path(sys.executable).parent / "dispatch"
"""The console script the install made (``[project.scripts]``), beside this interpreter."""
_HINT = re.compile(r"Start the embedded default with `([^`]*) up`")


def _unreachable_hint(argv: list[str], cwd: Path, tmp_path: Path, path: str) -> str:
    """Run ``argv status`` with no API listening; return the program its hint names."""
    env = cli_env(
        {
            "DISPATCH_API": f"http://127.0.0.1:{free_port()}",
            "DISPATCH_DATA_DIR": str(tmp_path),
            "PATH": path,
        }
    )
    done = subprocess.run(
        [*argv, "status"], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    found = _HINT.search(done.stderr)
    assert found is not None, done.stderr
    return found.group(1)


def _runs_as_printed(program: str, cwd: Path, path: str) -> None:
    """The hinted program runs from the same place with the same PATH (``--version``)."""
    env = cli_env({"PATH": path})
    done = subprocess.run(
        f"{program} --version", shell=True, env=env, cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{program!r} does not run: {done.stderr}"
    assert done.stdout.startswith("dispatch "), done.stdout


def test_a_venv_script_run_by_its_path_names_that_path(tmp_path: Path) -> None:
    assert SCRIPT.exists(), f"no console script at {SCRIPT} (install dispatch first)"
    venv_top = SCRIPT.parent.parent.parent
    relative = str(SCRIPT.relative_to(venv_top))  # `.venv/bin/dispatch`, as the README says
    plain = "/usr/bin:/bin"  # as after scripts/install.sh: the venv is not on PATH
    hinted = _unreachable_hint([relative], venv_top, tmp_path, plain)
    assert hinted == relative
    _runs_as_printed(hinted, venv_top, plain)
    hinted = _unreachable_hint([str(SCRIPT)], tmp_path, tmp_path, plain)
    assert hinted == shlex.quote(str(SCRIPT))
    _runs_as_printed(hinted, tmp_path, plain)


def test_a_link_to_the_script_by_another_name_names_the_link(tmp_path: Path) -> None:
    """``ln -s .venv/bin/dispatch dsp; ./dsp ...``: the hints said ``dispatch``, which is not
    on PATH; they name the link, as typed."""
    link = tmp_path / "dsp"
    link.symlink_to(SCRIPT)
    plain = "/usr/bin:/bin"
    hinted = _unreachable_hint(["./dsp"], tmp_path, tmp_path, plain)
    assert hinted == "./dsp"
    _runs_as_printed(hinted, tmp_path, plain)


def test_a_script_found_on_path_is_named_dispatch(tmp_path: Path) -> None:
    path = os.pathsep.join([str(SCRIPT.parent), "/usr/bin", "/bin"])
    hinted = _unreachable_hint(["dispatch"], tmp_path, tmp_path, path)
    assert hinted == "dispatch"
    _runs_as_printed(hinted, tmp_path, path)


def test_python_dash_m_names_this_interpreter(tmp_path: Path) -> None:
    env = cli_env(
        {"DISPATCH_API": f"http://127.0.0.1:{free_port()}", "DISPATCH_DATA_DIR": str(tmp_path)}
    )
    result = run_cli("status", env=env)
    assert result.code == 3, str(result)
    assert f"`{PROGRAM} up`" in result.err, result.err
    _runs_as_printed(PROGRAM, tmp_path, env["PATH"])

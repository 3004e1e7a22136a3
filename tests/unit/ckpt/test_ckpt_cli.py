"""The dispatch-ckpt command line, as job scripts rely on it (issue 4's CLI forms)."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from dispatch_ckpt.cli import EXIT_ERROR, EXIT_NOTHING_PUBLISHED, EXIT_OK, EXIT_USAGE
from dispatch_ckpt.names import encode_name
from dispatch_core.epoch import epoch
from tests.unit.ckpt.support import run_cli

EPOCH = epoch(0, 2, 0)
ENV = {"DISPATCH_ATTEMPT": "a7", "DISPATCH_EPOCH": str(EPOCH)}


def test_console_script_is_declared() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [e.value for e in scripts if e.name == "dispatch-ckpt"] == ["dispatch_ckpt.cli:main"]


def test_exit_codes_are_distinct() -> None:
    assert len({EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOTHING_PUBLISHED}) == 4


@pytest.mark.parametrize("command", ["publish", "latest", "watch", "env"])
def test_help_explains_each_command_with_an_example(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.returncode == 0
    assert "Example:" in result.stdout
    assert "--root" in result.stdout


def test_top_level_help_lists_the_exit_codes() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "3 `latest` found nothing published" in result.stdout.replace("\n  ", " ")


def test_env_prints_and_creates_the_execution_folder(tmp_path: Path) -> None:
    result = run_cli("env", "--root", str(tmp_path), env=ENV)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path.resolve()}/exec/a7\n"
    assert (tmp_path / "exec" / "a7").is_dir()
    # The root may come from DISPATCH_CHECKPOINT.
    again = run_cli("env", env={**ENV, "DISPATCH_CHECKPOINT": str(tmp_path)})
    assert again.stdout == result.stdout


def test_env_without_attempt_fails_naming_the_variable(tmp_path: Path) -> None:
    result = run_cli("env", "--root", str(tmp_path))
    assert result.returncode == EXIT_ERROR
    assert "DISPATCH_ATTEMPT is not set" in result.stderr


def test_publish_then_latest(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a7" / "checkpoint-500"
    save.mkdir(parents=True)
    result = run_cli("publish", "--root", str(tmp_path), "--step", "500", str(save), env=ENV)
    assert result.returncode == 0, result.stderr
    name = encode_name(EPOCH, 500, "exec/a7/checkpoint-500")
    assert result.stdout == f"{tmp_path.resolve()}/pub/{name}\n"
    assert os.listdir(tmp_path / "pub") == [name]

    plain = run_cli("latest", "--root", str(tmp_path))
    assert plain.returncode == 0
    assert plain.stdout == f"{save.resolve()}\n"
    as_json = run_cli("latest", "--root", str(tmp_path), "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == {"epoch": EPOCH, "step": 500, "path": str(save.resolve())}
    assert as_json.stdout.count("\n") == 1


def test_publish_twice_is_an_error(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a7" / "s-1"
    save.mkdir(parents=True)
    args = ("publish", "--root", str(tmp_path), "--step", "1", str(save))
    assert run_cli(*args, env=ENV).returncode == 0
    second = run_cli(*args, env=ENV)
    assert second.returncode == EXIT_ERROR
    assert "already exists" in second.stderr


def test_publish_refuses_without_epoch_unless_given(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a7" / "s-1"
    save.mkdir(parents=True)
    args = ("publish", "--root", str(tmp_path), "--step", "1", str(save))
    refused = run_cli(*args, env={"DISPATCH_ATTEMPT": "a7"})
    assert refused.returncode == EXIT_ERROR
    assert "DISPATCH_EPOCH is not set" in refused.stderr
    assert not (tmp_path / "pub").exists()
    given = run_cli(*args, "--epoch", str(EPOCH), "--attempt", "a7")
    assert given.returncode == 0, given.stderr


def test_publish_refuses_an_epoch_outside_the_bounds(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a7" / "s-1"
    save.mkdir(parents=True)
    result = run_cli(
        "publish",
        "--root",
        str(tmp_path),
        "--step",
        "1",
        str(save),
        env={"DISPATCH_ATTEMPT": "a7", "DISPATCH_EPOCH": "42"},
    )
    assert result.returncode == EXIT_ERROR
    assert "DISPATCH_EPOCH='42'" in result.stderr
    assert "submission 0 is outside 1..999999" in result.stderr


def test_latest_with_nothing_published_has_its_own_exit_code(tmp_path: Path) -> None:
    result = run_cli("latest", "--root", str(tmp_path), "--json")
    assert result.returncode == EXIT_NOTHING_PUBLISHED
    assert result.stdout == ""
    assert "nothing published" in result.stderr


def test_latest_with_a_bad_name_fails_naming_the_entry(tmp_path: Path) -> None:
    (tmp_path / "pub").mkdir()
    good = encode_name(EPOCH, 1, "exec/a7/s-1")
    (tmp_path / "pub" / good).touch()
    bad = good[:42] + good[42:].lower()
    (tmp_path / "pub" / bad).touch()
    result = run_cli("latest", "--root", str(tmp_path), "--json")
    assert result.returncode == EXIT_ERROR
    assert result.stdout == ""
    assert f"publication entry {bad!r} does not parse" in result.stderr
    assert "upper-case" in result.stderr


def test_usage_errors(tmp_path: Path) -> None:
    assert run_cli("latest").returncode == EXIT_USAGE  # no --root
    assert run_cli("publish", "--root", str(tmp_path), "x").returncode == EXIT_USAGE  # no --step
    negative = run_cli("publish", "--root", str(tmp_path), "--step", "-1", "x", env=ENV)
    assert negative.returncode == EXIT_USAGE
    assert run_cli("frobnicate").returncode == EXIT_USAGE


def test_main_returns_exit_codes_in_process(tmp_path: Path) -> None:
    from dispatch_ckpt.cli import main

    assert main(["latest", "--root", str(tmp_path)]) == EXIT_NOTHING_PUBLISHED
    assert main(["latest"]) == EXIT_USAGE

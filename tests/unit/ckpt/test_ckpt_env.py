"""DISPATCH_ATTEMPT and DISPATCH_EPOCH (seed 004, "The epoch orders executions"): read from
the environment, validated with the core's bounds, and required to publish unless given
explicitly."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_ckpt import Checkpoints, ExecutionEnv, InvalidEnvironment, MissingEnvironment
from dispatch_core.epoch import MAX_EPOCH, epoch


def test_reads_attempt_and_epoch() -> None:
    env = ExecutionEnv.from_env({"DISPATCH_ATTEMPT": "a-1", "DISPATCH_EPOCH": "1000002"})
    assert env == ExecutionEnv(attempt="a-1", epoch=epoch(0, 1, 2))


def test_explicit_values_win_over_the_environment() -> None:
    environ = {"DISPATCH_ATTEMPT": "a-1", "DISPATCH_EPOCH": "1000002"}
    env = ExecutionEnv.from_env(environ, attempt="b", epoch=epoch(2, 3, 4))
    assert env == ExecutionEnv(attempt="b", epoch=2_000_003_000_004)
    assert ExecutionEnv.from_env({}, epoch="3000000").epoch == epoch(0, 3, 0)


def test_missing_values_are_none_until_required() -> None:
    env = ExecutionEnv.from_env({})
    assert env == ExecutionEnv()
    with pytest.raises(MissingEnvironment) as info:
        env.require_epoch("publish")
    assert info.value.variable == "DISPATCH_EPOCH"
    assert "DISPATCH_EPOCH is not set: publish needs it" in str(info.value)
    with pytest.raises(MissingEnvironment, match="DISPATCH_ATTEMPT"):
        env.require_attempt("the execution folder")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "decimal number"),
        ("abc", "decimal number"),
        ("-1000000", "decimal number"),
        (" 1000000", "decimal number"),
        ("1e6", "decimal number"),
        ("\u0661" + "\u0660" * 6, "decimal number"),  # Arabic-Indic digits: isdigit(), not 0-9
        ("0", "submission 0 is outside 1..999999"),  # N must be at least 1
        ("5", "submission 0"),
        (str(MAX_EPOCH + 1), "at most"),
        ("9" * 40, "at most"),
    ],
)
def test_epoch_outside_the_core_bounds_is_refused(value: str, words: str) -> None:
    with pytest.raises(InvalidEnvironment) as info:
        ExecutionEnv.from_env({"DISPATCH_EPOCH": value})
    assert info.value.variable == "DISPATCH_EPOCH"
    assert info.value.value == value
    assert words in str(info.value)


def test_largest_epoch_is_accepted() -> None:
    assert ExecutionEnv.from_env({"DISPATCH_EPOCH": str(MAX_EPOCH)}).epoch == MAX_EPOCH


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "a\nb", "a\x00b", "x" * 129])
def test_attempt_that_cannot_name_a_folder_is_refused(value: str) -> None:
    with pytest.raises(InvalidEnvironment) as info:
        ExecutionEnv.from_env({"DISPATCH_ATTEMPT": value})
    assert info.value.variable == "DISPATCH_ATTEMPT"


def test_publish_is_refused_without_epoch_or_attempt(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a" / "s-1"
    save.mkdir(parents=True)
    for environ, missing in (
        ({"DISPATCH_ATTEMPT": "a"}, "DISPATCH_EPOCH"),
        ({"DISPATCH_EPOCH": "1000000"}, "DISPATCH_ATTEMPT"),
        ({}, "DISPATCH_EPOCH"),
    ):
        ckpt = Checkpoints.open(str(tmp_path), environ)
        with pytest.raises(MissingEnvironment) as info:
            ckpt.publish(1, str(save))
        assert info.value.variable == missing
    assert not (tmp_path / "pub").exists()
    # Given explicitly, it publishes.
    pub = Checkpoints.open(str(tmp_path), {}, attempt="a", epoch=1000000).publish(1, str(save))
    assert pub.epoch == 1000000


def test_a_base_epoch_and_a_restart_count_given_apart_add_up() -> None:
    """Seed 004: "R is the backend's restart count for the object". A backend that learns R
    only when the execution starts (a JobSet restart re-runs the same pod template) sets
    DISPATCH_EPOCH to the base epoch (R = 0) and DISPATCH_RESTART to R."""
    env = {"DISPATCH_ATTEMPT": "a", "DISPATCH_EPOCH": "3000000", "DISPATCH_RESTART": "2"}
    assert ExecutionEnv.from_env(env).epoch == 3_000_002
    assert ExecutionEnv.from_env({**env, "DISPATCH_RESTART": ""}).epoch == 3_000_000


@pytest.mark.parametrize(
    ("epoch", "restart", "variable"),
    [
        ("3000001", "2", "DISPATCH_EPOCH"),
        ("3000000", "x", "DISPATCH_RESTART"),
        ("3000000", "1000000", "DISPATCH_RESTART"),
    ],
)
def test_a_restart_count_that_cannot_be_added_is_refused_naming_the_variable(
    epoch: str, restart: str, variable: str
) -> None:
    env = {"DISPATCH_EPOCH": epoch, "DISPATCH_RESTART": restart}
    with pytest.raises(InvalidEnvironment, match=variable):
        ExecutionEnv.from_env(env)

"""Job-file errors name what to fix (issue 16): an unknown key is named with the closest known
one (``comand`` -> ``command``), never ignored until the API says there is nothing to run; a
``spec.options``/``spec.env`` value that is not a string keeps its key (``spec.options.gpus``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dispatch_cli.errors import UsageError
from dispatch_cli.jobfile import PolicyFlags, build_submission
from dispatch_core import JobSpec, RecoveryRule


def build(path: Path, **options: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "cluster": None, "name": None, "job_id": None, "reason": None, "chdir": "/work",
        "policy_file": None, "flags": PolicyFlags(),
    }  # fmt: skip
    return build_submission(path, **{**defaults, **options})


def refused(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        build(path)
    assert caught.value.exit_code == 2
    return str(caught.value)


def test_a_misspelt_spec_key_is_named_with_the_key_it_meant(tmp_path: Path) -> None:
    message = refused(tmp_path, '[spec]\ncluster = "local"\ncomand = ["python", "train.py"]\n')
    assert "unknown key `comand` in [spec]" in message
    assert "did you mean `command`?" in message
    assert "neither a command nor a script" not in message
    assert str(tmp_path / "job.toml") in message


def test_an_empty_failover_list_is_refused_naming_its_rule(tmp_path: Path) -> None:
    """``clusters = []`` reached the core as no list at all: accepted, it never failed over."""
    message = refused(
        tmp_path,
        '[spec]\ncluster = "local"\ncommand = ["x"]\n'
        '[[policy.rules]]\non = ["node-lost"]\naction = "resubmit"\nbudget = 2\n'
        "clusters = []\n",
    )
    assert "policy.rules[0].clusters is empty" in message


def test_an_unknown_top_level_key_is_named(tmp_path: Path) -> None:
    message = refused(tmp_path, 'nmae = "digits"\n[spec]\ncluster = "local"\ncommand = ["x"]\n')
    assert "unknown key `nmae`" in message
    assert "did you mean `name`?" in message


def test_an_unknown_rule_key_is_named_with_its_rule(tmp_path: Path) -> None:
    message = refused(
        tmp_path,
        '[spec]\ncluster = "local"\ncommand = ["x"]\n'
        '[[policy.rules]]\non = ["preempted"]\naction = "resubmit"\nbudget = 2\n'
        '[[policy.rules]]\non = ["non-zero-exit"]\naction = "hold"\nhold_for = 60\n',
    )
    assert "unknown key `hold_for` in policy.rules[1]" in message
    assert "did you mean `hold_for_s`?" in message


def test_an_unknown_key_in_a_json_job_file_is_named(tmp_path: Path) -> None:
    message = refused(
        tmp_path, '{"spec": {"cluster": "local", "scirpt": "#!/bin/sh"}}', name="job.json"
    )
    assert "unknown key `scirpt` in [spec] (did you mean `script`?" in message


@pytest.mark.parametrize(
    ("line", "shown", "fix"),
    [
        ("gpus = 2", "an integer (2)", 'gpus = "2"'),
        ("mem_gb = 1.5", "a number (1.5)", 'mem_gb = "1.5"'),
        ("exclusive = true", "a boolean (true)", 'exclusive = "true"'),
    ],
)
def test_an_option_value_that_is_not_a_string_keeps_its_key(
    tmp_path: Path, line: str, shown: str, fix: str
) -> None:
    message = refused(
        tmp_path, f'[spec]\ncluster = "slurm"\nscript = "x"\n[spec.options]\n{line}\n'
    )
    key = line.split(" ")[0]
    assert f"spec.options.{key}: expected a string, got {shown}; quote it: {fix}" in message


def test_an_env_value_that_is_not_a_string_keeps_its_key(tmp_path: Path) -> None:
    message = refused(
        tmp_path, '[spec]\ncluster = "local"\ncommand = ["x"]\nenv = { OMP_NUM_THREADS = 4 }\n'
    )
    assert "spec.env.OMP_NUM_THREADS: expected a string, got an integer (4)" in message


def test_the_known_keys_are_the_cores_fields_so_every_one_is_accepted(tmp_path: Path) -> None:
    """No known key is refused: a job file using every JobSpec and RecoveryRule field passes."""
    spec_fields = {f.encode_name for f in msgspec.structs.fields(JobSpec)}
    rule_fields = {f.encode_name for f in msgspec.structs.fields(RecoveryRule)}
    assert {"command", "script", "options", "checkpoint"} <= spec_fields
    path = tmp_path / "job.json"
    spec = {k: {} if k in ("options", "env") else [] if k == "extensions" else "x"
            for k in spec_fields}  # fmt: skip
    spec["options"] = {"gpus": "2"}
    rule = {k: "x" for k in rule_fields}
    path.write_text(json.dumps({"spec": spec, "policy": {"rules": [rule]}, "name": "n",
                                "job_id": "j", "reason": "r"}))  # fmt: skip
    body = build(path)
    assert body["spec"]["options"] == {"gpus": "2", "chdir": "/work"}


def test_a_policy_file_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[spec]\ncluster = "local"\ncommand = ["x"]\n')
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nonn = ["preempted"]\naction = "resubmit"\n')
    with pytest.raises(UsageError, match=r"unknown key `onn` in rules\[0\] \(did you mean `on`"):
        build(job, policy_file=policy)


def test_a_job_file_takes_the_progress_settings_of_a_rule(tmp_path: Path) -> None:
    """Issue 14 part 1: ``free_if_progress`` and ``max_without_progress`` are rule keys of
    the TOML job file, sent as the API's ``policy.rules`` hold them."""
    path = tmp_path / "job.toml"
    path.write_text(
        '[spec]\ncluster = "local"\ncommand = ["python", "train.py"]\n'
        '[[policy.rules]]\non = ["preempted"]\naction = "resubmit"\nbudget = 2\n'
        "free_if_progress = true\nmax_without_progress = 3\n"
    )
    body = build(path)
    (rule,) = msgspec.convert(body["policy"]["rules"], list[RecoveryRule])
    assert (rule.free_if_progress, rule.max_without_progress) == (True, 3)
    misspelt = refused(
        tmp_path,
        '[spec]\ncluster = "local"\ncommand = ["x"]\n'
        '[[policy.rules]]\non = ["preempted"]\naction = "resubmit"\nfree_if_progres = true\n',
    )
    assert "did you mean `free_if_progress`?" in misspelt


def test_the_api_schema_has_both_progress_settings_per_rule() -> None:
    from services.api.openapi import build_openapi

    schemas = build_openapi()["components"]["schemas"]
    for name in ("RecoveryRule", "PlannedRule"):
        props = schemas[name]["properties"]
        assert props["free_if_progress"]["type"] == "boolean", name
        assert "max_without_progress" in props, name

"""``dispatch submit`` of a job file whose options the local backend would refuse: the API
(run by ``dispatch up``, with its clusters file) answers 400 naming ``spec.options.<key>``,
the CLI exits 7, and no job is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli.support import Up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ('{ time = "banana" }', "spec.options.time", "invalid time limit 'banana'"),
        ('{ partitionn = "gpu" }', "spec.options.partitionn", "its options: chdir, time"),
    ],
)
def test_submit_refuses_options_the_backend_would_refuse(
    up: Up, tmp_path: Path, options: str, field: str, words: str
) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        f'job_id = "bad-options"\n[spec]\ncluster = "local"\ncommand = ["true"]\n'
        f"options = {options}\n"
    )
    result = up.dispatch("submit", str(path))
    assert result.code == 7, str(result)
    assert f"field {field}" in result.err
    assert words in result.err
    status = up.dispatch("status", "bad-options", "--json")
    assert status.code != 0, str(status)
    listed = up.dispatch("status", "--json")
    assert listed.code == 0, str(listed)
    assert "bad-options" not in json.dumps(listed.json())


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ('command = ["true"]\nscript = "#!/bin/sh\\ntrue\\n"', "spec.script", "both"),
        ('command = ["echo", "a\\u0000b"]', "spec.command", "NUL"),
        ('command = ["true"]\nenv = { "A=B" = "1" }', "spec.env", "'A=B'"),
        ('command = ["true"]\nenv = { A = "x\\u0000y" }', "spec.env", "NUL"),
        ('command = ["true"]\noptions = { chdir = "/tmp\\u0000x" }', "spec.options.chdir", "NUL"),
    ],
)
def test_submit_refuses_what_no_runner_could_start(
    up: Up, tmp_path: Path, spec: str, field: str, words: str
) -> None:
    """Issue 15, item 7, through the CLI: the API's 400 names the field, the CLI exits 7 and
    says so, and no job is made (it was made, then its runner died)."""
    path = tmp_path / "job.toml"
    path.write_text(f'job_id = "bad-door"\n[spec]\ncluster = "local"\n{spec}\n')
    result = up.dispatch("submit", str(path))
    assert result.code == 7, str(result)
    assert f"field {field}" in result.err, str(result)
    assert words in result.err, str(result)
    listed = up.dispatch("status", "--json")
    assert listed.code == 0, str(listed)
    assert "bad-door" not in json.dumps(listed.json())

"""The batch script and sbatch arguments of a launch; the prologue is run with ``/bin/sh``
the way slurmstepd runs it (``SLURM_JOB_ID`` set, ``SLURM_RESTART_COUNT`` empty in the first
run and set after a requeue)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from dispatch_backends.slurm.parse import parse_comment
from dispatch_backends.slurm.script import (
    InvalidSpec,
    batch_script,
    sbatch_args,
    sbatch_directives,
)
from dispatch_backends.slurm.settings import SlurmSettings
from dispatch_core.epoch import epoch
from dispatch_core.state import JobSpec
from tests.contract.backend_contract import make_launch

USER_SCRIPT = """#!/bin/bash
#SBATCH --time=5
#SBATCH --partition=lowcancel   # a comment after the directive
# a plain comment

set -eu
echo "user: $DISPATCH_EPOCH $DISPATCH_ATTEMPT $MINE"
"""


def _run(script: str, tmp_path: Path, **env: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text(script)
    path.chmod(0o755)
    full = {"PATH": os.environ["PATH"], **env}
    return subprocess.run(
        [str(path)], capture_output=True, text=True, check=True, env=full, timeout=30
    ).stdout


@pytest.mark.parametrize(("restart_count", "restart"), [("", 0), ("1", 1), ("12", 12)])
def test_the_prologue_computes_attempt_and_epoch_at_each_start(
    tmp_path: Path, restart_count: str, restart: int
) -> None:
    spec = JobSpec(cluster="lab", script=USER_SCRIPT, env={"MINE": "a b"}, checkpoint="/ck")
    launch = make_launch("job-1", spec, generation=7, submission=3, attempt=2)
    script = batch_script(launch, "cafe0001")
    env = {"SLURM_JOB_ID": "4242"}
    if restart_count:
        env["SLURM_RESTART_COUNT"] = restart_count
    out = _run(script, tmp_path, **env)
    expected = epoch(7, 3, restart)
    assert out == f"user: {expected} 4242-r{restart}-cafe0001 a b\n"


def test_the_users_sbatch_lines_stay_where_sbatch_reads_them() -> None:
    spec = JobSpec(cluster="lab", script=USER_SCRIPT)
    script = batch_script(make_launch("j", spec), "t")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines[1:3] == [
        "#SBATCH --time=5",
        "#SBATCH --partition=lowcancel   # a comment after the directive",
    ]
    first_command = next(i for i, line in enumerate(lines) if line.startswith("export "))
    assert all(line.startswith("#") or not line.strip() for line in lines[1:first_command])
    assert sbatch_directives(script) == ["--time=5", "--partition=lowcancel"]


def test_a_command_is_wrapped_and_dispatchs_variables_win(tmp_path: Path) -> None:
    spec = JobSpec(
        cluster="lab",
        command=("/bin/sh", "-c", 'echo "$DISPATCH_JOB $DISPATCH_SUBMISSION $DISPATCH_CHECKPOINT"'),
        env={"DISPATCH_JOB": "not-mine"},
        checkpoint="/root with space",
    )
    script = batch_script(make_launch("job-2", spec, submission=4), "t")
    assert script.startswith("#!/bin/sh\n")
    assert _run(script, tmp_path, SLURM_JOB_ID="1") == "job-2 4 /root with space\n"


def test_a_script_for_another_interpreter_runs_under_it(tmp_path: Path) -> None:
    spec = JobSpec(
        cluster="lab",
        script=(
            f"#!{sys.executable}\n#SBATCH --nodes=1\nimport os\n"
            "print(os.environ['DISPATCH_EPOCH'], os.environ['DISPATCH_ATTEMPT'])\n"
        ),
    )
    script = batch_script(make_launch("py", spec, submission=2), "beef")
    assert script.splitlines()[:2] == ["#!/bin/sh", "#SBATCH --nodes=1"]
    out = _run(script, tmp_path, SLURM_JOB_ID="77", SLURM_RESTART_COUNT="3")
    assert out == f"{epoch(0, 2, 3)} 77-r3-beef\n"


def test_sbatch_arguments() -> None:
    spec = JobSpec(
        cluster="lab",
        script="#!/bin/sh\n#SBATCH -x node9\ntrue\n",
        options={"partition": "low", "time": "1", "exclusive": "", "exclude": "node4"},
    )
    launch = make_launch("job-3", spec, generation=1, submission=2, attempt=3)
    launch = msgspec.structs.replace(launch, exclude_nodes=("node2",))
    settings = SlurmSettings(
        output_dir="/logs/", workdir="/work", open_mode="append", extra_args=("--account=ml",)
    )
    args = sbatch_args(launch, settings, exclude=launch.exclude_nodes)
    assert args[:2] == ("--parsable", "--hold")
    assert "--chdir=/work" in args
    assert "--output=/logs/%x-%j.out" in args
    assert "--open-mode=append" in args
    assert "--export=ALL" in args
    assert "--account=ml" in args
    assert "--partition=low" in args
    assert "--time=1" in args
    assert "--exclusive" in args
    assert "--exclude=node9,node4,node2" in args
    assert "--no-requeue" in args
    assert args[-2:] == ("--job-name=dj-job-3", "--comment=dj:job=job-3 sub=2 att=3 gen=1")
    tag = parse_comment(args[-1].split("=", 1)[1])
    assert tag is not None
    assert (tag.job, tag.submission, tag.attempt, tag.generation) == (
        "job-3",
        2,
        3,
        1,
    )


def test_requeue_is_asked_for_by_option_or_by_the_script() -> None:
    settings = SlurmSettings()
    by_option = make_launch(
        "a", JobSpec(cluster="lab", command=("true",), options={"requeue": "yes"})
    )
    assert "--requeue" in sbatch_args(by_option, settings)
    by_script = make_launch(
        "b", JobSpec(cluster="lab", script="#!/bin/sh\n#SBATCH --requeue\ntrue\n")
    )
    args = sbatch_args(by_script, settings)
    assert "--requeue" not in args
    assert "--no-requeue" not in args
    given_output = make_launch(
        "c", JobSpec(cluster="lab", script="#!/bin/sh\n#SBATCH -o /x/%j\ntrue\n")
    )
    assert not any(
        a.startswith("--output") for a in sbatch_args(given_output, SlurmSettings(output_dir="/d"))
    )


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (JobSpec(cluster="lab"), "exactly one of"),
        (JobSpec(cluster="lab", command=("x",), script="#!/bin/sh\n"), "exactly one of"),
        (JobSpec(cluster="lab", command=("x",), options={"job_name": "mine"}), "dispatch's own"),
        (JobSpec(cluster="lab", command=("x",), options={"array": "1-3"}), "dispatch's own"),
        (JobSpec(cluster="lab", command=("x",), options={"Bad": "1"}), "not an sbatch option"),
        (JobSpec(cluster="lab", command=("x",), options={"requeue": "maybe"}), "yes or no"),
        (JobSpec(cluster="lab", command=("x",), options={"time": "banana"}), "time limit"),
        (JobSpec(cluster="lab", command=("x",), env={"A-B": "1"}), "not a variable name"),
    ],
)
def test_what_cant_be_submitted_is_refused(spec: JobSpec, words: str) -> None:
    launch = make_launch("bad", spec)

    def submit() -> None:
        batch_script(launch, "t")
        sbatch_args(launch, SlurmSettings())

    with pytest.raises(InvalidSpec, match=words):
        submit()

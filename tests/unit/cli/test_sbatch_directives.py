"""``dispatch sbatch``'s reading of a batch script (:mod:`dispatch_cli.sbatch`): ``#DISPATCH``
lines into recovery rules and settings, read where sbatch reads ``#SBATCH`` lines (the
leading comment block), every malformed line refused with its line number."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Final

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_backends.slurm.script import leading_block, sbatch_directives
from dispatch_cli.sbatch import (
    FREE_IF_PROGRESS,
    MAX_WITHOUT_PROGRESS,
    ScriptError,
    build_sbatch_submission,
    parse_directives,
    plan_summary,
)
from dispatch_core import (
    COVERABLE_CAUSES,
    Declarations,
    JobSpec,
    RecoveryPolicy,
    RecoveryRule,
    make_plan,
)
from dispatch_core.policy import validate as validate_policy

REPO: Final = Path(__file__).resolve().parents[3]
DIGITS: Final = REPO / "examples" / "slurm" / "digits.sbatch"
_CAUSES: Final = sorted(c.value for c in COVERABLE_CAUSES)


def _script(*lines: str) -> str:
    return "\n".join(["#!/bin/sh", *lines]) + "\n"


def test_the_issue_s_lines_become_rules_and_settings() -> None:
    text = _script(
        "#SBATCH --job-name=train -p low",
        "#DISPATCH resubmit on=preempted,node-lost budget=3",
        "#DISPATCH hold on=non-zero-exit for=12h   # a person decides",
        "#DISPATCH escalate on=out-of-memory",
        "#DISPATCH checkpoint=/ckpt/{job}",
        "#DISPATCH cluster=slurm-a",
        "",
        "srun python train.py",
    )
    got = parse_directives(text)
    assert got.rules == (
        {"action": "resubmit", "on": ["preempted", "node-lost"], "budget": 3},
        {"action": "hold", "on": ["non-zero-exit"], "hold_for_s": 43200.0},
        {"action": "escalate", "on": ["out-of-memory"]},
    )
    assert (got.checkpoint, got.cluster, got.job_name) == ("/ckpt/{job}", "slurm-a", "train")
    policy = msgspec.convert({"rules": list(got.rules)}, RecoveryPolicy)
    assert len(policy.rules) == 3


def test_a_resubmit_rule_without_a_budget_gets_the_cli_s_default_of_3() -> None:
    got = parse_directives(_script("#DISPATCH requeue on=preempted enforcer=backend"))
    assert got.rules == (
        {"action": "requeue", "on": ["preempted"], "enforcer": "backend", "budget": 3},
    )


def test_after_the_first_command_sbatch_lines_are_comments_and_dispatch_lines_refused() -> None:
    text = _script("#SBATCH -J early", "echo start", "#SBATCH -J late", "#DISPATCH hold on=oom")
    with pytest.raises(ScriptError, match=r"^job\.sbatch:5: .*after the script's first command"):
        parse_directives(text, source="job.sbatch")
    # the #SBATCH line after the command is ignored, as sbatch ignores it
    quiet = _script("#SBATCH -J early", "echo start", "#SBATCH -J late")
    assert parse_directives(quiet).job_name == "early"
    assert sbatch_directives(quiet) == ["-J", "early"]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("#DISPATCH", "empty directive"),
        ("#DISPATCH resubmit budget=3", "needs on="),
        ("#DISPATCH resubmit on=preemptd", "'preemptd' is not a cause"),
        ("#DISPATCH resubmit on=preempted budget=three", "not a whole number"),
        ("#DISPATCH resubmit on=preempted budget=-1", "not a whole number"),
        ("#DISPATCH hold on=non-zero-exit budget=2", "a hold rule has no budget"),
        ("#DISPATCH resubmit on=preempted for=1h", "only for hold rules"),
        ("#DISPATCH hold on=non-zero-exit for=soon", "not a duration"),
        ("#DISPATCH resubmit on=preempted on=node-lost", "on= is given twice"),
        ("#DISPATCH resubmit on=preempted enforcer=slurm", "supervisor or backend"),
        ("#DISPATCH resubmit on=preempted retries=2", "unknown key 'retries'"),
        ("#DISPATCH resubmit preempted", "'preempted' is not KEY=VALUE"),
        (
            "#DISPATCH retry on=preempted",
            "unknown directive 'retry' (known: resubmit, hold, escalate, restart, requeue, "
            "checkpoint=",
        ),
        (
            "#DISPATCH resubmitt on=preempted",
            "unknown directive 'resubmitt' (known: resubmit, hold, escalate, restart, requeue, "
            "checkpoint=",
        ),
        ("#DISPATCH resubmitt on=preempted", "checkpoint="),
        (
            "#DISPATCH hold on=non-zero-exit for=12 hours",
            'for=12 hours: a value with spaces must be quoted (for="12 hours") or have none',
        ),
        ("#DISPATCH chekpoint=/ckpt", "unknown directive 'chekpoint'"),
        ("#DISPATCH checkpoint=", "checkpoint= needs a value"),
        ("#DISPATCH free-if-progress now", "takes no value"),
        ("#DISPATCH checkpoint='/ckpt", "can't be split into words"),
    ],
)
def test_a_malformed_line_is_refused_with_its_number(line: str, words: str) -> None:
    text = _script("#SBATCH -p debug", "# a comment", line, "echo hi")
    with pytest.raises(ScriptError) as caught:
        parse_directives(text, source="t.sbatch")
    message = caught.value.message
    assert message.startswith(f"t.sbatch:4: `{line.strip()}`: "), message
    assert words in message, message


def test_a_setting_given_twice_is_refused_at_its_second_line() -> None:
    text = _script("#DISPATCH checkpoint=/a", "#DISPATCH checkpoint=/b")
    with pytest.raises(ScriptError, match=r"^s:3: .*checkpoint= was already given"):
        parse_directives(text, source="s")


def test_free_if_progress_sets_every_budgeted_rule() -> None:
    text = _script(
        "#DISPATCH free-if-progress",
        "#DISPATCH resubmit on=preempted budget=5",
        "#DISPATCH hold on=non-zero-exit",
    )
    got = parse_directives(text)
    assert got.rules == (
        {"action": "resubmit", "on": ["preempted"], "budget": 5, FREE_IF_PROGRESS: True},
        {"action": "hold", "on": ["non-zero-exit"]},
    )
    lone = _script("#DISPATCH hold on=non-zero-exit", "#DISPATCH free-if-progress")
    with pytest.raises(ScriptError, match=r"^script:3: free-if-progress applies to"):
        parse_directives(lone)


def test_free_if_progress_and_max_without_progress_are_accepted_by_the_core() -> None:
    """Issue 14 part 1: the core's RecoveryRule has both settings, so the lines are taken."""
    text = _script(
        "#DISPATCH resubmit on=preempted budget=2 max-without-progress=5",
        "#DISPATCH requeue on=node-lost",
        "#DISPATCH hold on=non-zero-exit",
        "#DISPATCH free-if-progress",
        "#DISPATCH max-without-progress=3",
    )
    got = parse_directives(text)
    assert got.rules == (
        {
            "action": "resubmit",
            "on": ["preempted"],
            "budget": 2,
            MAX_WITHOUT_PROGRESS: 5,
            FREE_IF_PROGRESS: True,
        },
        {
            "action": "requeue",
            "on": ["node-lost"],
            "budget": 3,
            FREE_IF_PROGRESS: True,
            MAX_WITHOUT_PROGRESS: 3,
        },
        {"action": "hold", "on": ["non-zero-exit"]},
    )
    rules = msgspec.convert(list(got.rules), list[RecoveryRule])
    assert [(r.free_if_progress, r.max_without_progress) for r in rules] == [
        (True, 5),
        (True, 3),
        (False, None),
    ]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("#DISPATCH resubmit on=preempted max-without-progress=0", "whole number >= 1"),
        ("#DISPATCH resubmit on=preempted max-without-progress=x", "whole number >= 1"),
        ("#DISPATCH hold on=out-of-memory max-without-progress=2", "no max-without-progress"),
        ("#DISPATCH max-without-progress=-1", "whole number >= 1"),
    ],
)
def test_a_malformed_max_without_progress_is_refused_with_its_line(line: str, words: str) -> None:
    text = _script("#DISPATCH resubmit on=preempted", line)
    with pytest.raises(ScriptError) as caught:
        parse_directives(text, source="t")
    assert caught.value.message.startswith("t:3: "), caught.value.message
    assert words in caught.value.message


def test_a_script_without_a_shebang_is_refused_as_sbatch_refuses_it() -> None:
    with pytest.raises(ScriptError, match=r"^x:1: a batch script starts with #!"):
        parse_directives("#SBATCH -p debug\necho hi\n", source="x")


_WORD: Final = st.text(st.sampled_from("abz09-_./{}"), min_size=1, max_size=12)
_RULE: Final = st.tuples(
    st.sampled_from(["resubmit", "hold", "escalate", "restart", "requeue"]),
    st.lists(st.sampled_from(_CAUSES), min_size=1, max_size=3, unique=True),
    st.integers(min_value=0, max_value=50),
)
_NOISE: Final = st.sampled_from(["", "# a comment", "#SBATCH -p low", "   ", "#SBATCH --mem=1G"])


@given(
    rules=st.lists(_RULE, max_size=5),
    checkpoint=st.none() | _WORD,
    noise=st.lists(_NOISE, max_size=6),
    body=st.lists(st.sampled_from(["echo hi", "#DISPATCH hold on=x", "#SBATCH -J z"]), max_size=3),
)
def test_what_is_written_is_what_is_read(
    rules: list[tuple[str, list[str], int]],
    checkpoint: str | None,
    noise: list[str],
    body: list[str],
) -> None:
    """Rules written in any order among other comment lines are read back in that order,
    with their budgets where they have one; a body after the first command changes nothing
    unless it holds a #DISPATCH line, which is refused with its number."""
    lines = [*noise]
    for action, causes, budget in rules:
        has_budget = action in ("resubmit", "restart", "requeue")
        lines.append(
            f"#DISPATCH {action} on={','.join(causes)}"
            + (f" budget={budget}" if has_budget else "")
        )
    if checkpoint is not None:
        lines.append(f"#DISPATCH checkpoint={shlex.quote(checkpoint)}")
    tail = ["echo first command", *body]
    text = _script(*lines, *tail)
    late = [i for i, line in enumerate(tail) if line.startswith("#DISPATCH")]
    if late:
        number = 1 + len(lines) + 1 + late[0]
        with pytest.raises(ScriptError, match=rf"^script:{number}: "):
            parse_directives(text)
        return
    got = parse_directives(text)
    assert [(r["action"], r["on"], r.get("budget")) for r in got.rules] == [
        (a, c, b if a in ("resubmit", "restart", "requeue") else None) for a, c, b in rules
    ]
    assert got.checkpoint == checkpoint
    assert [number for number, _ in leading_block(text)] == list(range(2, 2 + len(lines)))


@settings(deadline=None, max_examples=40)  # a /bin/sh per example: slow on a loaded machine
@given(args=st.lists(st.text(min_size=0, max_size=8).filter(lambda s: "\x00" not in s), max_size=4))
def test_arguments_reach_the_script_as_its_positional_parameters(
    tmp_path_factory: pytest.TempPathFactory, args: list[str]
) -> None:
    """``set -- ARGS`` after the leading block gives the script exactly its arguments (run
    with /bin/sh here, as Slurm runs it)."""
    path = tmp_path_factory.mktemp("s") / "args.sbatch"
    path.write_text(
        _script(
            "#SBATCH -p debug",
            "#DISPATCH hold on=non-zero-exit",
            'for a in "$@"; do printf "%s\\0" "$a"; done',
        )
    )
    body = build_sbatch_submission(path, args, cluster="c", chdir="/")
    out = subprocess.run(
        ["/bin/sh", "-c", body["spec"]["script"]], capture_output=True, check=True
    ).stdout
    assert out.decode(errors="surrogateescape").split("\0")[:-1] == args
    assert parse_directives(body["spec"]["script"]).rules == (
        {"action": "hold", "on": ["non-zero-exit"]},
    )


def test_arguments_to_a_script_run_by_another_interpreter_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "train.sbatch"
    path.write_text("#!/usr/bin/env python3\n#SBATCH -p debug\nprint('hi')\n")
    with pytest.raises(ScriptError, match="arguments can be given to a shell script only"):
        build_sbatch_submission(path, ["--x"], cluster="c", chdir="/")
    assert build_sbatch_submission(path, [], cluster="c", chdir="/")["spec"]["script"] == (
        path.read_text()
    )


def test_the_example_script_is_the_walkthrough_s_job(tmp_path: Path) -> None:
    """examples/slurm/digits.sbatch says what examples/slurm/digits.toml says: its name,
    cluster, checkpoint root and policy (validated by the core), and sbatch's directives."""
    body = build_sbatch_submission(DIGITS, [], cluster=None, chdir=str(tmp_path))
    assert body["name"] == "digits"
    spec = body["spec"]
    assert spec["cluster"] == "slurm"
    assert spec["checkpoint"] == "/tmp/dispatch-examples/slurm-digits/{job}"
    assert spec["options"] == {"chdir": str(tmp_path)}
    assert spec["script"] == DIGITS.read_text()
    policy = msgspec.convert(body["policy"], RecoveryPolicy)
    validate_policy(policy)
    assert [(r.action.value, [c.value for c in r.on], r.budget) for r in policy.rules] == [
        ("resubmit", ["preempted", "node-lost"], 3),
        ("hold", ["non-zero-exit"], 0),
        ("resubmit", ["time-limit"], 2),
    ]
    directives = sbatch_directives(DIGITS.read_text())
    assert re.findall(r"--[a-z-]+", " ".join(directives)) == [
        "--job-name",
        "--partition",
        "--time",
        "--exclusive",
        "--mem",
    ]


def test_the_command_line_options_go_before_the_script_and_the_rest_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dispatch sbatch``: an unknown option before the script is a usage error; after it,
    options are the script's, so a malformed script is refused (exit 2, its line number)
    before any API is asked (none listens here)."""
    from dispatch_cli.main import main

    monkeypatch.setenv("DISPATCH_API", "http://127.0.0.1:9")
    monkeypatch.setenv("DISPATCH_TOKEN", "t")
    monkeypatch.setenv("DISPATCH_DATA_DIR", str(tmp_path / "data"))
    script = tmp_path / "bad.sbatch"
    script.write_text(_script("#DISPATCH resubmit on=preempted budget=x", "exec true"))
    assert main(["sbatch", "--bogus", str(script)]) == 2
    assert "No such option '--bogus'" in capsys.readouterr().err
    assert main(["sbatch", str(script), "--epochs", "3", "--watch"]) == 2
    err = capsys.readouterr().err
    assert f"{script}:2: `#DISPATCH resubmit on=preempted budget=x`" in err, err


def test_clusters_on_a_resubmit_line_is_the_failover_list() -> None:
    """Issue 14, part 2: ``clusters=slurm,local`` is the rule's failover list, in order."""
    text = _script(
        "#DISPATCH resubmit on=node-lost,no-capacity,launch-failed budget=3 clusters=slurm,local"
    )
    (got,) = parse_directives(text).rules
    assert got["clusters"] == ["slurm", "local"]
    policy = msgspec.convert({"rules": [got]}, RecoveryPolicy)
    validate_policy(policy)
    assert policy.rules[0].clusters == ("slurm", "local")


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("#DISPATCH hold on=node-lost clusters=slurm,local", "only for resubmit rules"),
        ("#DISPATCH resubmit on=node-lost clusters=slurm,,local", "comma-separated"),
        # the core's own refusals, at the line (the API named only policy.rules[0])
        ("#DISPATCH resubmit on=node-lost clusters=SLURM,local", "'SLURM' is not a cluster"),
        ("#DISPATCH resubmit on=node-lost clusters=slurm,slurm", "'slurm' is listed twice"),
        ('#DISPATCH resubmit on=node-lost clusters="slurm, lab_2"', "'lab_2' is not a cluster"),
    ],
)
def test_a_malformed_clusters_is_refused_with_its_line(line: str, words: str) -> None:
    with pytest.raises(ScriptError) as caught:
        parse_directives(_script(line), source="t")
    assert caught.value.message.startswith("t:2: "), caught.value.message
    assert words in caught.value.message


def test_wait_on_a_no_capacity_line_is_the_rules_wait_s() -> None:
    """``wait=15m``: how long a no-capacity wait is tolerated (``wait_s``)."""
    text = _script("#DISPATCH resubmit on=no-capacity,node-lost wait=15m clusters=slurm,local")
    (got,) = parse_directives(text).rules
    assert got["wait_s"] == 900.0
    policy = msgspec.convert({"rules": [got]}, RecoveryPolicy)
    validate_policy(policy)
    assert policy.rules[0].wait_s == 900.0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("#DISPATCH resubmit on=node-lost wait=15m", "needs on=no-capacity"),
        ("#DISPATCH resubmit on=no-capacity wait=soon", "wait"),
    ],
)
def test_a_malformed_wait_is_refused_with_its_line(line: str, words: str) -> None:
    with pytest.raises(ScriptError) as caught:
        parse_directives(_script(line), source="t")
    assert caught.value.message.startswith("t:2: "), caught.value.message
    assert words in caught.value.message


def test_the_submitted_line_names_a_rule_s_failover_clusters() -> None:
    """``Submitted dispatch job <id> (plan: ...)`` is all ``dispatch sbatch`` prints of the
    plan: a failover rule's clusters, in order, are in it (they were left out, so the
    printed plan read as a rule that resubmits where the job is)."""
    text = _script("#DISPATCH resubmit on=node-lost budget=2 clusters=slurm,local")
    (rule,) = parse_directives(text).rules
    policy = msgspec.convert({"rules": [rule]}, RecoveryPolicy)
    plan = make_plan(JobSpec(cluster="slurm"), policy, Declarations(node_loss_window_s=1))
    assert plan_summary(plan) == "resubmit on node-lost budget 2 fail over slurm -> local"


def test_the_submitted_line_names_a_rule_s_no_capacity_wait() -> None:
    """A no-capacity rule's wait is in the one-line plan too (issue 14 part 2)."""
    text = _script("#DISPATCH resubmit on=no-capacity budget=2 wait=15m clusters=slurm,local")
    (rule,) = parse_directives(text).rules
    policy = msgspec.convert({"rules": [rule]}, RecoveryPolicy)
    plan = make_plan(JobSpec(cluster="slurm"), policy, Declarations(node_loss_window_s=1))
    assert plan_summary(plan) == (
        "resubmit on no-capacity budget 2 fail over slurm -> local after 15 min without capacity"
    )

"""The ``dispatch`` CLI against a real ``dispatch up`` (nats-server, observer, supervisor,
notifier and API as processes, the local backend): submit, status, watch, escalations, each
operator command with its refusals, and the errors a user meets (400, 401, unreachable)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch_cli.errors import EXIT_INVALID
from dispatch_core import COVERABLE_CAUSES
from tests.e2e.cli.conftest import JobFile
from tests.e2e.cli.support import (
    PROGRAM,
    RESUBMIT,
    WAIT_FOR_FLAG,
    Up,
    cli_env,
    eventually,
    flag_of,
    run_cli,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def submitted(up: Up, path: Path, *args: str) -> str:
    """Submit ``path``; return the job id."""
    result = up.dispatch("submit", str(path), "--json", *args)
    assert result.code == 0, str(result)
    job_id: str = result.json()["job_id"]
    return job_id


def running(status: dict[str, Any]) -> bool:
    return bool(status["state"] == "running")


# ------------------------------------------------------------------------------ submit


def test_submit_prints_the_job_id_and_the_plan_with_the_uncovered_causes(
    up: Up, job_file: JobFile
) -> None:
    """The user sees, before the job starts, the rules as applied and every cause no rule
    covers; ``--json`` gives the API's answer."""
    path = job_file("exit 0", rules=RESUBMIT, name="plan")
    as_json = up.dispatch("submit", str(path), "--json")
    assert as_json.code == 0, str(as_json)
    plan = as_json.json()["plan"]
    assert set(plan["uncovered"]) == {c.value for c in COVERABLE_CAUSES} - {
        "preempted",
        "node-lost",
    }

    text = up.dispatch("submit", str(path))
    assert text.code == 0, str(text)
    assert re.search(r"^submitted job plan-[a-z2-7]{8}$", text.out, re.MULTILINE), text.out
    assert "rule 0:     resubmit on preempted, node-lost (budget 3)" in text.out
    assert "uncovered:  " + ", ".join(plan["uncovered"]) in text.out
    assert "an execution ending with one of these fails the job" in text.out


def test_submit_a_batch_script_names_the_job_from_it_and_takes_the_rule_flags(
    up: Up, tmp_path: Path
) -> None:
    """A plain sbatch script: the spec is the script, the name its --job-name, the policy
    from the flags; the local backend runs it (its #SBATCH lines are comments)."""
    script = tmp_path / "train.sbatch"
    script.write_text(
        "#!/bin/sh\n#SBATCH --job-name=Nightly_Train\n#SBATCH --time=5\necho from-the-script\n"
    )
    missing = up.dispatch("submit", str(script))
    assert missing.code == 2, str(missing)
    assert "--cluster" in missing.err

    result = up.dispatch(
        "submit",
        str(script),
        "--cluster",
        "local",
        "--resubmit-on",
        "preempted,node-lost",
        "--budget",
        "2",
        "--hold-on",
        "non-zero-exit",
        "--json",
    )
    assert result.code == 0, str(result)
    answer = result.json()
    assert answer["job_id"].startswith("nightly-train-")
    rules = [(r["action"], r["on"], r["budget"]) for r in answer["plan"]["rules"]]
    assert rules[0] == ("resubmit", ["preempted", "node-lost"], 2)
    assert rules[1][:2] == ("hold", ["non-zero-exit"])

    watched = up.dispatch("watch", answer["job_id"], timeout_s=120)
    assert watched.code == 0, str(watched)
    assert f"job {answer['job_id']} settled: succeeded" in watched.out

    bad = up.dispatch("submit", str(script), "--cluster", "local", "--resubmit-on", "gremlins")
    assert bad.code == 2, str(bad)
    assert "'gremlins' is not a cause a rule may cover" in bad.err


def test_a_malformed_job_file_is_refused_naming_the_field(up: Up, tmp_path: Path) -> None:
    """400 from the API names the field (exit 7); an unknown key or a file that doesn't parse
    is a usage error (exit 2) naming the key or the file, before anything is sent."""
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"spec": {"cluster": "local", "command": ["true"], "colour": 1}}))
    result = up.dispatch("submit", str(typo))
    assert result.code == 2, str(result)
    assert "unknown key `colour` in [spec]" in result.err

    wrong_type = tmp_path / "wrong-type.json"
    wrong_type.write_text(json.dumps({"spec": {"cluster": "local", "command": "true"}}))
    result = up.dispatch("submit", str(wrong_type))
    assert result.code == 7, str(result)
    assert "spec.command" in result.err

    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[spec]\ncluster = "mars"\ncommand = ["true"]\n')
    result = up.dispatch("submit", str(unknown))
    assert result.code == 7, str(result)
    assert "spec.cluster" in result.err

    broken = tmp_path / "broken.toml"
    broken.write_text("[spec\n")
    result = up.dispatch("submit", str(broken))
    assert result.code == 2, str(result)
    assert f"{broken}: not valid TOML" in result.err


# ----------------------------------------------------------------------- status, escalations


def test_status_escalations_and_record_show_a_failed_job_and_how_to_answer(
    up: Up, job_file: JobFile
) -> None:
    """A job no rule covers fails: ``watch`` exits 8, ``status`` shows it in the table and in
    detail with its history and its ``failed:<cause>`` escalation (and the command that
    answers it), ``escalations`` lists it until someone supersedes the job."""
    job = submitted(up, job_file("echo hello; exit 3", name="fails"))
    watched = up.dispatch("watch", job, timeout_s=120)
    assert watched.code == 8, str(watched)
    assert f"job {job} settled: failed" in watched.out

    table = up.dispatch("status")
    assert table.code == 0, str(table)
    row = next(line for line in table.out.splitlines() if line.startswith(job))
    assert row.split()[1:3] == ["failed", "non-zero-exit"]

    detail = up.dispatch("status", job, "--events")
    assert detail.code == 0, str(detail)
    assert "state       failed  (settled)" in detail.out
    assert 'non-zero-exit: "exit code 3" (application)' in detail.out
    assert "history (committed transitions, oldest first)" in detail.out
    assert "failed:non-zero-exit" in detail.out
    assert f'answer: to run it again: {PROGRAM} supersede {job} --reason "..."' in detail.out
    assert "outcome.committed" in detail.out

    def escalated() -> None:
        listed = up.dispatch("escalations", "--json")
        assert listed.code == 0, str(listed)
        mine = [e for e in listed.json()["escalations"] if e["job_id"] == job]
        assert [e["id"] for e in mine] == ["failed:non-zero-exit"], mine
        assert mine[0]["delivered"] is not None, "the notifier delivers it"

    eventually(escalated, timeout_s=30)
    text = up.dispatch("escalations", "--job", job)
    assert "failed:non-zero-exit" in text.out
    # The notifier's terminal channel: `dispatch up` prints each escalation.
    eventually(lambda: _assert_in(f"dispatch job {job}: failed:non-zero-exit", up.output()))

    superseded = up.dispatch("supersede", job, "--reason", "fixed the exit code", "--json")
    assert superseded.code == 0, str(superseded)
    new_job = superseded.json()["new_job_id"]
    listed = up.dispatch("escalations", "--json").json()["escalations"]
    assert job not in {e["job_id"] for e in listed}, "answered by the supersession"
    every = up.dispatch("escalations", "--all", "--json").json()["escalations"]
    assert job in {e["job_id"] for e in every}
    assert up.dispatch("watch", new_job, timeout_s=120).code == 8
    assert up.status(new_job)["supersedes"] == job


def _assert_in(needle: str, haystack: str) -> None:
    assert needle in haystack, f"{needle!r} not printed yet"


# ------------------------------------------------------------------------------ watch


def test_watch_receives_every_status_change_in_order(up: Up, job_file: JobFile) -> None:
    """``watch --json`` prints each Status the stream sends; every transition committed to
    the record (two recoveries from preemption, then success) arrives, in order, as a
    Status of its own; the text form shows each one and ends when the job settles."""
    path = job_file(WAIT_FOR_FLAG, rules=RESUBMIT, name="watched")
    job = submitted(up, path)
    env = up.env()
    cmd = [sys.executable, "-m", "dispatch_cli", "watch", job]
    with (
        subprocess.Popen([*cmd, "--json"], env=env, stdout=subprocess.PIPE, text=True) as raw,
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as human,
    ):
        first = up.object_id(job)
        up.wait_status(job, running)
        up.faults.preempt(first)
        second = up.object_id(job, not_=first)
        up.wait_status(job, lambda s: running(s) and s["submission"] == 2)
        up.faults.preempt(second)
        up.object_id(job, not_=second)
        up.wait_status(job, lambda s: running(s) and s["submission"] == 3)
        flag_of(path).touch()
        raw_out, _ = raw.communicate(timeout=120)
        human_out, _ = human.communicate(timeout=120)
    assert raw.returncode == 0, raw_out
    assert human.returncode == 0, human_out

    received = [json.loads(line) for line in raw_out.splitlines()]
    seqs = [s["seq"] for s in received]
    assert seqs == sorted(seqs), f"out of order: {seqs}"
    assert received[-1]["settled"]
    assert received[-1]["state"] == "succeeded"

    record = up.dispatch("record", job, "--json").json()["events"]
    recoveries = [e for e in record if e["event"]["type"] == "recovery.committed"]
    assert [r["event"]["cause"]["kind"] for r in recoveries] == ["preempted", "preempted"]
    history = received[-1]["history"]
    committed = [(t["state"], t["cause"]["kind"]) for t in history]
    assert committed == [
        ("recovering", "preempted"),
        ("recovering", "preempted"),
        ("succeeded", "none"),
    ]

    # Each committed transition arrived as a Status of its own, in order: the Status whose
    # history first holds transition i shows it as its state.
    shown = [(s["state"], s["cause"]["kind"], len(s["history"])) for s in received]
    for i, (state, kind) in enumerate(committed):
        firsts = [(st, k) for st, k, n in shown if n == i + 1]
        assert firsts[:1] == [(state, kind)], (
            f"transition {i} ({state}, {kind}) was not received as a Status of its own; "
            f"received (state, cause, history length): {shown}"
        )

    lines = human_out.splitlines()
    transitions = [
        line for line in lines if re.search(r"^\d\d:\d\d:\d\d  (recovering|succeeded) ", line)
    ]
    assert len([t for t in transitions if "recovering  preempted" in t]) >= 2, human_out
    assert lines[-1] == f"job {job} settled: succeeded"


# ------------------------------------------------------------------- operator commands


def test_hold_release_and_what_is_refused_on_a_running_job(up: Up, job_file: JobFile) -> None:
    """An actor hold and its release; a second release, a resubmit and a give-up without a
    recovery hold are refused with the core's reason (409, exit 6); cancel, then a second
    cancel refused; supersede makes a new job."""
    path = job_file(WAIT_FOR_FLAG, rules=RESUBMIT, name="operated")
    job = submitted(up, path)
    up.wait_status(job, running)

    held = up.dispatch("hold", job, "--reason", "node maintenance", "--for", "2h", "--json")
    assert held.code == 0, str(held)
    hold = held.json()["status"]["hold"]
    assert (hold["kind"], hold["reason"]) == ("actor", "node maintenance")
    detail = up.dispatch("status", job)
    assert f'  answer      {PROGRAM} release {job} --reason "..."' in detail.out, detail.out
    assert f"{PROGRAM} give-up" not in detail.out, detail.out
    text = up.dispatch("release", job, "--reason", "maintenance done")
    assert text.code == 0, str(text)
    assert f"release: committed to job {job}" in text.out
    assert "hold.released" in text.out

    for command in ("release", "resubmit", "give-up"):
        refused = up.dispatch(command, job, "--reason", "try")
        assert refused.code == 6, str(refused)
        assert refused.err.startswith("error: refused (409): "), refused.err
        assert len(refused.err.removeprefix("error: refused (409): ").strip()) > 10

    no_target = up.dispatch("abandon", job, "--reason", "x")
    assert no_target.code == 2, str(no_target)
    assert "--submission N [--attempt A] or --foreign CLUSTER/ID" in no_target.err
    nothing = up.dispatch("abandon", job, "--submission", "7", "--reason", "no such thing")
    assert nothing.code == 6, str(nothing)

    missing_reason = up.dispatch("cancel", job)
    assert missing_reason.code == 2
    assert "--reason" in missing_reason.err

    cancelled = up.dispatch("cancel", job, "--reason", "wrong learning rate")
    assert cancelled.code == 0, str(cancelled)
    up.wait_status(job, lambda s: s["state"] == "cancelled" and s["settled"])
    again = up.dispatch("cancel", job, "--reason", "again")
    assert again.code == 6, str(again)
    assert "refused (409)" in again.err

    superseded = up.dispatch("supersede", job, "--reason", "right rate this time")
    assert superseded.code == 0, str(superseded)
    new_job = re.search(r"^new job (\S+) supersedes", superseded.out, re.MULTILINE)
    assert new_job is not None, superseded.out
    up.wait_status(new_job.group(1), running)
    flag_of(path).touch()
    assert up.dispatch("watch", new_job.group(1), timeout_s=120).code == 0


def test_a_recovery_hold_is_answered_by_resubmit_and_give_up(up: Up, job_file: JobFile) -> None:
    """A hold rule holds the job after it exits non-zero: ``status`` and ``watch`` show the
    exit code that ended it and the commands that answer the hold (no escalation says so
    before the hold is overdue, but ``up``'s held notice does at once); release is refused
    (a recovery hold), resubmit runs a new submission, give-up fails the job with the
    ending cause."""
    rules = [{"on": ["non-zero-exit"], "action": "hold"}]
    job = submitted(up, job_file("exit 4", rules=rules, name="held"))

    def recovery_held(status: dict[str, Any]) -> bool:
        return status["state"] == "held" and (status["hold"] or {}).get("kind") == "recovery"

    up.wait_status(job, recovery_held)
    # Held notices are on under `dispatch up` (issue 15): the notifier tells the terminal
    # channel at once that the job waits for a person; it is no escalation in the record.
    eventually(lambda: _assert_in(f"dispatch job {job}: held:1:", up.output()), timeout_s=30)
    # ... with answers naming the CLI as this terminal runs it (NOTIFIER_ANSWER_COMMAND)
    assert f'{PROGRAM} resubmit {job} --reason "..."' in up.output(), up.output()
    answers = [
        f'{PROGRAM} resubmit {job} --reason "..."',
        f'{PROGRAM} cancel {job} --reason "..."',
        f'{PROGRAM} give-up {job} --reason "..."',
    ]
    detail = up.dispatch("status", job)
    assert detail.code == 0, str(detail)
    assert '  ended by    non-zero-exit: "exit code 4" (application)' in detail.out, detail.out
    assert f"  answer      {answers[0]}" in detail.out, detail.out
    for answer in answers:
        assert answer in detail.out, detail.out
    assert f"{PROGRAM} release" not in detail.out, detail.out
    listing = up.dispatch("status")
    (row,) = [line for line in listing.out.splitlines() if line.startswith(job)]
    assert "recovery on non-zero-exit (exit 4)" in row, listing.out

    refused = up.dispatch("release", job, "--reason", "let it run")
    assert refused.code == 6, str(refused)

    resubmitted = up.dispatch("resubmit", job, "--reason", "flaky node", "--json")
    assert resubmitted.code == 0, str(resubmitted)
    up.wait_status(job, lambda s: recovery_held(s) and s["submission"] == 2)

    cmd = [sys.executable, "-m", "dispatch_cli", "watch", job]
    with subprocess.Popen(cmd, env=up.env(), stdout=subprocess.PIPE, text=True) as watching:
        assert watching.stdout is not None
        for line in watching.stdout:  # the held line, then the hint, once
            if f"{PROGRAM} give-up" in line:
                break
        gave_up = up.dispatch("give-up", job, "--reason", "fails every time")
        assert gave_up.code == 0, str(gave_up)
        rest, _ = watching.communicate(timeout=120)
    assert watching.returncode == 8, rest
    final = up.wait_status(job, lambda s: s["settled"])
    assert (final["state"], final["cause"]["kind"]) == ("failed", "non-zero-exit")
    assert "ended by" not in rest, f"the hint shown again: {rest}"
    assert f"{PROGRAM} give-up" not in rest, f"the hint shown again: {rest}"


def test_emergency_stop_cancels_a_running_job(up: Up, job_file: JobFile) -> None:
    """Emergency stop kills the job's objects and cancels it."""
    job = submitted(up, job_file(WAIT_FOR_FLAG, name="runaway"))
    up.wait_status(job, running)
    stopped = up.dispatch("emergency-stop", job, "--reason", "writing to the wrong bucket")
    assert stopped.code == 0, str(stopped)
    final = up.wait_status(job, lambda s: s["settled"])
    assert final["state"] == "cancelled"


def test_abandon_disposes_of_a_foreign_object(up: Up, job_file: JobFile) -> None:
    """An object named for the job that isn't dispatch's escalates ``foreign:<id>``;
    ``dispatch status`` says how to answer, and ``abandon --foreign`` does."""
    path = job_file(WAIT_FOR_FLAG, name="crowded")
    job = submitted(up, path)
    up.wait_status(job, running)
    foreign = up.faults.foreign(job)

    def escalated() -> None:
        listed = up.dispatch("escalations", "--job", job, "--json").json()["escalations"]
        assert f"foreign:{foreign}" in [e["id"] for e in listed], listed

    eventually(escalated, timeout_s=60)
    detail = up.dispatch("status", job)
    assert f"{PROGRAM} abandon {job} --foreign local/{foreign}" in detail.out, detail.out

    up.faults.preempt(foreign)  # "stop it on the scheduler yourself"
    bad = up.dispatch("abandon", job, "--foreign", "local-no-slash", "--reason", "x")
    assert bad.code == 2, str(bad)
    done = up.dispatch(
        "abandon", job, "--foreign", f"local/{foreign}", "--reason", "stopped by hand"
    )
    assert done.code == 0, str(done)
    assert "abandoned" in done.out
    flag_of(path).touch()
    final = up.wait_status(job, lambda s: s["settled"])
    assert final["state"] == "succeeded"


# ------------------------------------------------------------------------------ errors


def test_a_bad_token_is_refused_with_a_hint(up: Up) -> None:
    """401: exit 4, saying where the right token is."""
    result = up.dispatch("status", DISPATCH_TOKEN="not-the-token")
    assert result.code == 4, str(result)
    assert f"the API at {up.api} refused the token (401" in result.err
    assert "DISPATCH_TOKEN" in result.err


def test_an_unreachable_api_says_where_and_how_to_start_one(tmp_path: Path) -> None:
    """Nothing listening: exit 3, naming the address and `dispatch up`."""
    from dispatch_cli.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env({"DISPATCH_API": url, "DISPATCH_DATA_DIR": str(tmp_path)})
    result = run_cli("status", env=env)
    assert result.code == 3, str(result)
    assert f"cannot reach the dispatch API at {url} (connection refused)" in result.err
    assert f"`{PROGRAM} up`" in result.err
    watched = run_cli("watch", "some-job", env=env)
    assert watched.code == 3, str(watched)


def test_every_command_explains_itself_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` of each command has an example; the top level lists the exit codes."""
    from dispatch_cli.main import cli, main

    assert main(["--help"]) == 0
    top = capsys.readouterr().out
    assert "Exit codes:" in top
    for name in cli.commands:
        assert main([name, "--help"]) == 0
        text = capsys.readouterr().out
        assert "Example" in text, f"dispatch {name} --help has no example:\n{text}"
        assert f"dispatch {name}" in text.split("Example", 1)[1]


def test_logs_offers_no_json_it_cannot_print(capsys: pytest.CaptureFixture[str]) -> None:
    """``logs`` prints the job's own bytes; it offered ``--json`` ("Print JSON") and printed
    the raw output anyway. The option is gone, so asking for it is a usage error."""
    from dispatch_cli.main import main

    assert main(["logs", "--help"]) == 0
    assert "--json" not in capsys.readouterr().out
    assert main(["logs", "some-job", "--json"]) == 2
    assert "No such option '--json'" in capsys.readouterr().err
    assert main(["status", "--help"]) == 0
    assert "--json" in capsys.readouterr().out


# ------------------------------------------------------------------------------ up


@pytest.mark.timeout(600)
def test_up_started_again_continues_from_the_same_data(tmp_path: Path, job_file: JobFile) -> None:
    """Ctrl-C stops every part cleanly (the job keeps running on the local backend); a new
    ``up`` on the same data directory has the same token, the same record and supervises
    the job to its end."""
    first = Up(tmp_path / "data")
    first.start()
    try:
        token = first.token
        assert (first.data_dir / "token").stat().st_mode & 0o777 == 0o600
        path = job_file(WAIT_FOR_FLAG, rules=RESUBMIT, name="survivor")
        job = submitted(first, path)
        up_status = first.wait_status(job, running)
        before = first.dispatch("record", job, "--json").json()["events"]
        assert first.stop() == 0
        out = first.output()
        for part in ("api", "notifier", "supervisor", "observer", "nats"):
            assert f"stopped {part}" in out, out
        assert out.index("stopped api") < out.index("stopped nats")
        assert "1 job(s) keep running on the local backend" in out
        # the command it names starts this data again (a bare `up` would start the default)
        resume = f"up --data-dir {first.data_dir.resolve()} --port {first.port}` again"
        assert resume in out, out
        assert not (first.data_dir / "up.json").exists()

        gone = run_cli("status", env=first.env())
        assert gone.code == 3, str(gone)

        second = Up(tmp_path / "data")
        second.start()
        try:
            assert second.token == token
            again = second.status(job)
            assert again["state"] == "running"
            assert again["objects"] == up_status["objects"]
            after = second.dispatch("record", job, "--json").json()["events"]
            assert after[: len(before)] == before
            flag_of(path).touch()
            watched = second.dispatch("watch", job, timeout_s=120)
            assert watched.code == 0, str(watched)
        finally:
            second.close()
    finally:
        first.close()


# ------------------------------------------------------------------------------ demo


@pytest.mark.timeout(420)
def test_dispatch_demo_preempts_resubmits_and_resumes_from_a_checkpoint(tmp_path: Path) -> None:
    """``dispatch demo`` starting its own ``up``: the training job is preempted after its
    first checkpoints, resubmitted by its rule, resumed from a published step > 0, and
    succeeds; the output shows each of those and the summary."""
    data = tmp_path / "demo"
    env = cli_env({"DISPATCH_DATA_DIR": str(data)})
    result = run_cli("demo", "--data-dir", str(data), "--json", env=env, timeout_s=400)
    assert result.code == 0, str(result)
    out = result.out
    assert "checkpoints published; preempting object local/" in out
    assert re.search(r"recovering  preempted: \"preempted by fault injection\"", out), out
    resumed = re.search(r"\| resumed from checkpoint step (\d+)", out)
    assert resumed is not None, out
    assert int(resumed.group(1)) > 0
    assert re.search(r"succeeded   none: \"exit code 0\"", out), out
    assert "demo done: preempted, resubmitted by its rule, resumed from step" in out
    summary = json.loads(next(x for x in reversed(out.splitlines()) if x.startswith('{"job_id"')))
    assert summary["state"] == "succeeded"
    first, second = summary["executions"]
    assert first["resumed_from_step"] is None
    assert second["resumed_from_step"] > 0
    assert second["epoch"] > first["epoch"]
    assert summary["final_loss"] is not None
    assert not (data / "up.json").exists(), "the demo stops the up it started"


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    """Ctrl-C while the job trains: exit 130, the demo's own ``up`` stopped, its job killed,
    nothing left running."""
    data = tmp_path / "demo"
    out_path = tmp_path / "demo.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatch_cli", "demo", "--data-dir", str(data)],
            env=cli_env({"DISPATCH_DATA_DIR": str(data)}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            eventually(
                lambda: _assert_in("| epoch 1/", out_path.read_text(errors="replace")),
                timeout_s=180,
            )
            proc.send_signal(signal.SIGINT)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = out_path.read_text(errors="replace")
    assert code == 130, text
    assert "stopping the demo's dispatch" in text
    assert "stream lost" not in text
    assert text.rstrip().endswith("interrupted")
    assert not (data / "up.json").exists()
    for obj in (data / "local" / "objects").iterdir():
        assert (obj / "status.json").exists(), f"object {obj.name} still running"


def test_a_misspelt_key_and_an_integer_option_are_named_by_submit(up: Up, tmp_path: Path) -> None:
    """Issue 16: ``comand =`` is named as an unknown key (not "neither a command nor a
    script"), and ``gpus = 2`` keeps its key in the error."""
    comand = tmp_path / "comand.toml"
    comand.write_text('[spec]\ncluster = "local"\ncomand = ["python", "train.py"]\n')
    result = up.dispatch("submit", str(comand))
    assert result.code == 2, str(result)
    assert "unknown key `comand` in [spec] (did you mean `command`?" in result.err
    assert "neither a command nor a script" not in result.err

    gpus = tmp_path / "gpus.toml"
    gpus.write_text('[spec]\ncluster = "local"\ncommand = ["true"]\noptions = { gpus = 2 }\n')
    result = up.dispatch("submit", str(gpus))
    assert result.code == 2, str(result)
    assert 'spec.options.gpus: expected a string, got an integer (2); quote it: gpus = "2"' in (
        result.err
    )


# ------------------------------------------------------------------ status listing, completion


def test_status_lists_cluster_age_and_checkpoint_filtered_and_a_page_at_a_time(
    up: Up, job_file: JobFile, tmp_path: Path
) -> None:
    """``dispatch status`` shows each job's cluster, age and latest published checkpoint,
    filters by --state and --cluster, and pages with --limit/--after (the last line names
    the next page); ``--json`` gives the same page."""
    from dispatch_ckpt import Checkpoints

    ids = [f"zzpage-{i}" for i in (1, 2, 3)]
    flags = []
    for job_id in ids:
        path = job_file(WAIT_FOR_FLAG, job_id=job_id)
        body = json.loads(path.read_text())
        body["spec"]["checkpoint"] = str(tmp_path / "ckpt" / "{job}")
        path.write_text(json.dumps(body))
        flags.append(flag_of(path))
        assert submitted(up, path) == job_id
    try:
        for job_id in ids:
            up.wait_status(job_id, running)
        root = tmp_path / "ckpt" / "zzpage-2"
        save = root / "exec" / "1" / "checkpoint-500"
        save.mkdir(parents=True)
        Checkpoints.open(str(root), attempt="1", epoch=10**6).publish(500, str(save))

        first = up.dispatch("status", "--after", "zzpage-0", "--limit", "2")
        assert first.code == 0, str(first)
        lines = first.out.splitlines()
        assert lines[0].split() == [
            "JOB", "STATE", "CAUSE", "CLUSTER", "AGE", "CHECKPOINT", "SUB", "HOLD", "SETTLED",
            "SUPERSEDED",
        ]  # fmt: skip
        rows = [line.split() for line in lines[1:-1]]
        assert [r[0] for r in rows] == ["zzpage-1", "zzpage-2"], first.out
        assert all(r[1:4] == ["running", "none", "local"] for r in rows), first.out
        assert all(re.fullmatch(r"\d+[smhd]", r[4]) for r in rows), first.out
        assert rows[0][5] == "-", first.out  # the job wrote nothing: its root is not there
        assert rows[1][5:7] == ["step", "500"], first.out
        assert lines[-1] == f"more: {PROGRAM} status --limit 2 --after zzpage-2", first.out

        second = up.dispatch("status", "--limit", "2", "--after", "zzpage-2")
        assert second.code == 0, str(second)
        assert [line.split()[0] for line in second.out.splitlines()[1:]] == ["zzpage-3"]
        assert "more:" not in second.out

        filtered = up.dispatch(
            "status", "--after", "zzpage-0", "--cluster", "local", "--state", "running"
        )
        assert [line.split()[0] for line in filtered.out.splitlines()[1:]] == ids
        # A cluster the API doesn't know is said, not listed as if it had no jobs.
        elsewhere = up.dispatch("status", "--after", "zzpage-0", "--cluster", "mars")
        assert elsewhere.code == EXIT_INVALID, str(elsewhere)
        assert elsewhere.out == "", str(elsewhere)
        assert elsewhere.err.strip() == (
            "error: invalid request (400 unknown-cluster) (field cluster): "
            "unknown cluster 'mars' (known: local)"
        ), str(elsewhere)
        settled = up.dispatch("status", "--after", "zzpage-0", "--state", "succeeded")
        assert "zzpage" not in settled.out

        as_json = up.dispatch("status", "--after", "zzpage-0", "--limit", "2", "--json")
        page = as_json.json()
        assert page["next_after"] == "zzpage-2"
        assert [j["job"]["job_id"] for j in page["jobs"]] == ["zzpage-1", "zzpage-2"]
        assert page["jobs"][1]["cluster"] == "local"
        assert page["jobs"][1]["checkpoint_root"] == str(root)
        assert page["jobs"][1]["latest_checkpoint"] == "step 500"
    finally:
        for flag in flags:
            flag.touch()
    for job_id in ids:
        up.wait_status(job_id, lambda s: s["settled"], timeout_s=120)


def test_job_ids_complete_in_the_shell(up: Up, job_file: JobFile) -> None:
    """click's completion protocol (what ``eval "$(_DISPATCH_COMPLETE=bash_source dispatch)"``
    installs) completes a JOB argument from the API's jobs."""
    job = submitted(up, job_file("true", job_id="zzcomplete-1"))
    result = up.dispatch(
        _DISPATCH_COMPLETE="bash_complete", COMP_WORDS="dispatch status zzcompl", COMP_CWORD="2"
    )
    assert result.code == 0, str(result)
    assert result.out.split() == [f"plain,{job}"], str(result)
    for command in ("watch", "hold", "supersede", "record"):
        words = f"dispatch {command} zzcompl"
        done = up.dispatch(_DISPATCH_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD="2")
        assert done.out.split() == [f"plain,{job}"], (command, str(done))
    source = up.dispatch(_DISPATCH_COMPLETE="bash_source")
    assert "_DISPATCH_COMPLETE=bash_complete" in source.out, str(source)

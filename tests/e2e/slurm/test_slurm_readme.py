"""Every command of the READMEs' Slurm sections, run as written (issue 16): README.md's "Run
on Slurm" and the whole of ``examples/slurm/README.md``, each in a shell of its own where
only the install command has run.

**The shell** is bash (``set -eu``: the first failing command fails the test), in a directory
laid out like the repository's root after ``scripts/install.sh``: the checkout's files and
``.venv`` (this test's environment: the install made it), with a fresh ``HOME`` (so a
``dispatch up`` of the user's is never found) and a ``PATH`` without the virtualenv (so a
bare ``dispatch`` or ``python`` with torch would fail, as on a fresh machine).
``PYTHONPATH`` names this checkout's sources only because the shared virtualenv is an
editable install of another checkout; on CI's own install it changes nothing.

**The commands**: every line of every ``sh`` block, in order, variables carrying from one
block to the next as in one terminal. The one command a README says runs in a terminal of
its own, ``.venv/bin/dispatch up ...``, is started in the background (its output kept),
and the shell waits until its API answers, as a person waits for it to say it is ready;
it is stopped with SIGINT (Ctrl-C) at the end.

README.md's section takes about a minute (an 8-epoch run); the walkthrough about 6 minutes
(preemption, a lost node, a time limit, completion, then Slurm's own requeue, then a failover
to the local cluster with its checkpoints on an S3 server the walkthrough starts).

Whatever happens, the session's background processes (the S3 server) are ended with its
process group, and every node of the test cluster a command left down is resumed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.e2e.cli.support import REPO
from tests.e2e.slurm.harness import nodes
from tests.integration.slurm.test_slurm_support import resume_node

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

_UP: Final = re.compile(r"^\.venv/bin/dispatch up\b")
_WAIT_UP: Final = r"""
dispatch_up_ready() {  # the test waits as a person waits for `dispatch up` to say it's ready
    for _ in $(seq 1 600); do
        .venv/bin/dispatch status > /dev/null 2>&1 && return 0
        kill -0 "$up_pid" 2> /dev/null || { cat "$UP_LOG"; return 1; }
        sleep 0.5
    done
    cat "$UP_LOG"; return 1
}
"""


def sh_blocks(text: str) -> list[str]:
    """The ``sh`` blocks of a Markdown text, in order."""
    return [block for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL)]


def readme_section() -> str:
    """README.md's "Run on Slurm" section."""
    text = (REPO / "README.md").read_text()
    return text.split("## Run on Slurm", 1)[1].split("\n## ", 1)[0]


def session(blocks: list[str]) -> str:
    """One bash script running the blocks' lines in order (see the module docstring)."""
    lines = ["set -eu", _WAIT_UP]
    for block in blocks:
        for line in block.splitlines():
            if _UP.match(line):
                command = line.split("  #", 1)[0].strip()
                lines.append(f'{command} > "$UP_LOG" 2>&1 &')
                lines.append("up_pid=$!")
                lines.append("dispatch_up_ready")
            else:
                lines.append(line)
    return "\n".join(lines) + "\n"


def _shell_env(home: Path, up_log: Path) -> dict[str, str]:
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p != venv_bin]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DISPATCH_", "PYTHON", "VIRTUAL_ENV", "XDG_"))
    }
    env.update(
        HOME=str(home),
        PATH=os.pathsep.join(path),
        PYTHONPATH=os.pathsep.join([str(REPO / "libs"), str(REPO / "libs" / "ckpt"), str(REPO)]),
        UP_LOG=str(up_log),
    )
    return env


def run_session(tmp_path: Path, blocks: list[str], timeout_s: float) -> str:
    """Run the blocks in a fresh root-like directory; return what the shell printed."""
    root = tmp_path / "checkout"
    root.mkdir()
    for entry in REPO.iterdir():  # the checkout's files, but its own .venv
        if entry.name not in (".venv", ".git") and not entry.name.endswith("_cache"):
            (root / entry.name).symlink_to(entry)
    (root / ".venv").symlink_to(Path(sys.prefix))
    home = tmp_path / "home"
    home.mkdir()
    up_log = tmp_path / "up.log"
    env = _shell_env(home, up_log)
    assert shutil.which("dispatch", path=env["PATH"]) is None, "dispatch is on PATH"
    script = tmp_path / "session.sh"
    script.write_text(session(blocks))
    log = tmp_path / "session.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-x", str(script)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = -9
        finally:
            _stop_up(env, root)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(Exception):  # never hide why the session failed
                for node in nodes():
                    resume_node(node)
    output = log.read_text(errors="replace")
    assert code == 0, f"exit {code}\n{output[-8000:]}\n--- dispatch up\n{_tail(up_log)}"
    return output


def _stop_up(env: dict[str, str], root: Path) -> None:
    """Ctrl-C the ``dispatch up`` the session started (its pid is in its data dir)."""
    state = Path(env["HOME"]) / ".local" / "share" / "dispatch" / "up.json"
    if not state.exists():
        return
    pid = int(re.search(r'"pid":\s*(\d+)', state.read_text()).group(1))  # type: ignore[union-attr]
    try:
        os.kill(pid, 2)
    except ProcessLookupError:
        return
    for _ in range(600):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        subprocess.run(["sleep", "0.1"], check=False)
    os.kill(pid, 9)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-4000:]
    except OSError:
        return ""


def _final_losses(output: str) -> list[str]:
    return re.findall(r"^final loss (\S+) accuracy", output, re.MULTILINE)


@pytest.mark.timeout(600)
def test_the_readme_s_run_on_slurm_commands_run_as_written(tmp_path: Path) -> None:
    blocks = sh_blocks(readme_section())
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert [c.split()[0] for c in commands] == [
        "scripts/slurm-cluster.sh",
        ".venv/bin/dispatch",
        ".venv/bin/dispatch",
    ], commands
    output = run_session(tmp_path, blocks, timeout_s=540)
    assert "slurm-cluster: READY" in output, output[-4000:]
    assert re.search(r"^Submitted dispatch job digits-\S+ \(plan: resubmit on", output, re.M)
    assert re.search(r"^job digits-\S+ settled: succeeded$", output, re.M), output[-4000:]


@pytest.mark.timeout(1200)
def test_the_slurm_walkthrough_s_commands_run_as_written(tmp_path: Path) -> None:
    """The walkthrough's job is preempted, loses a node, hits its time limit, completes
    with the uninterrupted run's final loss; then the REQUEUE run completes; then the
    failover job, its Slurm nodes all set down, completes on the local cluster from its
    publication on S3 with the uninterrupted run's final loss."""
    blocks = sh_blocks((REPO / "examples" / "slurm" / "README.md").read_text())
    assert len(blocks) >= 8, blocks
    assert not [
        line
        for block in blocks
        for line in block.splitlines()
        if re.match(r"^\s*(dispatch|python3?)\s", line)
    ], "a bare dispatch or python: not on PATH after the install"
    output = run_session(tmp_path, blocks, timeout_s=1100)
    walkthrough, _, failover = output.partition("examples/slurm/digits-failover.toml")
    # dispatch's run, then the uninterrupted one: equal. (Under load an execution can print
    # its final loss and still be timed out; the next resumes from its last save and prints
    # the same loss again: every line equal either way.)
    losses = _final_losses(walkthrough)
    assert len(losses) >= 2, walkthrough[-6000:]
    assert len(set(losses)) == 1, f"dispatch's run vs uninterrupted: {losses}"
    losses = _final_losses(failover)
    assert len(losses) == 2, failover[-6000:]
    assert losses[0] == losses[1], f"failed over {losses[0]} vs uninterrupted {losses[1]}"
    settled = re.findall(r"^job (digits\S*) settled: (\S+)$", output, re.M)
    assert [state for _, state in settled] == ["succeeded"] * 3, settled
    assert [job.rsplit("-", 1)[0] for job, _ in settled] == [
        "digits",
        "digits-requeue",
        "digits-failover",
    ], settled
    # the failover job's local execution: a higher epoch, resumed from the Slurm one's save
    assert re.search(r"^DISPATCH_EPOCH=2000000$", output, re.M), output[-6000:]
    assert re.search(r"^resumed exec/\d+-r0-\S+ epoch=1000000 step=\d+$", output, re.M)
    # `dispatch status "$job"`'s history: every cause, in Slurm's words
    for words in ('preempted: "PREEMPTED', 'node-lost: "NODE_FAIL', 'time-limit: "TIMEOUT'):
        assert words in output, words

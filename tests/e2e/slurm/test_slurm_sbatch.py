"""``examples/slurm/digits.sbatch`` on the real Slurm test cluster, two ways (issue 14 part 3):

* ``dispatch sbatch examples/slurm/digits.sbatch`` through ``dispatch up --clusters
  examples/slurm/clusters.toml``: it prints ``Submitted dispatch job <id> (plan: ...)`` and
  the uncovered causes; the walkthrough's preemption (a ``high`` job on its node, partition
  ``lowcancel``) ends submission 1 ``preempted`` and the ``#DISPATCH resubmit`` rule
  submits submission 2, which resumes from the latest publication in the ``#DISPATCH
  checkpoint=`` root;
* plain ``sbatch examples/slurm/digits.sbatch``: Slurm runs the same script (the
  ``#DISPATCH`` lines are comments) to ``COMPLETED``, without a checkpoint root.

Both run in a directory laid out like the repository's root after ``scripts/install.sh``
(``examples/`` and ``.venv``, here the test's own environment), as the README says to.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from tests.e2e.cli.support import REPO, Up, eventually, run_cli
from tests.integration.slurm.test_slurm_support import cluster_report, require_cluster, run, sbatch

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

CLUSTERS: Final = REPO / "examples" / "slurm" / "clusters.toml"
SCRIPT: Final = "examples/slurm/digits.sbatch"
WAIT_S: Final = 240.0
"""Bound of each wait (a loaded machine starts Python and torch slowly)."""
_SUBMITTED: Final = re.compile(r"^Submitted dispatch job (\S+) \(plan: (.*)\)$", re.MULTILINE)
_RESUMED: Final = re.compile(r"^resumed \S+ epoch=(\d+) step=(\d+)$", re.MULTILINE)


def _checkout(tmp_path: Path) -> Path:
    """A directory like the repository's root after the install: ``examples/`` and
    ``.venv`` (this test's environment)."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "examples").symlink_to(REPO / "examples")
    (root / ".venv").symlink_to(Path(sys.prefix))
    return root


def _running(job: str) -> tuple[str, str]:
    """(Slurm job id, node) of the dispatch job's running Slurm job."""
    out = run("squeue", "-h", "-n", f"dj-{job}", "-t", "RUNNING", "-o", "%i %N").stdout.split()
    assert len(out) == 2, f"squeue: {out}"
    return out[0], out[1]


@contextlib.contextmanager
def _explained(up: Up, job: str) -> Iterator[None]:
    """A failed wait in the body says why the job did not run: the cluster's nodes and jobs,
    the job's dispatch events, and the tail of ``dispatch up``'s log."""
    try:
        yield
    except AssertionError as failed:
        events = up.dispatch("status", job, "--events")
        raise AssertionError(
            f"{failed}\n{cluster_report()}\n--- dispatch status {job} --events:\n"
            f"{events.out}{events.err}\n--- dispatch up (tail):\n{up.output()[-4000:]}"
        ) from failed


def _output(job: str, slurm_id: str) -> str:
    path = Path("/tmp") / f"dj-{job}-{slurm_id}.out"  # output_dir of clusters.toml
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.mark.timeout(900)
def test_dispatch_sbatch_submits_the_digits_script_and_its_preemption_is_recovered(
    tmp_path: Path,
) -> None:
    require_cluster()
    checkout = _checkout(tmp_path)
    up = Up(tmp_path / "data", args=("--clusters", str(CLUSTERS)))
    up.start()
    job = ""
    try:
        submitted = run_cli(
            "sbatch", SCRIPT, "--epochs", "40", "--epoch-s", "1", env=up.env(), cwd=checkout
        )
        assert submitted.code == 0, str(submitted)
        match = _SUBMITTED.search(submitted.out)
        assert match is not None, str(submitted)
        job = match.group(1)
        assert job.startswith("digits-"), job
        assert match.group(2) == (
            "resubmit on preempted,node-lost budget 3; hold on non-zero-exit; "
            "resubmit on time-limit budget 2"
        ), str(submitted)
        uncovered = re.search(r"^uncovered: (.*) \(an execution", submitted.out, re.MULTILINE)
        assert uncovered is not None, str(submitted)
        assert "out-of-memory" in uncovered.group(1), str(submitted)

        with _explained(up, job):
            first, node = eventually(lambda: _running(job), timeout_s=WAIT_S, interval_s=0.5)
            eventually(
                lambda: _assert_in("saved step=", _output(job, first)),
                timeout_s=WAIT_S,
                interval_s=0.5,
            )
        assert "DISPATCH_EPOCH=1000000" in _output(job, first)
        sbatch("-p", "high", "-w", node, "--exclusive", "--output=/dev/null", "--wrap", "sleep 5")

        with _explained(up, job):
            up.wait_status(
                job, lambda s: s["submission"] == 2 and s["state"] == "running", timeout_s=WAIT_S
            )
            second, _ = eventually(lambda: _running(job), timeout_s=WAIT_S, interval_s=0.5)
        assert second != first
        resumed = eventually(
            lambda: _found(_RESUMED, _output(job, second)), timeout_s=WAIT_S, interval_s=0.5
        )
        assert resumed.group(1) == "1000000", resumed.group(0)
        assert int(resumed.group(2)) >= 1, resumed.group(0)
        assert "DISPATCH_EPOCH=2000000" in _output(job, second)
        root = Path("/tmp/dispatch-examples/slurm-digits") / job
        assert (root / "pub").is_dir(), f"no publications in {root}"  # #DISPATCH checkpoint=

        events = up.dispatch("status", job, "--events")
        assert events.code == 0, str(events)
        assert "PREEMPTED 0:15" in events.out, str(events)

        cancelled = up.dispatch("cancel", job, "-r", "test done")
        assert cancelled.code == 0, str(cancelled)
        up.wait_status(job, lambda s: s["state"] == "cancelled", timeout_s=WAIT_S)
        for slurm_id in (first, second):
            with contextlib.suppress(OSError):
                (Path("/tmp") / f"dj-{job}-{slurm_id}.out").unlink()
    finally:
        if job:
            with contextlib.suppress(Exception):
                run("scancel", f"--name=dj-{job}", check=False)
        up.close()


@pytest.mark.timeout(300)
def test_plain_sbatch_runs_the_same_script_its_dispatch_lines_being_comments(
    tmp_path: Path,
) -> None:
    require_cluster()
    checkout = _checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    out = _run_in(checkout, env, "sbatch", "--parsable", SCRIPT, "--epochs", "2")
    slurm_id = out.strip().split(";")[0]
    try:
        state = eventually(lambda: _ended(slurm_id), timeout_s=WAIT_S, interval_s=0.5)
        output = (checkout / f"slurm-{slurm_id}.out").read_text(errors="replace")
        assert state == "COMPLETED", output
        assert "epoch 1 loss" in output, output
        assert "fresh start" not in output, output  # no checkpoint root under plain sbatch
        assert "DISPATCH_" not in output, output
        name = run("squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%j").stdout.strip()
        assert name == "digits"
    finally:
        run("scancel", slurm_id, check=False)


def _run_in(cwd: Path, env: dict[str, str], *argv: str) -> str:
    """Run a plain command in ``cwd``; return its output (it must succeed)."""
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{argv}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def _ended(slurm_id: str) -> str:
    state = run("squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%T").stdout.strip()
    assert state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED"), state
    return state


def _assert_in(needle: str, text: str) -> None:
    assert needle in text, text[-2000:]


def _found(pattern: re.Pattern[str], text: str) -> re.Match[str]:
    match = pattern.search(text)
    assert match is not None, text[-2000:]
    return match

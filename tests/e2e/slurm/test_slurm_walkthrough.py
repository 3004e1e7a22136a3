"""The main job on real input, end to end through the services on the real nats-server and
the real Slurm test cluster (issue 6, "The main job on real input"; ``examples/slurm/README.md``,
"Run on Slurm").

``examples/slurm/train.py`` (a small MLP on scikit-learn's digits, checkpointing through
``dispatch_ckpt``) is submitted through dispatch with the example's policy, and interrupted
the ways clusters interrupt jobs:

1. preempted by a ``high`` job in partition ``lowcancel`` (PreemptMode=CANCEL) -> resubmitted
   with a higher epoch, resuming from the latest publication;
2. its node set down (``scontrol update nodename=... state=down``) -> node-lost, resubmitted
   on another node (``--exclude``);
3. the time limit -> resubmitted under its budget;
4. it completes: its final loss equals, within 1e-6, that of the same script run once
   without interruption, and the record shows every cause with Slurm's words.

**Independent of machine speed** (issue 15: it once failed at load 10, when training slower
than fixed 1-minute windows timed out three executions and spent the budget). Every
submission runs under a time limit far beyond the training (``TIME_LIMIT_MIN``), so
slowness never ends one; the time limit of step 3 is *driven*: once execution 3 has resumed
and published a save, the test lowers its limit to Slurm's least, 1 minute (``scontrol
update jobid=... TimeLimit=1``), and Slurm times it out. The training is long enough
(``EPOCHS`` epochs of at least ``EPOCH_S`` s) that execution 3 can't finish first, however
fast the machine; the waits are bounded by ``WAIT_S``, which only bounds how long a broken
run takes to fail.

A second run, in partition ``low`` (PreemptMode=REQUEUE) with a ``requeue`` rule: Slurm
requeues the job, dispatch records ``preempted`` from accounting, the epoch's R rises, and
the resumed execution never resumes from a save the old one publishes late (a straggler the
old execution leaves behind, which Slurm's ``proctrack/linuxproc`` doesn't kill).

Nodes put down are resumed in a ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pytest

import dispatch_backends
from dispatch_ckpt.names import Publication, parse_name
from dispatch_core import (
    Action,
    CauseKind,
    Enforcer,
    ExecutionEnded,
    Job,
    JobSpec,
    RecoveryCommitted,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
    epoch,
)
from dispatch_core.state import ObjectRef, ObservedObject
from tests.e2e.slurm.harness import CLUSTER, SlurmRuntime
from tests.integration.slurm.test_slurm_support import down_node, run, sbatch
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

REPO: Final = Path(__file__).resolve().parents[3]
TRAIN: Final = REPO / "examples" / "slurm" / "train.py"
_LIBS: Final = Path(dispatch_backends.__file__).resolve().parent.parent
PYTHONPATH: Final = os.pathsep.join([str(_LIBS), str(_LIBS / "ckpt")])
_RESUMED: Final = re.compile(r"^resumed (\S+) epoch=(\d+) step=(\d+)$", re.MULTILINE)
STRAGGLER_STEP: Final = 1_000_000
EPOCHS: Final = 64
EPOCH_S: Final = 2.5
"""At least 160 s of training: after two saves each of executions 1 and 2, execution 3 has
well over the 60-90 s its driven 1-minute limit takes (Slurm checks limits every 30 s)."""
TIME_LIMIT_MIN: Final = "60"
"""Every submission's ``--time`` (minutes): slowness can't reach it."""
WAIT_S: Final = 600.0
"""The bound of each wait (generous: a loaded machine starts Python and torch slowly)."""

EXAMPLE_POLICY: Final = RecoveryPolicy(
    rules=(
        RecoveryRule(
            on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), action=Action.RESUBMIT, budget=3
        ),
        RecoveryRule(on=(CauseKind.NON_ZERO_EXIT,), action=Action.HOLD),
        RecoveryRule(on=(CauseKind.TIME_LIMIT,), action=Action.RESUBMIT, budget=2),
    )
)
"""The example's policy (``examples/slurm/digits.toml``)."""

REQUEUE_POLICY: Final = RecoveryPolicy(
    rules=(
        RecoveryRule(
            on=(CauseKind.PREEMPTED,),
            action=Action.REQUEUE,
            budget=3,
            enforcer=Enforcer.BACKEND,
        ),
        RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=3),
        RecoveryRule(on=(CauseKind.NON_ZERO_EXIT,), action=Action.HOLD),
        RecoveryRule(on=(CauseKind.TIME_LIMIT,), action=Action.RESUBMIT, budget=2),
    )
)
"""The REQUEUE run's policy (``examples/slurm/digits-requeue.toml``)."""


def _script(epochs: int, epoch_s: float, result: Path, extra: str = "") -> str:
    """The job's batch script: the user's own ``#SBATCH`` line, then the training."""
    return (
        "#!/bin/sh\n"
        "#SBATCH --exclusive\n"
        "#SBATCH --mem=1G  # torch and scikit-learn take about 230 MB (DefMemPerCPU is 100)\n"
        f"exec {sys.executable} {TRAIN} --epochs {epochs} --epoch-s {epoch_s} "
        f"--result {result} {extra}\n"
    )


def _spec(script: str, checkpoint: Path, options: dict[str, str]) -> JobSpec:
    return JobSpec(
        cluster=CLUSTER,
        script=script,
        checkpoint=str(checkpoint),
        options=options,
        env={"PYTHONPATH": PYTHONPATH, "PYTHONUNBUFFERED": "1"},
    )


async def _reference(epochs: int, result: Path) -> float:
    """The same script run once, without dispatch and without interruption."""
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    env.pop("DISPATCH_CHECKPOINT", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TRAIN),
        "--epochs",
        str(epochs),
        "--result",
        str(result),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    text = await asyncio.to_thread(result.read_text)
    return float(json.loads(text)["final_loss"])


def _publications(root: Path) -> list[Publication]:
    pub = root / "pub"
    return sorted(
        (parse_name(name) for name in os.listdir(pub)) if pub.is_dir() else (),
        key=lambda p: (p.epoch, p.step),
    )


async def _published(root: Path, at_epoch: int, count: int) -> list[Publication]:
    """Wait until ``count`` saves of the execution with ``at_epoch`` are published."""

    def enough() -> list[Publication]:
        own = [p for p in _publications(root) if p.epoch == at_epoch]
        assert len(own) >= count, f"{len(own)} publications of epoch {at_epoch}"
        return own

    return await assert_eventually(enough, timeout_s=WAIT_S, interval_s=0.5)


def _latest(root: Path, at_epoch: int) -> Publication:
    """The latest publication of the execution with ``at_epoch``."""
    return max(
        (p for p in _publications(root) if p.epoch == at_epoch), key=lambda p: (p.epoch, p.step)
    )


def _object_of(job: Job, submission: int) -> ObjectRef:
    for obj in job.objects:
        if obj.submission == submission and not obj.duplicate:
            return obj.ref
    raise AssertionError(f"{job.job_id}: no object of submission {submission}")


async def _running(
    srt: SlurmRuntime, job_id: str, submission: int, *, timeout_s: float = WAIT_S
) -> tuple[ObjectRef, ObservedObject, Status]:
    """Wait until submission N runs; return its object, what Slurm shows of it, the status."""

    def check(status: Status) -> None:
        assert status.state is State.RUNNING, status
        assert status.submission == submission, status

    status = await srt.wait_status(job_id, check, timeout_s=timeout_s)
    ref = _object_of(await srt.job(job_id), submission)
    observed = await srt.observed(job_id, ref)
    assert observed is not None
    return ref, observed, status


def _resumed(output: str) -> list[tuple[str, int, int]]:
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in _RESUMED.finditer(output)]


async def _resumed_from(srt: SlurmRuntime, ref: ObjectRef) -> tuple[str, int, int]:
    """Wait for the one ``resumed`` line of ``ref``'s (only) execution (Python and torch
    take seconds to start on the test machine)."""

    def printed() -> tuple[str, int, int]:
        lines = _resumed(srt.output(ref))
        assert len(lines) == 1, f"{ref}: resumed lines {lines}"
        return lines[0]

    return await assert_eventually(printed, timeout_s=WAIT_S, interval_s=0.5)


def _preempt(node: str) -> str:
    """A ``high`` job that needs the whole node."""
    return sbatch(
        "-p", "high", "-w", node, "--exclusive", "--output=/dev/null", "--wrap", "sleep 5"
    )


def _endings(events: Sequence[object]) -> list[ExecutionEnded]:
    return [e for e in events if isinstance(e, ExecutionEnded)]


@pytest.mark.timeout(3600)
async def test_preempted_node_lost_time_limit_then_completed(
    srt: SlurmRuntime, tmp_path: Path
) -> None:
    epochs, epoch_s = EPOCHS, EPOCH_S
    reference = asyncio.create_task(_reference(epochs, tmp_path / "reference.json"))
    await srt.observer()
    await srt.supervisor()
    job_id = f"digits-walk-{secrets.token_hex(3)}"  # old runs' jobs stay in squeue
    root = tmp_path / "ckpt"
    result = tmp_path / "result.json"
    spec = _spec(
        _script(epochs, epoch_s, result),
        root,
        {"partition": "lowcancel", "time": TIME_LIMIT_MIN},
    )
    await srt.submit(job_id, spec, EXAMPLE_POLICY)
    preemptor = ""
    try:
        # 1. preempted by a high-priority partition (PreemptMode=CANCEL)
        _ref1, seen1, status1 = await _running(srt, job_id, 1)
        assert status1.epoch == epoch(0, 1, 0)
        await _published(root, epoch(0, 1, 0), 2)
        preemptor = _preempt(seen1.nodes[0])

        # 2. resubmitted with a higher epoch, resumed from the latest publication
        ref2, seen2, status2 = await _running(srt, job_id, 2)
        assert status2.epoch == epoch(0, 2, 0)
        await _published(root, epoch(0, 2, 0), 2)
        latest_1 = _latest(root, epoch(0, 1, 0))
        resumed2 = await _resumed_from(srt, ref2)
        assert resumed2 == (latest_1.path, latest_1.epoch, latest_1.step)

        # its node set down under it: node-lost, resubmitted on another node
        lost = seen2.nodes[0]
        with down_node(lost, "dispatch walkthrough"):
            ref3, seen3, status3 = await _running(srt, job_id, 3)
        assert lost not in seen3.nodes
        assert status3.epoch == epoch(0, 3, 0)
        latest_2 = _latest(root, epoch(0, 2, 0))
        resumed3 = await _resumed_from(srt, ref3)
        assert resumed3 == (latest_2.path, latest_2.epoch, latest_2.step)

        # 3. the time limit, driven: Slurm's least (1 minute) once execution 3 has saved
        await _published(root, epoch(0, 3, 0), 1)
        run("scontrol", "update", f"jobid={ref3.id}", "TimeLimit=1")
        ref4, _, status4 = await _running(srt, job_id, 4)
        assert status4.epoch == epoch(0, 4, 0)
        latest_3 = _latest(root, epoch(0, 3, 0))
        resumed4 = await _resumed_from(srt, ref4)
        assert resumed4 == (latest_3.path, latest_3.epoch, latest_3.step)

        # 4. completion
        def succeeded(status: Status) -> None:
            assert status.state is State.SUCCEEDED, status

        status = await srt.wait_status(job_id, succeeded, timeout_s=WAIT_S)
    finally:
        if preemptor:
            run("scancel", preemptor, check=False)

    final = json.loads(result.read_text())["final_loss"]
    assert abs(final - await reference) <= 1e-6, (final, await reference)

    # the record shows every cause, with Slurm's words
    endings = _endings(await srt.events(job_id))
    for ended in endings:  # shown with -s; the README quotes them
        print(f"submission {ended.submission} ended: {ended.cause.kind} {ended.cause.detail!r}")
    kinds = [e.cause.kind for e in endings]
    assert kinds == [
        CauseKind.PREEMPTED,
        CauseKind.NODE_LOST,
        CauseKind.TIME_LIMIT,
        CauseKind.NONE,
    ]
    words = [e.cause.detail for e in endings]
    assert words[0] == "PREEMPTED 0:15", words
    assert re.fullmatch(r"NODE_FAIL 0:(0|15) \(NodeDown\)", words[1]), words
    assert words[2] in ("TIMEOUT 0:15 (TimeLimit)", "TIMEOUT 143:0 (TimeLimit)"), words
    assert words[-1] == "COMPLETED 0:0", words
    recoveries = [t for t in status.history if t.state is State.RECOVERING]
    assert [t.cause.kind for t in recoveries][:3] == kinds[:3]
    assert status.submission == len(endings)
    assert srt.escalations == []


@pytest.mark.timeout(2400)
async def test_requeue_mode_preemption_is_requeued_natively_and_late_saves_never_win(
    srt: SlurmRuntime, tmp_path: Path
) -> None:
    epochs, epoch_s, straggle_s = 14, 2.0, 45
    reference = asyncio.create_task(_reference(epochs, tmp_path / "reference.json"))
    await srt.observer()
    await srt.supervisor()
    job_id = f"digits-requeue-{secrets.token_hex(3)}"
    root = tmp_path / "ckpt"
    result = tmp_path / "result.json"
    spec = _spec(
        _script(epochs, epoch_s, result, f"--straggle-s {straggle_s}"),
        root,
        {"partition": "low", "requeue": "yes", "time": TIME_LIMIT_MIN},
    )
    await srt.submit(job_id, spec, REQUEUE_POLICY)
    preemptor = ""
    try:
        ref, seen, status = await _running(srt, job_id, 1)
        assert status.epoch == epoch(0, 1, 0)
        await _published(root, epoch(0, 1, 0), 2)
        preemptor = _preempt(seen.nodes[0])

        # Slurm requeues it; dispatch records preempted from accounting, R rises
        def rerun(status: Status) -> None:
            assert status.state is State.RUNNING, status
            assert status.epoch == epoch(0, 1, 1), status

        status = await srt.wait_status(job_id, rerun, timeout_s=WAIT_S)
        events = await srt.events(job_id)
        (ending,) = _endings(events)
        assert (ending.ref, ending.restart) == (ref, 0)
        assert ending.cause.kind is CauseKind.PREEMPTED
        assert ending.cause.detail == "PREEMPTED 0:0"  # sacct's row of the earlier run
        recoveries = [e for e in events if isinstance(e, RecoveryCommitted)]
        assert [r.native for r in recoveries] == [True]
        assert status.submission == 1

        # the rerun resumed from the old execution's last regular save ...
        def resumed_line() -> tuple[str, int, int]:
            lines = _resumed(srt.output(ref))
            assert lines, "the rerun has not resumed yet"
            return lines[-1]

        _path, pub_epoch, step = await assert_eventually(resumed_line, timeout_s=WAIT_S)
        assert pub_epoch == epoch(0, 1, 0)
        assert step < STRAGGLER_STEP

        # ... and the old execution's late publication never outranks the rerun's saves
        def straggled() -> Publication:
            late = [p for p in _publications(root) if p.step == STRAGGLER_STEP]
            assert late, "the straggler has not published yet"
            return late[0]

        late = await assert_eventually(straggled, timeout_s=WAIT_S, interval_s=0.5)
        assert late.epoch == epoch(0, 1, 0)
        newest = max(_publications(root), key=lambda p: (p.epoch, p.step))
        assert newest.epoch == epoch(0, 1, 1), newest

        def succeeded(status: Status) -> None:
            assert status.state is State.SUCCEEDED, status

        await srt.wait_status(job_id, succeeded, timeout_s=WAIT_S)
    finally:
        if preemptor:
            run("scancel", preemptor, check=False)

    assert all(r[2] < STRAGGLER_STEP for r in _resumed(srt.output(ref)))
    epochs_seen = re.findall(r"^DISPATCH_EPOCH=(\d+)$", srt.output(ref), re.MULTILINE)
    assert [int(e) for e in epochs_seen] == [epoch(0, 1, 0), epoch(0, 1, 1)]
    attempts = re.findall(r"^DISPATCH_ATTEMPT=(\S+)$", srt.output(ref), re.MULTILINE)
    assert len(set(attempts)) == 2
    final = json.loads(result.read_text())["final_loss"]
    assert abs(final - await reference) <= 1e-6, (final, await reference)

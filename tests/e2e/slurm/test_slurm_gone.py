"""Gone is not ended (issue 15), through the services on the real Slurm test cluster.

A Slurm job ends while dispatch can't see it, for longer than ``MinJobAge`` (30 s on the
test cluster, ``scripts/slurm-cluster.sh``), so slurmctld has forgotten it by the time
dispatch looks again; only accounting (slurmdbd) still knows how it ended:

* the observer is cut off from the scheduler (its Slurm commands point at a copy of
  ``slurm.conf`` whose controller port is closed, so each really fails with Slurm's
  ``Unable to contact slurm controller``): the job completes meanwhile -> ``succeeded``;
* the supervisor is down instead (the observer sees the end, then slurmctld forgets the
  job): -> ``succeeded``;
* the observer is cut off and the job is preempted meanwhile (partition ``lowcancel``,
  PreemptMode=CANCEL): the ending recorded is ``preempted``, with accounting's words.

While dispatch can't see, the job's state doesn't change (DESIGN section 5).
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import pytest

from dispatch_backends.slurm import SlurmBackend
from dispatch_core import (
    Action,
    CauseKind,
    ExecutionEnded,
    JobSpec,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
)
from tests.e2e.slurm.harness import CLUSTER, SlurmRuntime
from tests.integration.slurm.test_slurm_support import SLURM_CONF, run, sbatch
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

FORGET_TIMEOUT_S: Final = 240.0
"""How long slurmctld may take to forget an ended job (MinJobAge 30 s plus its purge pass;
generous for a loaded machine)."""

POLICY: Final = RecoveryPolicy(
    rules=(RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=1),)
)


def _spec(command: str, **options: str) -> JobSpec:
    return JobSpec(cluster=CLUSTER, command=("/bin/sh", "-c", command), options=options)


@contextlib.asynccontextmanager
async def _cut_off(backend: SlurmBackend, tmp: Path) -> AsyncIterator[None]:
    """Every Slurm command of ``backend`` fails to reach slurmctld for the body."""
    bogus = tmp / "unreachable-slurm.conf"
    text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=6999", SLURM_CONF.read_text())
    bogus.write_text(text)
    backend.commands.extra_env["SLURM_CONF"] = str(bogus)
    try:
        yield
    finally:
        backend.commands.extra_env.pop("SLURM_CONF", None)


def _listed(slurm_id: str) -> bool:
    """Whether slurmctld still lists the job (it prints an error once it forgot it)."""
    out = run("squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%i", check=False)
    return slurm_id in out.stdout.split()


def _slurm_state(slurm_id: str) -> str:
    return run("squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%T", check=False).stdout.strip()


async def _forgotten(slurm_id: str) -> None:
    def gone() -> None:
        assert not _listed(slurm_id), f"slurmctld still lists job {slurm_id}"

    await assert_eventually(gone, timeout_s=FORGET_TIMEOUT_S, interval_s=1.0)


async def _running(srt: SlurmRuntime, job_id: str) -> tuple[str, Status]:
    """Wait until the job runs; return its Slurm job id and status."""

    def check(status: Status) -> None:
        assert status.state is State.RUNNING, status

    status = await srt.wait_status(job_id, check)
    job = await srt.job(job_id)
    (obj,) = [o for o in job.objects if o.submission == 1]
    return obj.ref.id, status


async def _state_is(srt: SlurmRuntime, job_id: str, state: State) -> Status:
    def check(status: Status) -> None:
        assert status.state is state, status

    return await srt.wait_status(job_id, check, timeout_s=120)


async def _endings(srt: SlurmRuntime, job_id: str) -> list[ExecutionEnded]:
    return [e for e in await srt.events(job_id) if isinstance(e, ExecutionEnded)]


async def test_a_job_that_completes_while_the_observer_is_cut_off_succeeds(
    srt: SlurmRuntime, tmp_path: Path
) -> None:
    observer_backend = SlurmBackend(CLUSTER, srt.settings)
    await srt.observer(backend=observer_backend)
    await srt.supervisor()
    job_id = f"gone-ok-{secrets.token_hex(3)}"
    await srt.submit(job_id, _spec("sleep 10; exit 0"), POLICY)
    slurm_id, _ = await _running(srt, job_id)
    async with _cut_off(observer_backend, tmp_path):
        await _forgotten(slurm_id)  # it completed, and slurmctld forgot it
        status = await srt.status(job_id)
        assert status is not None
        assert status.state is State.RUNNING, status  # an unreachable scheduler changes nothing
    await _state_is(srt, job_id, State.SUCCEEDED)
    (ended,) = await _endings(srt, job_id)
    assert (ended.cause.kind, ended.cause.exit_code, ended.cause.detail) == (
        CauseKind.NONE,
        0,
        "COMPLETED 0:0",
    )


async def test_a_job_that_completes_while_the_supervisor_is_down_succeeds(
    srt: SlurmRuntime,
) -> None:
    await srt.observer()
    supervisor = await srt.supervisor()
    job_id = f"gone-sup-{secrets.token_hex(3)}"
    await srt.submit(job_id, _spec("sleep 10; exit 0"), POLICY)
    slurm_id, _ = await _running(srt, job_id)
    await supervisor.stop()
    await _forgotten(slurm_id)
    status = await srt.status(job_id)
    assert status is not None
    assert status.state is State.RUNNING, status
    await supervisor.start()
    await _state_is(srt, job_id, State.SUCCEEDED)
    (ended,) = await _endings(srt, job_id)
    assert (ended.cause.kind, ended.cause.detail) == (CauseKind.NONE, "COMPLETED 0:0")


async def test_a_job_preempted_while_the_observer_is_cut_off_gets_its_cause_from_accounting(
    srt: SlurmRuntime, tmp_path: Path
) -> None:
    observer_backend = SlurmBackend(CLUSTER, srt.settings)
    await srt.observer(backend=observer_backend)
    await srt.supervisor()
    job_id = f"gone-pre-{secrets.token_hex(3)}"
    # the resubmission (after the preemption) ends at once; the first run sleeps
    command = '[ "$DISPATCH_SUBMISSION" = 1 ] && exec sleep 600; exit 0'
    await srt.submit(job_id, _spec(command, partition="lowcancel"), POLICY)
    slurm_id, _ = await _running(srt, job_id)
    node = run("squeue", "-h", "-j", slurm_id, "-o", "%N").stdout.strip()
    preemptor = ""
    try:
        async with _cut_off(observer_backend, tmp_path):
            preemptor = sbatch(
                "-p", "high", "-w", node, "--exclusive", "--output=/dev/null", "--wrap", "sleep 5"
            )

            def preempted() -> None:
                assert _slurm_state(slurm_id) in ("PREEMPTED", ""), _slurm_state(slurm_id)

            await assert_eventually(preempted, timeout_s=120, interval_s=1.0)
            await _forgotten(slurm_id)
            status = await srt.status(job_id)
            assert status is not None
            assert status.state is State.RUNNING, status
        await _state_is(srt, job_id, State.SUCCEEDED)
    finally:
        if preemptor:
            run("scancel", preemptor, check=False)
    endings = await _endings(srt, job_id)
    assert [(e.submission, e.cause.kind) for e in endings] == [
        (1, CauseKind.PREEMPTED),
        (2, CauseKind.NONE),
    ]
    assert endings[0].cause.detail == "PREEMPTED 0:0"  # sacct's job row

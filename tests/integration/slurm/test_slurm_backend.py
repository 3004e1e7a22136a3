"""The slurm backend's own behaviour on the real test cluster, beyond the contract: what it
submits, refusals and outages at start, the admin hold, the emergency stop, the cessation
signal, and the calls per poll."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from dispatch_backends import CessationSignal, EmergencyStopper, LaunchRefusedError, Unreachable
from dispatch_backends.config import make_backend, parse_clusters
from dispatch_backends.slurm import AdminHeldError, SlurmBackendWithCessation, SlurmSettings
from dispatch_backends.slurm.parse import parse_scontrol
from dispatch_core.state import CauseKind, JobSpec, ObjectPhase, ObjectRef
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.integration.slurm.test_slurm_support import CLUSTER, SlurmHarness, require_cluster, run
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


@pytest.fixture
async def harness(tmp_path: Path) -> SlurmHarness:
    require_cluster()
    return SlurmHarness(tmp_path)


def _scontrol(ref: ObjectRef) -> dict[str, str]:
    return parse_scontrol(run("scontrol", "-o", "show", "job", ref.id).stdout)


async def test_what_is_submitted(harness: SlurmHarness) -> None:
    """Held, named ``dj-<job>``, dispatch's tag in the comment, the user's ``#SBATCH``
    lines kept, the lost nodes excluded, ``--no-requeue`` by default."""
    job = new_job_id("sub")
    spec = JobSpec(
        cluster=CLUSTER,
        script="#!/bin/bash\n#SBATCH --time=7\n#SBATCH --partition=low\nexec sleep 600\n",
        options={"mem": "150M"},
    )
    launch = make_launch(job, spec, generation=2, submission=3, attempt=1)
    launch = msgspec.structs.replace(launch, exclude_nodes=("node3",))
    ref = await harness.backend.start(launch)
    harness.started.append(ref)
    try:
        fields = _scontrol(ref)
        assert fields["JobName"] == f"dj-{job}"
        assert fields["Comment"] == f"dj:job={job} sub=3 att=1 gen=2"
        assert (fields["JobState"], fields["Reason"]) == ("PENDING", "JobHeldUser")
        assert fields["TimeLimit"] == "00:07:00"
        assert fields["Partition"] == "low"
        assert fields["ExcNodeList"] == "node3"
        assert fields["Requeue"] == "0"
        assert fields["MinMemoryNode"] == "150M"
    finally:
        await harness.cleanup()


async def test_a_refused_submission_keeps_slurms_words(harness: SlurmHarness) -> None:
    spec = harness.spec(Program.SUCCEED, options={"partition": "no-such-partition"})
    with pytest.raises(LaunchRefusedError, match="Invalid partition name specified"):
        await harness.backend.start(make_launch(new_job_id(), spec))


async def test_an_unreachable_controller_at_start_makes_nothing(harness: SlurmHarness) -> None:
    job = new_job_id("unr")
    async with harness.unreachable():
        with pytest.raises(Unreachable, match="Unable to contact slurm controller"):
            await harness.backend.start(make_launch(job, harness.spec(Program.SUCCEED)))
    snapshot = await harness.backend.discover()
    assert job not in snapshot.objects


async def test_an_admin_hold_is_never_released(harness: SlurmHarness) -> None:
    job = new_job_id("adm")
    ref = await harness.start(job, Program.SLEEP)
    try:
        run("scontrol", "hold", ref.id)
        with pytest.raises(AdminHeldError):
            await harness.backend.open_gate(ref)
        assert _scontrol(ref)["Reason"] == "JobHeldAdmin"
    finally:
        await harness.cleanup()


async def test_emergency_stop_ends_running_and_pending_jobs(harness: SlurmHarness) -> None:
    backend = harness.backend
    assert isinstance(backend, EmergencyStopper)
    job = new_job_id("em")
    running = await harness.start(job, Program.SLEEP)
    pending = await harness.start(job, Program.SLEEP, attempt=2)
    await backend.open_gate(running)
    await harness.wait_phase(job, running, ObjectPhase.RUNNING)
    await asyncio.gather(backend.emergency_stop(running), backend.emergency_stop(pending))
    for ref in (running, pending):
        observed = await harness.wait_gone_or_ended(job, ref)
        assert observed is not None
        assert observed.cause is not None
        assert observed.cause.detail.startswith("CANCELLED by 0"), observed.cause


async def test_the_cessation_signal_is_the_sites_command(tmp_path: Path) -> None:
    require_cluster()
    script = tmp_path / "ceased.sh"
    script.write_text('#!/bin/sh\necho "asked about $1 on $2"\n[ "$2" = "node1,node2" ]\n')
    script.chmod(0o755)
    backend = make_backend(
        parse_clusters(
            {
                "clusters": [
                    {
                        "name": "lab",
                        "backend": "slurm",
                        "cessation_command": [str(script), "{job_id}", "{nodes}"],
                    }
                ]
            }
        ).clusters[0]
    )
    assert isinstance(backend, SlurmBackendWithCessation)
    assert isinstance(backend, CessationSignal)
    assert backend.declarations().cessation_signal
    ref = ObjectRef(cluster="lab", id="42")
    ceased = await backend.cessation(ref, ("node1", "node2"))
    assert ceased.ceased
    assert ceased.detail.endswith("exited 0: asked about 42 on node1,node2")
    not_yet = await backend.cessation(ref, ("node3",))
    assert not not_yet.ceased
    without = make_backend(
        parse_clusters({"clusters": [{"name": "lab", "backend": "slurm"}]}).clusters[0]
    )
    assert not isinstance(without, CessationSignal)
    assert not without.declarations().cessation_signal
    slow = SlurmBackendWithCessation(
        "lab", SlurmSettings(cessation_command=("sleep", "5"), cessation_timeout_s=0.2)
    )
    answer = await slow.cessation(ref, ())
    assert not answer.ceased
    assert "did not answer" in answer.detail


async def test_three_commands_per_poll_however_many_jobs(harness: SlurmHarness) -> None:
    backend = harness.backend
    empty = SlurmHarness(harness.tmp, user="nobody").backend
    assert (await empty.discover()).calls == 1  # no job of dispatch's: squeue only
    jobs = [new_job_id("calls") for _ in range(30)]
    try:
        await asyncio.gather(*(harness.start(job, Program.SLEEP) for job in jobs[:3]))
        few = await backend.discover()
        await asyncio.gather(*(harness.start(job, Program.SLEEP) for job in jobs[3:]))
        many = await backend.discover()
        assert all(job in many.objects for job in jobs)
        assert few.calls == many.calls == 3
    finally:
        await harness.cleanup()


async def test_jobs_slurmctld_forgot_are_asked_in_the_same_sacct_call(
    harness: SlurmHarness,
) -> None:
    """Issue 15: jobs last seen alive that squeue no longer lists (``MinJobAge`` passed) are
    looked up in the poll's one sacct call, with the jobs squeue lists: 3 commands however
    many; each is reported ended once with accounting's cause. A backend that never saw
    them (an observer restarted) finds them from the caller's ``expected``, and dispatch's
    tag from sacct's ``SubmitLine``."""
    backend = harness.backend
    jobs = [new_job_id("forgot") for _ in range(4)]
    try:
        refs = await asyncio.gather(*(harness.start(job, Program.SLEEP) for job in jobs))
        await asyncio.gather(*(backend.open_gate(ref) for ref in refs))
        for job, ref in zip(jobs, refs, strict=True):
            await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
        run("scancel", *(ref.id for ref in refs))

        def forgotten() -> None:
            out = run("squeue", "-h", "-t", "all", "-u", "root", "-o", "%i", check=False)
            assert not {ref.id for ref in refs} & set(out.stdout.split()), out.stdout

        await assert_eventually(forgotten, timeout_s=240, interval_s=1.0)
        fresh = SlurmHarness(harness.tmp).backend  # never saw them: only told
        snapshot = await backend.discover()
        told = await fresh.discover(expected=refs)
        for shown in (snapshot, told):
            assert shown.calls == 3
            assert shown.vanished == ()
            for job, ref in zip(jobs, refs, strict=True):
                (obj,) = shown.objects[job]
                assert (obj.ref, obj.phase, obj.submission, obj.attempt) == (
                    ref,
                    ObjectPhase.ENDED,
                    1,
                    1,
                )
                assert obj.cause is not None
                assert obj.cause.kind is CauseKind.CANCELLED
                assert obj.cause.detail == "CANCELLED by 0 0:0", obj.cause
        again = await backend.discover()
        assert not set(jobs) & set(again.objects)  # reported once
        unknown = ObjectRef(cluster=CLUSTER, id="999999")
        first = await fresh.discover(expected=[unknown])
        assert first.vanished == ()  # accounting may lag: within the grace, not yet
    finally:
        await harness.cleanup()

"""Fault injection into the local backend, from another process through its CLI (as the
end-to-end tests and ``dispatch demo`` drive it), and in-process through ``Faults``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dispatch_backends import LaunchRefusedError, LaunchUnknownError, Unreachable, object_name
from dispatch_backends.local import AdminHeldError, FaultError, Faults
from dispatch_core.state import CauseKind, GateState, ObjectPhase, ObservedObject, Provenance
from tests.contract.backend_contract import Program, new_job_id
from tests.integration.backends.local_harness import LocalHarness, cli
from tests.util import assert_eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[LocalHarness]:
    harness = LocalHarness(tmp_path / "data", kill_wait_s=0.5)
    try:
        yield harness
    finally:
        await harness.cleanup()


async def inject(harness: LocalHarness, *args: str, check: bool = True) -> str:
    result = await cli("inject", "--data-dir", harness.data_dir, *args, check=check)
    return result.stdout.strip()


async def test_preempt_a_running_object(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    await inject(harness, "preempt", ref.id)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.PREEMPTED
    assert observed.cause.provenance is Provenance.SCHEDULER
    assert observed.cause.detail == "preempted by fault injection"


async def test_preempt_a_pending_object_ends_it_unrun(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SUCCEED)
    await inject(harness, "preempt", ref.id)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.PREEMPTED
    assert await harness.execution_env(ref) is None


async def test_node_lost_keeps_running_until_dispatch_fences_it(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    before = datetime.now(UTC)
    await inject(harness, "node-lost", ref.id)

    def lost(observed: ObservedObject) -> None:
        assert observed.phase is ObjectPhase.RUNNING, observed
        assert observed.cause is not None, observed
        assert observed.cause.kind is CauseKind.NODE_LOST, observed

    observed = await harness.wait_for(job, ref, lost)
    cause = observed.cause
    assert cause is not None
    assert cause.provenance is Provenance.SCHEDULER
    assert cause.detail == "node local not responding (fault injection)"
    assert cause.at is not None
    assert before - timedelta(seconds=1) <= cause.at <= datetime.now(UTC)
    assert observed.nodes == ("local",)
    # The process keeps running: the scheduler just can't see it.
    assert not (await harness.backend.cessation(ref, observed.nodes)).ceased
    await asyncio.sleep(0.3)
    again = await harness.find(job, ref)
    assert again == observed, "a lost node's object reports the same until it is fenced"

    await harness.backend.stop(ref)  # dispatch's fence
    ended = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert ended.cause == cause, "its end is reported with the node-lost cause"

    async def ceased() -> None:
        assert (await harness.backend.cessation(ref, ended.nodes)).ceased

    await assert_eventually(ceased, timeout_s=harness.settle_timeout_s)


async def test_node_lost_hides_the_end_until_the_node_recovers(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    await inject(harness, "node-lost", ref.id)
    # The process ends (here: preempted) while its node is lost: nobody can see it.
    await inject(harness, "preempt", ref.id)

    async def ceased() -> None:
        assert (await harness.backend.cessation(ref, ())).ceased

    await assert_eventually(ceased, timeout_s=harness.settle_timeout_s)
    hidden = await harness.find(job, ref)
    assert hidden is not None
    assert hidden.phase is ObjectPhase.RUNNING
    assert hidden.cause is not None
    assert hidden.cause.kind is CauseKind.NODE_LOST
    await inject(harness, "recover-node", ref.id)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.PREEMPTED


async def test_node_lost_needs_a_running_object(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    result = await cli("inject", "--data-dir", harness.data_dir, "node-lost", ref.id, check=False)
    assert result.returncode == 1
    assert f"object {ref.id} is not running" in result.stderr


async def test_foreign_object(harness: LocalHarness) -> None:
    job = new_job_id()
    object_id = await inject(harness, "foreign", job)
    snapshot = await harness.discover()
    (observed,) = snapshot.objects[job]
    assert observed.ref.id == object_id
    # its runner starts the harmless process a moment after the object exists
    observed = await harness.wait_phase(job, observed.ref, ObjectPhase.RUNNING)
    assert observed.name == object_name(job)
    assert observed.foreign
    assert (observed.submission, observed.attempt) == (None, None)
    assert observed.phase is ObjectPhase.RUNNING


async def test_admin_hold_and_release(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SUCCEED)
    await inject(harness, "admin-hold", ref.id)
    observed = await harness.wait_phase(job, ref, ObjectPhase.PENDING)
    assert observed.gate is GateState.ADMIN_HELD
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.HELD
    assert observed.cause.provenance is Provenance.SCHEDULER
    assert observed.cause.detail == "held by admin (fault injection)"
    with pytest.raises(AdminHeldError):
        await harness.backend.open_gate(ref)
    await asyncio.sleep(0.2)
    assert (await harness.find(job, ref)) == observed
    assert await harness.execution_env(ref) is None, "an admin-held gate was opened"

    await inject(harness, "admin-release", ref.id)

    def released(observed: ObservedObject) -> None:
        assert observed.gate is GateState.CLOSED, observed
        assert observed.cause is None, observed

    await harness.wait_for(job, ref, released)
    await harness.backend.open_gate(ref)
    finished = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert finished.cause is not None
    assert finished.cause.kind is CauseKind.NONE


async def test_admin_hold_placed_after_dispatch_opened_keeps_it_from_running(
    harness: LocalHarness,
) -> None:
    """A hold that lands between open_gate and the start holds it; the release lets it run."""
    job = new_job_id()
    ref = await harness.start(job, Program.SUCCEED)
    await asyncio.to_thread(harness.backend.faults.admin_hold, ref.id)
    # The gate-open marker written by hand, as if open_gate had raced the hold.
    (harness.backend.object_dir(ref) / "control" / "gate-open").write_text("{}")
    await asyncio.sleep(0.3)
    assert await harness.execution_env(ref) is None
    await asyncio.to_thread(harness.backend.faults.admin_release, ref.id)
    await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert await harness.execution_env(ref) is not None


async def test_refuse_next(harness: LocalHarness) -> None:
    await inject(harness, "refuse-next", "--count", "2", "--detail", "QOSMaxJobsPerUser")
    job = new_job_id()
    for _ in range(2):
        with pytest.raises(LaunchRefusedError) as refused:
            await harness.start(job, Program.SUCCEED)
        assert refused.value.detail == "QOSMaxJobsPerUser"
    assert job not in (await harness.discover()).objects, "a refused launch made an object"
    ref = await harness.start(job, Program.SUCCEED)
    assert [o.ref for o in (await harness.discover()).objects[job]] == [ref]
    assert not (harness.data_dir / "faults.json").exists(), "spent faults must cost nothing"


async def test_unknown_next_makes_the_object_but_says_nothing(harness: LocalHarness) -> None:
    await inject(harness, "unknown-next")
    job = new_job_id()
    with pytest.raises(LaunchUnknownError):
        await harness.start(job, Program.SUCCEED, submission=2, attempt=1)
    (observed,) = (await harness.discover()).objects[job]
    assert (observed.submission, observed.attempt) == (2, 1)
    assert observed.phase is ObjectPhase.PENDING
    assert observed.gate is GateState.CLOSED
    harness.started.append(observed.ref)


async def test_unreachable_next_on_one_call(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    await inject(harness, "unreachable-next", "--call", "open-gate")
    await harness.discover()  # other calls are not affected
    with pytest.raises(Unreachable):
        await harness.backend.open_gate(ref)
    assert (await harness.find(job, ref)) is not None
    assert await harness.execution_env(ref) is None, "an unreachable open_gate did something"
    await harness.backend.open_gate(ref)  # only the next one failed
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)


async def test_unreachable_on_and_off(harness: LocalHarness) -> None:
    await inject(harness, "unreachable", "on")
    job = new_job_id()
    with pytest.raises(Unreachable):
        await harness.start(job, Program.SUCCEED)
    with pytest.raises(Unreachable):
        await harness.discover()
    await inject(harness, "unreachable", "off")
    assert job not in (await harness.discover()).objects, "an unreachable start made an object"


async def test_clear_disarms_every_fault(harness: LocalHarness) -> None:
    await inject(harness, "refuse-next", "--count", "5")
    await inject(harness, "unreachable-next", "--count", "5")
    await inject(harness, "clear")
    assert not (harness.data_dir / "faults.json").exists()
    await harness.start(new_job_id(), Program.SUCCEED)
    await harness.discover()


async def test_cli_errors_and_listing(harness: LocalHarness) -> None:
    for fault in ("preempt", "node-lost", "admin-hold", "recover-node"):
        result = await cli("inject", "--data-dir", harness.data_dir, fault, "77", check=False)
        assert result.returncode == 1, result
        assert "no object '77'" in result.stderr, result
    usage = await cli("inject", "--data-dir", harness.data_dir, "explode", check=False)
    assert usage.returncode == 2

    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP, submission=3, attempt=1)
    listing = await cli("list", "--data-dir", harness.data_dir, "--cluster", "c1")
    (line,) = listing.stdout.splitlines()
    shown = json.loads(line)
    assert shown["job_id"] == job
    assert shown["object"]["ref"] == {"cluster": "c1", "id": ref.id}
    assert shown["object"]["phase"] == "pending"
    assert shown["object"]["submission"] == 3

    killed = await cli("kill-all", "--data-dir", harness.data_dir)
    assert killed.stdout.strip() == "1"
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.CANCELLED


def test_faults_refuse_what_does_not_apply(tmp_path: Path) -> None:
    faults = Faults(tmp_path / "data")
    with pytest.raises(FaultError, match="unknown call 'launch'"):
        faults.unreachable_next(call="launch")
    with pytest.raises(FaultError, match="no object '1'"):
        faults.preempt("1")
    with pytest.raises(FaultError, match=re.escape("no object '../x'")):
        faults.preempt("../x")

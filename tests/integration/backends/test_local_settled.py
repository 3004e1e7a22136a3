"""The local backend reads only live objects: an ended object is read once, then shown from
memory until its ``control/`` directory changes or it is archived (issue 11 item 6; the idle
cost is measured by bench/local_idle.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import pytest

from dispatch_core.state import CauseKind, ObjectPhase, ObjectRef, ObservedObject
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


def count_reads(harness: LocalHarness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the id of every object the backend reads (its store's ``observe``)."""
    store = harness.backend._store
    read: list[str] = []
    observe = store.observe

    def counted(
        cluster: str, object_id: str, path: Path, now: datetime
    ) -> tuple[str, ObservedObject, datetime | None] | None:
        read.append(object_id)
        return observe(cluster, object_id, path, now)

    monkeypatch.setattr(store, "observe", counted)
    return read


async def shown_without_reading(
    harness: LocalHarness, read: list[str], job: str, ref: ObjectRef
) -> ObservedObject:
    """Poll until a discover shows ``ref`` without reading it; return what it shows."""

    async def from_memory() -> ObservedObject:
        read.clear()
        observed = await harness.find(job, ref)
        assert observed is not None, f"{ref} is not shown"
        assert ref.id not in read, f"{ref} was read again: {observed}"
        return observed

    return await assert_eventually(from_memory, timeout_s=harness.settle_timeout_s, interval_s=0.2)


async def test_an_ended_object_is_read_once_then_shown_from_memory(
    harness: LocalHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = count_reads(harness, monkeypatch)
    job = new_job_id()
    ref = await harness.start(job, Program.FAIL)
    live = await harness.start(new_job_id(), Program.SLEEP)
    await harness.backend.open_gate(ref)
    ended = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert ended.cause is not None, ended
    assert ended.cause.kind is CauseKind.NON_ZERO_EXIT, ended
    remembered = await shown_without_reading(harness, read, job, ref)
    assert remembered == ended, "an ended object shown from memory changed"
    assert live.id in read, "a live object must be read at every poll"


async def test_a_marker_made_by_another_process_on_an_ended_object_is_read(
    harness: LocalHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended object on a lost node shows the node loss; the node's recovery, injected
    from another process after the end was remembered, shows its real end."""
    read = count_reads(harness, monkeypatch)
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    await cli("inject", "--data-dir", harness.data_dir, "node-lost", ref.id)
    await harness.backend.stop(ref)  # dispatch's fence

    def cause_is(kind: CauseKind) -> Callable[[ObservedObject], None]:
        def check(observed: ObservedObject) -> None:
            assert observed.phase is ObjectPhase.ENDED, observed
            assert observed.cause is not None, observed
            assert observed.cause.kind is kind, observed

        return check

    await harness.wait_for(job, ref, cause_is(CauseKind.NODE_LOST))
    await shown_without_reading(harness, read, job, ref)
    await cli("inject", "--data-dir", harness.data_dir, "recover-node", ref.id)
    recovered = await harness.wait_for(job, ref, cause_is(CauseKind.CANCELLED))
    assert recovered.cause is not None
    assert "stopped by dispatch" in recovered.cause.detail


async def test_an_ended_object_shown_from_memory_is_still_archived_and_expected_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``retain_ended_s`` a remembered end is archived and no longer listed; the
    observer, expecting it, still gets it ended with its real cause."""
    harness = LocalHarness(tmp_path / "data", retain_ended_s=2.0)
    try:
        read = count_reads(harness, monkeypatch)
        job = new_job_id()
        ref = await harness.start(job, Program.SUCCEED)
        await harness.backend.open_gate(ref)
        ended = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
        await shown_without_reading(harness, read, job, ref)

        async def archived() -> None:
            assert await harness.find(job, ref) is None, f"{ref} still listed"
            assert (tmp_path / "data" / "archive" / ref.id / "status.json").exists()

        await assert_eventually(archived, timeout_s=harness.settle_timeout_s, interval_s=0.2)
        snapshot = await harness.discover(expected=[ref])
        assert snapshot.objects.get(job) == (ended,), snapshot
        assert snapshot.vanished == (), snapshot
    finally:
        await harness.cleanup()

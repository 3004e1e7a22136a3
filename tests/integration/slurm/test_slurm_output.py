"""The slurm backend's output capability (``OutputReader``; ``dispatch logs``) on the real
test cluster: the job's output file (``scontrol``'s ``StdOut``) read from an offset, live
until the job ended; a job slurmctld forgot found by dispatch's ``<output_dir>/%x-%j.out``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_backends import OUTPUT_CHUNK_LIMIT, OutputNotFound, OutputReader, OutputStream
from dispatch_core.state import JobSpec, ObjectRef
from tests.contract.backend_contract import make_launch, new_job_id
from tests.integration.slurm.test_slurm_support import CLUSTER, SlurmHarness, require_cluster
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

OUT = OutputStream.STDOUT


@pytest.fixture
async def harness(tmp_path: Path) -> SlurmHarness:
    require_cluster()
    return SlurmHarness(tmp_path)


async def test_the_job_output_file_is_read_live_until_the_job_ends(
    harness: SlurmHarness, tmp_path: Path
) -> None:
    backend = harness.backend
    assert isinstance(backend, OutputReader)
    flag = tmp_path / "go"
    script = f"echo first; while [ ! -e {flag} ]; do sleep 0.1; done; echo second"
    spec = JobSpec(cluster=CLUSTER, command=("/bin/sh", "-c", script))
    ref = await backend.start(make_launch(new_job_id("out"), spec))
    harness.started.append(ref)
    try:
        pending = await backend.read_output(ref, OUT, 0, OUTPUT_CHUNK_LIMIT)
        assert pending.live  # held: nothing written yet
        assert pending.where.endswith(f"-{ref.id}.out")
        await backend.open_gate(ref)

        async def printed() -> None:
            chunk = await backend.read_output(ref, OUT, 0, OUTPUT_CHUNK_LIMIT)
            assert chunk.data == b"first\n"
            assert chunk.live

        await assert_eventually(printed, timeout_s=harness.settle_timeout_s)
        assert (await backend.read_output(ref, OUT, 1, 3)).data == b"irs"
        # one file for both streams (dispatch gives no --error)
        assert (await backend.read_output(ref, OutputStream.STDERR, 0, 100)).data == b"first\n"
        flag.touch()

        async def ended() -> None:
            chunk = await backend.read_output(ref, OUT, 6, OUTPUT_CHUNK_LIMIT)
            assert chunk.data == b"second\n"
            assert chunk.complete

        await assert_eventually(ended, timeout_s=harness.settle_timeout_s)
    finally:
        await harness.cleanup()


async def test_a_forgotten_job_is_found_by_the_output_convention(harness: SlurmHarness) -> None:
    backend = harness.backend
    forgotten = ObjectRef(cluster=CLUSTER, id="987654321")  # slurmctld knows no such job
    with pytest.raises(OutputNotFound, match="no longer knows"):
        await backend.read_output(forgotten, OUT, 0, 10)
    kept = harness.out / f"dj-gone-abc-{forgotten.id}.out"
    kept.write_bytes(b"was here\n")
    chunk = await backend.read_output(forgotten, OUT, 0, OUTPUT_CHUNK_LIMIT)
    assert chunk.data == b"was here\n"
    assert chunk.complete
    with pytest.raises(OutputNotFound):
        await backend.read_output(ObjectRef(cluster="other", id="1"), OUT, 0, 10)

"""The backend contract suite on the real Slurm test cluster (slurmctld, slurmd, slurmdbd)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.backend_contract import BackendContract, BackendHarness
from tests.integration.slurm.test_slurm_support import SlurmHarness, require_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


class TestSlurmContract(BackendContract):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[BackendHarness]:
        require_cluster()
        harness = SlurmHarness(tmp_path)
        try:
            yield harness
        finally:
            await harness.cleanup()

"""The backend contract suite, run on the local backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.backend_contract import BackendContract, BackendHarness
from tests.integration.backends.local_harness import LocalHarness

pytestmark = pytest.mark.integration


class TestLocalContract(BackendContract):
    @pytest.fixture(params=[120.0, 0.0], ids=["zygote", "direct"])
    async def harness(
        self, tmp_path: Path, request: pytest.FixtureRequest
    ) -> AsyncIterator[BackendHarness]:
        """Runners forked by the data directory's zygote, and each started directly."""
        harness = LocalHarness(tmp_path / "data", zygote_idle_s=request.param)
        try:
            yield harness
        finally:
            await harness.cleanup()

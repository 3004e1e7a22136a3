"""The backend contract suite, run on the local backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.backend_contract import BackendContract, BackendHarness
from tests.integration.backends.local_harness import LocalHarness

pytestmark = pytest.mark.integration


class TestLocalContract(BackendContract):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[BackendHarness]:
        harness = LocalHarness(tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.cleanup()

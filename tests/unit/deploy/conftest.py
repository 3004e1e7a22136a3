"""The tools that check deploy/ (``systemd-analyze``, ``promtool``), from Debian packages that
``scripts/install-deploy-tools.sh`` installs (scripts/test.sh runs it). Missing, a test using
one is skipped, or fails under ``DISPATCH_REQUIRE_SERVICES=1`` (CI)."""

from __future__ import annotations

import os
import shutil

import pytest


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: scripts/install-deploy-tools.sh installs it"
        if os.environ.get("DISPATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def systemd_analyze() -> str:
    """The path of ``systemd-analyze`` (Debian's ``systemd`` package)."""
    return _tool("systemd-analyze")


@pytest.fixture
def promtool() -> str:
    """The path of ``promtool`` (Debian's ``prometheus`` package)."""
    return _tool("promtool")

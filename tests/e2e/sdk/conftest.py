"""A real ``dispatch up`` shared by the SDK tests of a module (each test submits its own
jobs), as the CLI's end-to-end tests have (``tests/e2e/cli/support.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cli.support import Up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """A ``dispatch up`` on a data directory of its own and a free API port."""
    instance = Up(tmp_path_factory.mktemp("sdk") / "data")
    instance.start()
    try:
        yield instance
    finally:
        instance.close()

"""Fixtures of the CLI's end-to-end tests: a real ``dispatch up`` shared by a module's tests
(each test submits its own jobs), and job files."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli.support import Up

JobFile = Callable[..., Path]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """A ``dispatch up`` on a data directory of its own and a free API port."""
    instance = Up(tmp_path_factory.mktemp("cli") / "data")
    instance.start()
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def job_file(tmp_path: Path) -> JobFile:
    """Write a JSON job file running ``script`` with ``/bin/sh`` on the local cluster (the
    variable ``FLAG`` names a file the test can create); return its path."""
    made = 0

    def make(script: str, *, rules: list[dict[str, Any]] | None = None, **top: Any) -> Path:
        nonlocal made
        made += 1
        body: dict[str, Any] = {
            "spec": {
                "cluster": "local",
                "command": ["/bin/sh", "-c", script],
                "env": {"FLAG": str(tmp_path / f"flag{made}")},
            },
            **top,
        }
        if rules is not None:
            body["policy"] = {"rules": rules}
        path = tmp_path / f"job{made}.json"
        path.write_text(json.dumps(body))
        return path

    return make

"""Pytest fixtures of the real-apiserver lane (``tests/servers/kube.py``).

Import them into a ``conftest.py``::

    from tests.servers.pytest_kube_real import kube_lab, kube_ns  # noqa: F401

* ``kube_lab``: one :class:`~tests.servers.kube.KubeApiServer` for the whole session (etcd +
  kube-apiserver 1.20.2 + the lane's CRDs); its start-up time is printed on the terminal.
  Without the binaries (``scripts/kube-apiserver.sh install``) the tests are skipped, or fail
  under ``DISPATCH_REQUIRE_SERVICES=1`` (CI).
* ``kube_ns``: a new namespace for one test (the server is shared, so tests keep apart by
  namespace; nothing deletes it: no namespace controller runs, and the session's etcd goes).
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator

import pytest

from tests.servers.kube import KubeApiServer, KubeLabMissing

__all__ = ["kube_lab", "kube_ns"]


@pytest.fixture(scope="session")
def kube_lab(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[KubeApiServer]:
    """The session's real kube-apiserver (see the module docstring)."""
    try:
        server = KubeApiServer(tmp_path_factory.mktemp("kube-lab"))
    except KubeLabMissing as err:
        if os.environ.get("DISPATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(str(err))
        pytest.skip(str(err))
    server.start()
    _say(pytestconfig, server.timings.words())
    try:
        yield server
    finally:
        server.stop()
        if server.timings.restarts:
            _say(pytestconfig, server.timings.words())


def _say(config: pytest.Config, words: str) -> None:
    """Write a line on the terminal, past pytest's output capture."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(words, file=sys.stderr)
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(words)


@pytest.fixture
def kube_ns(kube_lab: KubeApiServer) -> str:
    """A fresh namespace of the session's server for this test."""
    name = f"t-{secrets.token_hex(4)}"
    kube_lab.ensure_namespace(name)
    return name

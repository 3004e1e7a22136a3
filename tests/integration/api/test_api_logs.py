"""``GET /v1/jobs/{job}/logs`` in-process on a real nats-server, with the observer's
``OutputServer`` over a real local backend: not launched yet (404), no observer (503), the
output with its headers, a bounded read, ``follow`` until the object ends, and a follow cut
short when the observer stops answering midway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client as NATS

from dispatch_backends.local import LocalBackend, kill_all
from dispatch_core import (
    GateOpened,
    LaunchIntended,
    LaunchRecorded,
    SubmissionOpened,
    SubmissionWhy,
)
from dispatch_core.state import JobSpec, ObjectRef
from services.observer.output import OutputServer
from tests.contract.backend_contract import make_launch
from tests.integration.api.support import HUMAN_TOKEN, Api, now
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {HUMAN_TOKEN}"}


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend("local", tmp_path / "local", kill_wait_s=0.5, zygote_idle_s=0)
    try:
        yield backend
    finally:
        await asyncio.to_thread(kill_all, backend.data_dir)


async def _launched(api: Api, local: LocalBackend, script: str) -> tuple[str, ObjectRef]:
    job = (await api.submit())["job_id"]
    spec = JobSpec(cluster="local", command=("/bin/sh", "-c", script))
    ref = await local.start(make_launch(job, spec))
    await local.open_gate(ref)
    t = now()
    await api.append(
        job,
        SubmissionOpened(job_id=job, at=t, submission=1, why=SubmissionWhy.INITIAL),
        LaunchIntended(job_id=job, at=t, submission=1, attempt=1),
        LaunchRecorded(job_id=job, at=t, submission=1, attempt=1, ref=ref),
        GateOpened(job_id=job, at=t, ref=ref),
    )
    return job, ref


async def test_logs_are_streamed_from_the_cluster_s_observer(
    api: Api, nc: NATS, local: LocalBackend, tmp_path: Path
) -> None:
    waiting = await api.submit()
    none = await api.call("GET", f"/v1/jobs/{waiting['job_id']}/logs")
    assert none.status == 404, none.text
    assert "has no execution yet" in none.text
    flag = tmp_path / "go"
    job, ref = await _launched(
        api, local, f"echo one; while [ ! -e {flag} ]; do sleep 0.05; done; echo two"
    )
    down = await api.call("GET", f"/v1/jobs/{job}/logs")
    assert down.status == 503, down.text
    assert "no observer of cluster 'local'" in down.text
    server = OutputServer(local, nc, layout=api.layout)
    await server.start()
    try:

        async def printed() -> None:
            shown = await api.call("GET", f"/v1/jobs/{job}/logs")
            assert shown.status == 200, shown.text
            assert shown.text == "one\n"

        await assert_eventually(printed, timeout_s=30)
        shown = await api.call("GET", f"/v1/jobs/{job}/logs?offset=1&limit=2")
        assert shown.text == "ne"
        assert shown.headers["Dispatch-Object"] == str(ref)
        assert shown.headers["Dispatch-Execution"] == "1"
        assert shown.headers["Dispatch-Output-Location"].endswith("/stdout")
        assert shown.headers["Dispatch-Output-Live"] == "true"
        bad = await api.call("GET", f"/v1/jobs/{job}/logs?stream=both")
        assert (bad.status, bad.body["error"]["field"]) == (400, "stream")
        other = await api.call("GET", f"/v1/jobs/{job}/logs?execution=2")
        assert other.status == 404
        async with api.session.get(
            f"{api.url}/v1/jobs/{job}/logs?follow=true", headers=AUTH
        ) as followed:
            assert followed.status == 200
            first = await followed.content.readline()
            assert first == b"one\n"
            flag.touch()  # the job prints the rest and ends; the answer ends with it
            assert await asyncio.wait_for(followed.content.read(), 60) == b"two\n"
    finally:
        await server.aclose()


async def test_a_follow_is_cut_short_when_the_observer_stops_answering(
    api: Api, nc: NATS, local: LocalBackend
) -> None:
    job, _ = await _launched(api, local, "echo one; sleep 600")
    server = OutputServer(local, nc, layout=api.layout)
    await server.start()
    async with api.session.get(f"{api.url}/v1/jobs/{job}/logs?follow=true", headers=AUTH) as r:
        assert r.status == 200
        assert await asyncio.wait_for(r.content.readline(), 60) == b"one\n"
        await server.aclose()  # the observer goes away midway
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(r.content.read(), 60)

"""``POST /v1/jobs`` checks ``spec.options`` with the cluster's backend
(:func:`dispatch_backends.check_options`): a value a launch would refuse, or an option the
local backend doesn't read, is a 400 naming ``spec.options.<key>``, and nothing is recorded."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from dispatch_core import JobCreated, JobSpec, RecoveryPolicy, Submit, decide
from dispatch_nats import StreamKind
from tests.integration.api.support import ALICE, CLUSTERS, SPEC, Api, now

pytestmark = pytest.mark.integration


async def _recorded(nc: NATS, api: Api) -> int:
    """How many events the test's record stream holds, of every job."""
    info = await nc.jetstream().stream_info(api.layout.stream(StreamKind.RECORD))
    return int(info.state.messages)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"time": "banana"}, "spec.options.time", "invalid time limit 'banana'"),
        ({"chdir": "/tmp", "time": "1:2:3:4"}, "spec.options.time", "D-H:M:S"),
        (
            {"partitionn": "gpu"},
            "spec.options.partitionn",
            "has no option 'partitionn' (its options: chdir, time)",
        ),
    ],
)
async def test_an_option_the_backend_would_refuse_is_a_400_and_nothing_is_recorded(
    api: Api, nc: NATS, options: dict[str, str], field: str, words: str
) -> None:
    before = await _recorded(nc, api)
    body = {"spec": {**SPEC, "options": options}, "job_id": "bad-options"}
    reply = await api.call("POST", "/v1/jobs", body=body)
    assert reply.status == 400, reply.text
    assert reply.error["code"] == "invalid"
    assert reply.error["field"] == field
    assert words in reply.error["message"]
    assert await api.events("bad-options") == []
    assert await _recorded(nc, api) == before
    assert (await api.call("GET", "/v1/jobs/bad-options")).status == 404


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"time": "30:00"},
        {"time": "1-12", "chdir": "/work"},
        {"time": "UNLIMITED"},
        {"time": "0"},
    ],
)
async def test_options_the_local_backend_reads_are_accepted(
    api: Api, options: dict[str, str]
) -> None:
    body: dict[str, Any] = await api.submit(spec={**SPEC, "options": options})
    (created,) = await api.events(body["job_id"])
    assert isinstance(created, JobCreated)
    assert created.spec.options == options


async def test_a_cluster_without_a_config_has_its_options_unchecked(api: Api) -> None:
    """``other`` is only declarations here (no clusters-file entry): nothing to check with."""
    await api.submit(spec={**SPEC, "cluster": "other", "options": {"anything": "goes"}})


async def test_superseding_a_job_whose_recorded_options_are_now_refused_is_409(api: Api) -> None:
    """A job recorded before options were checked at submission (written here straight to
    its record) can't be superseded: the new job would keep the spec and fail at launch."""
    job_id = "old-bad-time"
    events = decide(
        None,
        Submit(
            by=ALICE,
            job_id=job_id,
            spec=msgspec.convert({**SPEC, "options": {"time": "banana"}}, JobSpec),
            policy=RecoveryPolicy(),
            declarations=CLUSTERS["local"],
        ),
        now(),
    )
    await api.append(job_id, *events)
    assert (await api.command(job_id, "cancel")).status == 200
    before = len(await api.events(job_id))

    reply = await api.command(job_id, "supersede", reason="run it again")

    assert reply.status == 409, reply.text
    assert "spec.options.time is invalid: invalid time limit 'banana'" in reply.error["message"]
    assert "submit a new job" in reply.error["message"]
    assert len(await api.events(job_id)) == before

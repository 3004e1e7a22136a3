"""``GET /v1/jobs`` from the jobs index (services/api/jobindex.py): filters by state and
cluster, pages (offset/limit and the ``after`` cursor) with the total, the facts of each
row, and the index following the Status and record feeds rather than reading per request."""

from __future__ import annotations

from typing import Any

import pytest
from msgspec.structs import replace
from nats.aio.client import Client as NATS

from dispatch_core import Cause, CauseKind, JobCreated, Level, Provenance, State, Status
from tests.integration.api.support import SPEC, Api, now
from tests.integration.api.test_api_poison import _poison

pytestmark = pytest.mark.integration

NONE = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)


def status(job_id: str, state: State, seq: int) -> Status:
    """A Status as the supervisor would publish it."""
    return Status(job_id=job_id, level=Level.FULL, state=state, cause=NONE, at=now(), seq=seq)


async def _jobs(api: Api, query: str = "") -> dict[str, Any]:
    reply = await api.call("GET", f"/v1/jobs{query}")
    assert reply.status == 200, reply.text
    assert isinstance(reply.body, dict)
    return reply.body


def _ids(body: dict[str, Any]) -> list[str]:
    jobs = body["jobs"]
    assert isinstance(jobs, list)
    return [j["job_id"] for j in jobs]


async def test_filters_pages_and_the_total(api: Api) -> None:
    ids = []
    for i in range(6):
        cluster = "other" if i % 3 == 0 else "local"
        body = {"spec": {**SPEC, "cluster": cluster}, "job_id": f"job-{i}"}
        reply = await api.call("POST", "/v1/jobs", body=body)
        assert reply.status == 201, reply.text
        ids.append(reply.body["job_id"])
    for job_id in ids[:2]:
        await api.publish(status(job_id, State.RUNNING, await api.records.last_seq(job_id)))

    everything = await _jobs(api)
    assert _ids(everything) == ids
    assert (everything["total"], everything["offset"], everything["limit"]) == (6, 0, None)
    assert everything["next_after"] is None

    first = await _jobs(api, "?limit=4")
    assert _ids(first) == ids[:4]
    assert (first["total"], first["next_after"]) == (6, ids[3])
    second = await _jobs(api, "?limit=4&offset=4")
    assert _ids(second) == ids[4:]
    assert (second["total"], second["next_after"]) == (6, None)
    past = await _jobs(api, f"?limit=4&after={ids[3]}")
    assert _ids(past) == ids[4:]
    assert past["total"] == 2  # the jobs past the cursor

    running = await _jobs(api, "?state=running")
    assert (_ids(running), running["total"]) == (ids[:2], 2)
    pending = await _jobs(api, "?state=pending&state=failed&limit=1")
    assert (_ids(pending), pending["total"], pending["next_after"]) == ([ids[2]], 4, ids[2])

    other = await _jobs(api, "?cluster=other")
    assert _ids(other) == [ids[0], ids[3]]
    assert _ids(await _jobs(api, "?cluster=other&cluster=local")) == ids
    both = await _jobs(api, "?cluster=local&state=running,pending&limit=2&offset=1")
    assert (_ids(both), both["total"]) == ([ids[2], ids[4]], 4)


async def test_each_row_has_its_cluster_creation_and_checkpoint_root(api: Api) -> None:
    before = now()
    body = {"spec": {**SPEC, "cluster": "other", "checkpoint": "/ckpt/{job}"}}
    job_id = (await api.call("POST", "/v1/jobs", body=body)).body["job_id"]
    [row] = (await _jobs(api))["jobs"]
    assert row["job_id"] == job_id
    assert row["cluster"] == "other"
    assert row["checkpoint"] == f"/ckpt/{job_id}"  # expanded at submission
    assert row["created_at"] >= before.isoformat()[:19]


@pytest.mark.parametrize("query", ["?cluster=mars", "?cluster=other,mars&cluster=local"])
async def test_an_unknown_cluster_is_refused_naming_the_known_ones(api: Api, query: str) -> None:
    """A typo in a cluster filter is said, not answered with an empty list as if the
    cluster had no jobs; the error shape and code are a submission's to that cluster."""
    await api.submit()
    reply = await api.call("GET", f"/v1/jobs{query}")
    assert reply.status == 400, reply.text
    assert reply.error == {
        "code": "unknown-cluster",
        "message": "unknown cluster 'mars' (known: local, other)",
        "field": "cluster",
    }
    submitted = await api.call("POST", "/v1/jobs", body={"spec": {**SPEC, "cluster": "mars"}})
    assert (submitted.status, submitted.error["code"]) == (400, "unknown-cluster")


async def test_a_cluster_no_longer_configured_is_known_while_jobs_of_it_remain(api: Api) -> None:
    """A cluster dropped from the configuration still lists its jobs (their records name
    it), and is named among the known ones."""
    kept = (await api.submit(job_id="kept"))["job_id"]
    created = (await api.events(kept))[0]
    assert isinstance(created, JobCreated)
    gone = replace(created, job_id="from-gone", spec=replace(created.spec, cluster="gone"))
    await api.append("from-gone", gone)
    assert _ids(await _jobs(api, "?cluster=gone")) == ["from-gone"]
    assert _ids(await _jobs(api, "?cluster=gone,local")) == ["from-gone", kept]
    refused = await api.call("GET", "/v1/jobs?cluster=mars,venus")
    assert refused.status == 400, refused.text
    known = "(known: gone, local, other)"
    assert refused.error["message"] == f"unknown clusters 'mars', 'venus' {known}"


async def test_a_job_that_failed_over_lists_under_its_home_and_its_current_cluster(
    api: Api,
) -> None:
    """After a failover (issue 14 part 2) the job runs on another cluster: ``?cluster=`` of
    either finds it, and a third cluster does not."""
    moved = (await api.submit(job_id="moved"))["job_id"]
    stayed = (await api.submit(job_id="stayed"))["job_id"]
    seq = await api.records.last_seq(moved)
    running = status(moved, State.RUNNING, seq)
    await api.publish(replace(running, submission=2, cluster="other"))
    await api.publish(status(stayed, State.RUNNING, await api.records.last_seq(stayed)))
    rows = {j["job_id"]: j for j in (await _jobs(api, ""))["jobs"]}
    assert (rows[moved]["cluster"], rows[moved]["current_cluster"]) == ("local", "other")
    assert _ids(await _jobs(api, "?cluster=other")) == [moved]
    assert _ids(await _jobs(api, "?cluster=local")) == [moved, stayed]


@pytest.mark.parametrize(
    "query",
    ["?limit=0", "?limit=x", "?offset=-1", "?after=Not_An_Id", "?state=sleeping"],
)
async def test_a_bad_paging_or_filter_parameter_is_400(api: Api, query: str) -> None:
    reply = await api.call("GET", f"/v1/jobs{query}")
    assert reply.status == 400, reply.text
    assert reply.error["field"] == query[1:].split("=")[0]


async def test_the_listing_follows_the_status_feed_without_reading_again(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    seq = await api.records.last_seq(job_id)
    assert _ids(await _jobs(api, "?state=pending")) == [job_id]
    assert api.ops.index.builds == 1

    await api.publish(status(job_id, State.RUNNING, seq))
    assert _ids(await _jobs(api, "?state=running")) == [job_id]
    await api.publish(status(job_id, State.FAILED, seq))
    assert _ids(await _jobs(api, "?state=failed")) == [job_id]
    assert _ids(await _jobs(api, "?state=running")) == []

    # A job submitted after the index was built is listed at once (the record feed), and
    # so is a command on it while no Status is published for it (projected again).
    later = (await api.submit(job_id="later"))["job_id"]
    assert _ids(await _jobs(api, "?state=pending")) == [later]
    assert (await api.command(later, "hold")).status == 200
    assert _ids(await _jobs(api, "?state=held")) == [later]
    assert _ids(await _jobs(api, "?state=pending")) == []
    assert api.ops.index.builds == 1  # followed, never built again


async def test_a_record_that_stops_reading_after_the_index_was_built_is_named(
    api: Api, nc: NATS
) -> None:
    """The record feed marks the job; the next listing folds it, names the event apart and
    marks the job's (now stale) Status ``unreadable``, and the other job is listed as ever."""
    bad = (await api.submit(job_id="bad"))["job_id"]
    good = (await api.submit(job_id="good"))["job_id"]
    for job_id in (bad, good):
        await api.publish(status(job_id, State.RUNNING, await api.records.last_seq(job_id)))
    assert _ids(await _jobs(api, "?state=running")) == [bad, good]

    seq = await _poison(api, nc, bad, "undecodable")
    listing = await _jobs(api, "?state=running")
    assert {j["job_id"]: j["unreadable"] for j in listing["jobs"]} == {bad: True, good: False}
    assert [(u["job_id"], u["seq"]) for u in listing["unreadable"]] == [(bad, seq)]
    assert api.ops.index.builds == 1

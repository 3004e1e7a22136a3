"""Reads: a job's Status (published, or projected by the API), its record, the listing, and
escalations across jobs."""

from __future__ import annotations

import msgspec
import pytest

from dispatch_core import (
    Cause,
    CauseKind,
    Discovery,
    EscalationCommitted,
    EscalationDelivered,
    GateState,
    Level,
    ObjectPhase,
    ObservedObject,
    Provenance,
    State,
    Status,
    encode,
)
from tests.integration.api.support import Api, launched, now, ref

pytestmark = pytest.mark.integration

NONE = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)


def status(job_id: str, state: State, seq: int) -> Status:
    """A Status as the supervisor would publish it."""
    return Status(job_id=job_id, level=Level.FULL, state=state, cause=NONE, at=now(), seq=seq)


async def test_status_is_projected_by_the_api_until_the_supervisor_publishes(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    reply = await api.call("GET", f"/v1/jobs/{job_id}")
    assert reply.status == 200
    assert reply.headers["Dispatch-Status-Source"] == "api"
    assert reply.body["state"] == "pending"
    assert reply.body["seq"] == 1

    published = status(job_id, State.PENDING, seq=1)
    await api.publish(published)
    reply = await api.call("GET", f"/v1/jobs/{job_id}")
    assert reply.headers["Dispatch-Status-Source"] == "supervisor"
    assert msgspec.convert(reply.body, Status) == published


async def test_status_read_after_a_command_shows_the_command(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    await api.publish(status(job_id, State.PENDING, seq=1))
    assert (await api.command(job_id, "hold")).status == 200
    reply = await api.call("GET", f"/v1/jobs/{job_id}")
    assert reply.headers["Dispatch-Status-Source"] == "api"  # the record is ahead
    assert reply.body["state"] == "held"
    assert reply.body["hold"]["by"]["name"] == "alice"


async def test_the_api_projects_with_the_latest_discovery(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    await api.append(job_id, *launched(job_id))
    running = ObservedObject(
        ref=ref(job_id),
        name=f"dj-{job_id}",
        submission=1,
        attempt=1,
        phase=ObjectPhase.RUNNING,
        gate=GateState.OPEN,
    )
    discovery = Discovery(cluster="local", job_id=job_id, seen_at=now(), objects=(running,))
    await api.discoveries.put(("local", job_id), encode(discovery))
    reply = await api.call("GET", f"/v1/jobs/{job_id}")
    assert reply.body["state"] == "running"
    assert reply.body["objects"] == [{"cluster": "local", "id": f"{job_id}-1"}]


@pytest.mark.parametrize("job_id", ["no-such-job", "Bad.Id", "-x", "a" * 64])
async def test_an_unknown_job_is_404(api: Api, job_id: str) -> None:
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/record"):
        reply = await api.call("GET", path)
        assert reply.status == 404, (path, reply.text)
        assert reply.error["code"] == "not-found"


async def test_the_record_with_seqs_and_after(api: Api) -> None:
    job_id = (await api.submit())["job_id"]
    await api.append(job_id, *launched(job_id))
    reply = await api.call("GET", f"/v1/jobs/{job_id}/record")
    assert reply.status == 200
    assert reply.body["job_id"] == job_id
    types = [e["event"]["type"] for e in reply.body["events"]]
    assert types == [
        "job.created",
        "submission.opened",
        "launch.intended",
        "launch.recorded",
        "gate.opened",
    ]
    seqs = [e["seq"] for e in reply.body["events"]]
    assert seqs == sorted(seqs)
    assert reply.body["events"][0]["event"]["by"] == {"name": "alice", "kind": "human"}

    rest = await api.call("GET", f"/v1/jobs/{job_id}/record?after={seqs[1]}")
    assert [e["seq"] for e in rest.body["events"]] == seqs[2:]
    none = await api.call("GET", f"/v1/jobs/{job_id}/record?after={seqs[-1]}")
    assert none.status == 200
    assert none.body["events"] == []


@pytest.mark.parametrize("after", ["-1", "x", "1.5", str(2**53 + 1)])
async def test_a_bad_after_is_400(api: Api, after: str) -> None:
    job_id = (await api.submit())["job_id"]
    reply = await api.call("GET", f"/v1/jobs/{job_id}/record?after={after}")
    assert reply.status == 400
    assert reply.error["field"] == "after"


async def test_the_listing_uses_published_statuses_and_projects_the_rest(api: Api) -> None:
    a = (await api.submit(name="a"))["job_id"]
    b = (await api.submit(name="b"))["job_id"]
    c = (await api.submit(name="c"))["job_id"]
    await api.publish(status(a, State.RUNNING, seq=1))
    await api.publish(status(b, State.FAILED, seq=1))

    reply = await api.call("GET", "/v1/jobs")
    assert reply.status == 200
    assert [(j["job_id"], j["state"]) for j in reply.body["jobs"]] == [
        (a, "running"),
        (b, "failed"),
        (c, "pending"),  # no Status published yet: projected from its record
    ]
    assert set(reply.body["jobs"][0]) == {
        "job_id",
        "state",
        "cause",
        "at",
        "seq",
        "settled",
        "hold",
        "submission",
        "supersedes",
        "superseded_by",
        "unreadable",  # the record no longer reads past this Status (test_api_poison)
        "cluster",  # from the record's job.created (test_api_listing)
        "created_at",
        "checkpoint",
        "published_step",  # as the cluster's observer last read pub/ (issue 14)
        "published_at",
        "current_cluster",  # the current submission's (a failover moves it; issue 14)
    }
    assert not any(j["unreadable"] for j in reply.body["jobs"])

    running = await api.call("GET", "/v1/jobs?state=running")
    assert [j["job_id"] for j in running.body["jobs"]] == [a]
    two = await api.call("GET", "/v1/jobs?state=running,pending")
    assert [j["job_id"] for j in two.body["jobs"]] == [a, c]
    repeated = await api.call("GET", "/v1/jobs?state=failed&state=pending")
    assert [j["job_id"] for j in repeated.body["jobs"]] == [b, c]


async def test_an_empty_listing(api: Api) -> None:
    reply = await api.call("GET", "/v1/jobs")
    assert reply.status == 200
    assert reply.body == {
        "jobs": [],
        "unreadable": [],
        "total": 0,
        "offset": 0,
        "limit": None,
        "next_after": None,
    }


async def test_an_unknown_state_is_400(api: Api) -> None:
    reply = await api.call("GET", "/v1/jobs?state=running,sleeping")
    assert reply.status == 400
    assert reply.error["field"] == "state"
    assert "sleeping" in reply.error["message"]


async def test_escalations_across_jobs_delivered_or_not(api: Api) -> None:
    a = (await api.submit(name="a"))["job_id"]
    b = (await api.submit(name="b"))["job_id"]
    await api.append(a, EscalationCommitted(job_id=a, at=now(), id="foreign:x", detail="fx"))
    await api.append(b, EscalationCommitted(job_id=b, at=now(), id="all-unknown:1", detail="au"))
    await api.append(a, EscalationDelivered(job_id=a, at=now(), id="foreign:x", channel="hook"))

    every = await api.call("GET", "/v1/escalations")
    assert every.status == 200
    assert [(e["job_id"], e["id"]) for e in every.body["escalations"]] == [
        (a, "foreign:x"),
        (b, "all-unknown:1"),
    ]
    assert every.body["escalations"][0]["delivered"] is not None
    assert every.body["escalations"][1]["delivered"] is None
    assert every.body["escalations"][1]["detail"] == "au"

    undelivered = await api.call("GET", "/v1/escalations?delivered=false")
    assert [e["id"] for e in undelivered.body["escalations"]] == ["all-unknown:1"]
    delivered = await api.call("GET", "/v1/escalations?delivered=true")
    assert [e["id"] for e in delivered.body["escalations"]] == ["foreign:x"]
    one = await api.call("GET", f"/v1/escalations?job={b}")
    assert [e["job_id"] for e in one.body["escalations"]] == [b]
    unknown = await api.call("GET", "/v1/escalations?job=no-such-job")
    assert unknown.body == {"escalations": [], "unreadable": []}


@pytest.mark.parametrize(
    ("query", "field"), [("delivered=yes", "delivered"), ("job=Bad.Id", "job")]
)
async def test_bad_escalation_queries_are_400(api: Api, query: str, field: str) -> None:
    reply = await api.call("GET", f"/v1/escalations?{query}")
    assert reply.status == 400
    assert reply.error["field"] == field

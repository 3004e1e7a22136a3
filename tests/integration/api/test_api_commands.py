"""``POST /v1/jobs/{job}/{command}``: every operator command of seed 002, each refusal (409
with the core's reason), 400/403/404, the actor recorded, idempotent retries."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_core import (
    Abandoned,
    CancelRequested,
    EmergencyStopRequested,
    EscalationCommitted,
    GaveUp,
    HoldPlaced,
    HoldReleased,
    JobCreated,
    OutcomeCommitted,
    SubmissionOpened,
    Superseded,
)
from tests.integration.api.support import (
    ALICE,
    HOLD_ON_PREEMPTION,
    OTHER_HUMAN_TOKEN,
    SERVICE_TOKEN,
    Api,
    by_name,
    now,
    preempted_and_held,
    unknown_launch,
)

pytestmark = pytest.mark.integration


async def _job(api: Api, **fields: Any) -> str:
    job_id = (await api.submit(**fields))["job_id"]
    assert isinstance(job_id, str)
    return job_id


def _refused(reply: Any, *words: str) -> None:
    assert reply.status == 409, reply.text
    assert reply.error["code"] == "refused"
    for word in words:
        assert word in reply.error["message"], reply.error["message"]


# ----------------------------------------------------------------------- hold / release


async def test_hold_then_release_by_another_human_notes_the_override(api: Api) -> None:
    job_id = await _job(api)
    hold = await api.command(job_id, "hold", reason="maintenance", for_s=600)
    assert hold.status == 200, hold.text
    assert hold.body["command"] == "hold"
    assert hold.body["status"]["state"] == "held"
    ((placed_seq, placed),) = [(e["seq"], e["event"]) for e in hold.body["events"]]
    assert placed["type"] == "hold.placed"
    assert placed["kind"] == "actor"
    assert placed["by"] == {"name": "alice", "kind": "human"}
    assert placed["reason"] == "maintenance"
    assert hold.body["seq"] == placed_seq

    release = await api.command(job_id, "release", token=OTHER_HUMAN_TOKEN)
    assert release.status == 200, release.text
    (released,) = [e["event"] for e in release.body["events"]]
    assert released["type"] == "hold.released"
    assert released["by"]["name"] == "bob"
    assert released["override"] is True
    assert release.body["status"]["state"] == "pending"

    events = await api.events(job_id)
    assert [type(e) for e in events] == [JobCreated, HoldPlaced, HoldReleased]
    assert [by_name(e) for e in events] == ["alice", "alice", "bob"]


async def test_hold_refusals(api: Api) -> None:
    job_id = await _job(api)
    assert (await api.command(job_id, "hold")).status == 200
    _refused(await api.command(job_id, "hold"), "hold 1 (actor, by alice) is already in force")
    assert (await api.command(job_id, "cancel")).status == 200
    _refused(await api.command(job_id, "hold"), "is committed and final", "a hold can't change it")


async def test_release_refusals(api: Api) -> None:
    job_id = await _job(api)
    _refused(
        await api.command(job_id, "release"), "no hold is in force; there is nothing to release"
    )

    held = await _job(api, policy=HOLD_ON_PREEMPTION)
    await api.append(held, *preempted_and_held(held))
    _refused(
        await api.command(held, "release"),
        "is a recovery hold",
        "can't be released",
        "use resubmit",
    )


# ------------------------------------------------------------------ resubmit / give-up


async def test_resubmit_lifts_a_recovery_hold_and_opens_a_submission(api: Api) -> None:
    job_id = await _job(api, policy=HOLD_ON_PREEMPTION)
    await api.append(job_id, *preempted_and_held(job_id))
    reply = await api.command(job_id, "resubmit", reason="the node is back")
    assert reply.status == 200, reply.text
    released, opened = [e["event"] for e in reply.body["events"]]
    assert released["type"] == "hold.released"
    assert released["how"] == "resubmit"
    assert opened["type"] == "submission.opened"
    assert opened["submission"] == 2
    assert opened["why"] == "resubmit"
    assert opened["by"]["name"] == "alice"
    assert reply.body["status"]["state"] == "recovering"
    last = (await api.events(job_id))[-1]
    assert isinstance(last, SubmissionOpened)


async def test_resubmit_refusals(api: Api) -> None:
    job_id = await _job(api)
    _refused(await api.command(job_id, "resubmit"), "no hold is in force", "recovery hold")
    assert (await api.command(job_id, "hold")).status == 200
    _refused(await api.command(job_id, "resubmit"), "is an actor hold", "release it instead")


async def test_give_up_fails_a_held_job_with_its_cause(api: Api) -> None:
    job_id = await _job(api, policy=HOLD_ON_PREEMPTION)
    await api.append(job_id, *preempted_and_held(job_id))
    reply = await api.command(job_id, "give-up", reason="not worth it")
    assert reply.status == 200, reply.text
    types = [e["event"]["type"] for e in reply.body["events"]]
    assert types == ["give-up", "hold.released", "outcome.committed", "escalation.committed"]
    outcome = reply.body["events"][2]["event"]
    assert outcome["state"] == "failed"
    assert outcome["cause"]["kind"] == "preempted"
    assert reply.body["status"]["state"] == "failed"
    events = await api.events(job_id)
    assert isinstance(events[-4], GaveUp)
    assert by_name(events[-4]) == "alice"
    assert isinstance(events[-1], EscalationCommitted)
    assert events[-1].id == "give-up"


async def test_give_up_refusals(api: Api) -> None:
    job_id = await _job(api)
    _refused(await api.command(job_id, "give-up"), "only a held job can be given up")
    assert (await api.command(job_id, "cancel")).status == 200
    _refused(await api.command(job_id, "give-up"), "is committed and final")


# ----------------------------------------------------------------------------- cancel


async def test_cancel_and_its_refusal(api: Api) -> None:
    job_id = await _job(api)
    assert (await api.command(job_id, "hold")).status == 200
    reply = await api.command(job_id, "cancel", token=OTHER_HUMAN_TOKEN, reason="wrong data")
    assert reply.status == 200, reply.text
    types = [e["event"]["type"] for e in reply.body["events"]]
    assert types == ["cancel.requested", "hold.released", "outcome.committed"]
    assert reply.body["events"][1]["event"]["override"] is True
    outcome = reply.body["events"][2]["event"]
    assert outcome["state"] == "cancelled"
    assert outcome["cause"]["actor"]["name"] == "bob"
    assert outcome["cause"]["detail"] == "wrong data"
    assert reply.body["status"]["state"] == "cancelled"

    _refused(
        await api.command(job_id, "cancel"),
        "the job's outcome (cancelled) is committed and final",
        "there is nothing to cancel",
    )


async def test_a_service_actor_may_cancel(api: Api) -> None:
    job_id = await _job(api)
    reply = await api.command(job_id, "cancel", token=SERVICE_TOKEN)
    assert reply.status == 200
    events = await api.events(job_id)
    assert isinstance(events[1], CancelRequested)
    assert by_name(events[1]) == "ci"


# ---------------------------------------------------------------------------- abandon


async def test_abandon_by_a_service_actor_is_403_and_records_nothing(api: Api) -> None:
    job_id = await _job(api)
    await api.append(job_id, *unknown_launch(job_id))
    before = await api.records.last_seq(job_id)
    reply = await api.command(job_id, "abandon", token=SERVICE_TOKEN, target={"submission": 1})
    assert reply.status == 403
    assert reply.error["code"] == "forbidden"
    assert "only a human may abandon" in reply.error["message"]
    assert await api.records.last_seq(job_id) == before
    assert api.metric("dispatch_api_commands_total", {"command": "abandon", "outcome": "forbidden"})


async def test_abandon_an_all_unknown_submission(api: Api) -> None:
    job_id = await _job(api)
    await api.append(job_id, *unknown_launch(job_id))
    reply = await api.command(
        job_id, "abandon", reason="no such job in squeue", target={"submission": 1}
    )
    assert reply.status == 200, reply.text
    (abandoned,) = [e["event"] for e in reply.body["events"]]
    assert abandoned["type"] == "abandoned"
    assert abandoned["target"] == {"submission": 1, "attempt": None, "foreign": None}
    assert abandoned["by"] == {"name": "alice", "kind": "human"}
    last = (await api.events(job_id))[-1]
    assert isinstance(last, Abandoned)

    _refused(
        await api.command(job_id, "abandon", target={"submission": 1}),
        "submission 1 is not all-unknown",
    )


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ({}, "the target names nothing"),
        ({"submission": 3}, "submission 3 was never opened"),
        ({"submission": 1, "attempt": 2}, "attempt 1/2 was never made"),
        (
            {"submission": 1, "foreign": {"cluster": "local", "id": "7"}},
            "a target is a foreign object or a launch, not both",
        ),
    ],
)
async def test_abandon_refusals(api: Api, target: dict[str, Any], words: str) -> None:
    job_id = await _job(api)
    await api.append(job_id, *unknown_launch(job_id))
    _refused(await api.command(job_id, "abandon", target=target), words)


async def test_abandon_a_foreign_object_once(api: Api) -> None:
    job_id = await _job(api)
    target = {"foreign": {"cluster": "local", "id": "9999"}}
    assert (await api.command(job_id, "abandon", target=target)).status == 200
    _refused(
        await api.command(job_id, "abandon", target=target),
        "foreign object local/9999 is already abandoned",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "x"}, "target"),
        ({"reason": "x", "target": {"submission": "one"}}, "target.submission"),
        (
            {"reason": "x", "target": {"foreign": {"cluster": "c", "id": "1", "x": 1}}},
            "target.foreign.x",
        ),
        ({"reason": "x", "target": {"sub": 1}}, "target.sub"),
    ],
)
async def test_a_malformed_abandon_is_400(api: Api, body: dict[str, Any], field: str) -> None:
    job_id = await _job(api)
    reply = await api.call("POST", f"/v1/jobs/{job_id}/abandon", body=body)
    assert reply.status == 400, reply.text
    assert reply.error["field"] == field


# -------------------------------------------------------------------------- supersede


async def test_supersede_creates_the_new_job(api: Api) -> None:
    job_id = await _job(api, name="train", policy=HOLD_ON_PREEMPTION)
    _refused(
        await api.command(job_id, "supersede"),
        "the job has no outcome yet",
        "only a finished job can be superseded",
    )
    assert (await api.command(job_id, "cancel")).status == 200
    reply = await api.command(job_id, "supersede", reason="fixed the data path")
    assert reply.status == 201, reply.text
    new_id = reply.body["new_job_id"]
    assert new_id.startswith(f"{job_id}-")
    assert reply.headers["Location"] == f"/v1/jobs/{new_id}"
    (superseded,) = [e["event"] for e in reply.body["events"]]
    assert superseded["type"] == "superseded"
    assert superseded["new_job"] == new_id
    assert reply.body["status"]["superseded_by"] == new_id
    assert reply.body["plan"]["rules"][0]["action"] == "hold"

    (created,) = await api.events(new_id)
    assert isinstance(created, JobCreated)
    assert created.generation == 1
    assert created.supersedes == job_id
    assert created.by.name == "alice"
    status = await api.call("GET", f"/v1/jobs/{new_id}")
    assert status.body["supersedes"] == job_id

    _refused(await api.command(job_id, "supersede"), f"already superseded by {new_id!r}")


async def test_supersede_with_a_new_id_or_name(api: Api) -> None:
    old = await _job(api)
    taken = await _job(api)
    assert (await api.command(old, "cancel")).status == 200
    _refused(await api.command(old, "supersede", new_job_id=taken), f"job {taken!r} already exists")
    _refused(await api.command(old, "supersede", new_job_id=old), "needs an id of its own")
    reply = await api.command(old, "supersede", name="retry")
    assert reply.status == 201
    assert reply.body["new_job_id"].startswith("retry-")

    other = await _job(api)
    assert (await api.command(other, "cancel")).status == 200
    chosen = await api.command(other, "supersede", new_job_id="chosen-1")
    assert chosen.body["new_job_id"] == "chosen-1"


async def test_a_half_done_supersede_is_completed(api: Api) -> None:
    """A crash between the old job's ``Superseded`` and the new job's creation leaves a link
    to a job with no record; the next supersede of the old job creates it."""
    job_id = await _job(api)
    assert (await api.command(job_id, "cancel")).status == 200
    await api.append(
        job_id,
        Superseded(job_id=job_id, at=now(), new_job="orphan-link", by=ALICE, reason="crashed"),
    )
    assert await api.records.last_seq("orphan-link") == 0
    _refused(await api.command(job_id, "supersede"), "already superseded by 'orphan-link'")
    (created,) = await api.events("orphan-link")
    assert isinstance(created, JobCreated)
    assert created.supersedes == job_id
    assert created.generation == 1


# --------------------------------------------------------------------- emergency-stop


async def test_emergency_stop_cancels_a_running_job_and_is_recorded_after_an_outcome(
    api: Api,
) -> None:
    job_id = await _job(api)
    reply = await api.command(job_id, "emergency-stop", reason="runaway")
    assert reply.status == 200, reply.text
    types = [e["event"]["type"] for e in reply.body["events"]]
    assert types == ["emergency-stop.requested", "cancel.requested", "outcome.committed"]
    again = await api.command(job_id, "emergency-stop", reason="still alive")
    assert again.status == 200
    assert [e["event"]["type"] for e in again.body["events"]] == ["emergency-stop.requested"]
    events = await api.events(job_id)
    assert isinstance(events[-1], EmergencyStopRequested)
    assert isinstance(events[3], OutcomeCommitted)


# ------------------------------------------------------------- common to every command

COMMANDS = [
    "hold",
    "release",
    "resubmit",
    "cancel",
    "give-up",
    "abandon",
    "supersede",
    "emergency-stop",
]


@pytest.mark.parametrize("command", COMMANDS)
async def test_an_unknown_job_is_404(api: Api, command: str) -> None:
    extra: dict[str, Any] = {"target": {"submission": 1}} if command == "abandon" else {}
    reply = await api.command("no-such-job", command, **extra)
    assert reply.status == 404, reply.text
    assert reply.error["code"] == "not-found"


@pytest.mark.parametrize("command", COMMANDS)
async def test_a_reason_is_required(api: Api, command: str) -> None:
    job_id = await _job(api)
    extra: dict[str, Any] = {"target": {"submission": 1}} if command == "abandon" else {}
    missing = await api.call("POST", f"/v1/jobs/{job_id}/{command}", body=extra)
    assert missing.status == 400, missing.text
    assert missing.error["field"] == "reason"
    empty = await api.call("POST", f"/v1/jobs/{job_id}/{command}", body={**extra, "reason": ""})
    assert empty.status == 400
    assert empty.error["field"] == "reason"
    no_body = await api.call("POST", f"/v1/jobs/{job_id}/{command}")
    assert no_body.status == 400
    assert no_body.error["field"] in ("reason", "target")
    assert len(await api.events(job_id)) == 1


@pytest.mark.parametrize("command", COMMANDS)
async def test_an_unknown_field_is_400(api: Api, command: str) -> None:
    job_id = await _job(api)
    reply = await api.command(job_id, command, by={"name": "mallory", "kind": "human"})
    assert reply.status == 400
    assert reply.error["field"] == "by"


@pytest.mark.parametrize("for_s", [0, -1, 1e12, "long"])
async def test_a_bad_hold_duration_is_400(api: Api, for_s: Any) -> None:
    job_id = await _job(api)
    reply = await api.command(job_id, "hold", for_s=for_s)
    assert reply.status == 400
    assert reply.error["field"] == "for_s"


async def test_an_unknown_command_is_404_and_a_wrong_method_405(api: Api) -> None:
    job_id = await _job(api)
    unknown = await api.command(job_id, "pause")
    assert unknown.status == 404
    assert unknown.error["code"] == "not-found"
    wrong = await api.call("GET", f"/v1/jobs/{job_id}/hold")
    assert wrong.status == 405
    assert wrong.error["code"] == "method-not-allowed"
    assert "POST" in wrong.headers["Allow"]


async def test_a_retried_command_with_an_idempotency_key_commits_once(api: Api) -> None:
    job_id = await _job(api)
    headers = {"Idempotency-Key": "hold-1"}
    first = await api.command(job_id, "hold", headers=headers)
    second = await api.command(job_id, "hold", headers=headers)
    assert first.status == second.status == 200
    assert second.body["replayed"] is True
    assert second.body["events"] == first.body["events"]
    assert second.body["seq"] == first.body["seq"]
    assert [type(e) for e in await api.events(job_id)] == [JobCreated, HoldPlaced]

    # Another key is another request: decided again, and refused.
    _refused(await api.command(job_id, "hold", headers={"Idempotency-Key": "hold-2"}), "in force")


async def test_a_key_reused_with_another_command_body_is_409(api: Api) -> None:
    """The same key with other fields is another request, not a retry: 409, naming the key;
    nothing is committed, and the exact retry is still answered from the first commit."""
    job_id = await _job(api)
    headers = {"Idempotency-Key": "hold-reused"}
    first = await api.command(job_id, "hold", headers=headers, reason="checking the data")
    assert first.status == 200, first.text
    for fields in ({"reason": "something else"}, {"reason": "checking the data", "for_s": 60}):
        other = await api.command(job_id, "hold", headers=headers, **fields)
        assert other.status == 409, other.text
        assert other.error["code"] == "idempotency-key-reused"
        assert "hold-reused" in other.error["message"]
    again = await api.command(job_id, "hold", headers=headers, reason="checking the data")
    assert (again.status, again.body["replayed"]) == (200, True)
    assert [type(e) for e in await api.events(job_id)] == [JobCreated, HoldPlaced]


async def test_a_supersede_key_reused_with_another_new_job_is_409(api: Api) -> None:
    job_id = await _job(api)
    assert (await api.command(job_id, "cancel")).status == 200
    headers = {"Idempotency-Key": "supersede-reused"}
    first = await api.command(job_id, "supersede", headers=headers)
    assert first.status == 201, first.text
    other = await api.command(job_id, "supersede", headers=headers, new_job_id="another-1")
    assert other.status == 409, other.text
    assert other.error["code"] == "idempotency-key-reused"
    assert not await api.records.last_seq("another-1")


async def test_a_retried_supersede_names_the_same_new_job(api: Api) -> None:
    job_id = await _job(api)
    assert (await api.command(job_id, "cancel")).status == 200
    headers = {"Idempotency-Key": "supersede-1"}
    first = await api.command(job_id, "supersede", headers=headers)
    second = await api.command(job_id, "supersede", headers=headers)
    assert first.status == second.status == 201
    assert second.body["replayed"] is True
    assert first.body["new_job_id"] == second.body["new_job_id"]
    assert second.body["plan"] == first.body["plan"]
    assert len(await api.events(first.body["new_job_id"])) == 1


async def test_a_spec_with_nothing_to_run_is_a_400_naming_spec_command(api: Api) -> None:
    """A job that can only fail at launch is refused at submission, naming the field,
    rather than escalated later as a scheduler's refusal."""
    reply = await api.call("POST", "/v1/jobs", body={"spec": {"cluster": "local"}})
    assert reply.status == 400
    assert reply.error["field"] == "spec.command"
    assert "nothing to run" in reply.error["message"]

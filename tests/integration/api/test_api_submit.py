"""``POST /v1/jobs``: the job id, the plan shown before the job starts, 400s naming the field,
409 for a taken id, and an idempotent retry."""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec
import pytest

from dispatch_core import (
    Action,
    ActorKind,
    CauseKind,
    JobCreated,
    UnknownLaunchPolicy,
    is_job_id,
)
from services.api.errors import accepted_values
from tests.integration.api.support import HOLD_ON_PREEMPTION, SERVICE_TOKEN, SPEC, Api

pytestmark = pytest.mark.integration


async def test_submit_makes_an_id_and_shows_the_plan(api: Api) -> None:
    reply = await api.call("POST", "/v1/jobs", body={"spec": SPEC, "policy": HOLD_ON_PREEMPTION})
    assert reply.status == 201, reply.text
    job_id = reply.body["job_id"]
    assert is_job_id(job_id)
    assert job_id.startswith("job-")
    assert len(job_id) == len("job-") + 8
    assert reply.headers["Location"] == f"/v1/jobs/{job_id}"
    plan = reply.body["plan"]
    assert [r["action"] for r in plan["rules"]] == ["hold", "resubmit"]
    assert "preempted" not in plan["uncovered"]
    assert "node-lost" not in plan["uncovered"]
    assert "out-of-memory" in plan["uncovered"]
    assert plan["substitutions"] == []
    assert reply.body["status"]["state"] == "pending"
    assert reply.body["replayed"] is False

    (created,) = await api.events(job_id)
    assert isinstance(created, JobCreated)
    assert created.by.name == "alice"
    assert created.by.kind is ActorKind.HUMAN
    assert created.declarations.emergency_stop  # the cluster's declarations were used
    assert reply.body["seq"] == await api.records.last_seq(job_id)


async def test_submit_with_a_name_or_an_id(api: Api) -> None:
    named = await api.submit(name="train-gpt")
    assert named["job_id"].startswith("train-gpt-")
    assert is_job_id(named["job_id"])
    chosen = await api.submit(job_id="my-job-1")
    assert chosen["job_id"] == "my-job-1"

    again = await api.call("POST", "/v1/jobs", body={"spec": SPEC, "job_id": "my-job-1"})
    assert again.status == 409
    assert again.error["code"] == "refused"
    assert "already exists" in again.error["message"]
    assert len(await api.events("my-job-1")) == 1


async def test_shared_checkpoint_substitutes_a_hold_for_resubmit(api: Api) -> None:
    body = await api.submit(
        spec={**SPEC, "extensions": [{"type": "shared-checkpoint"}]},
        policy={"rules": [{"on": ["preempted"], "action": "resubmit", "budget": 3}]},
    )
    (sub,) = body["plan"]["substitutions"]
    assert sub["original"] == "resubmit"
    assert sub["substitute"] == "hold"
    assert "24 h" in sub["reason"]
    assert body["plan"]["rules"][0]["action"] == "hold"


async def test_an_unenforced_rule_is_shown_in_the_plan(api: Api) -> None:
    body = await api.submit(policy={"rules": [{"on": ["preempted"], "action": "requeue"}]})
    assert "isn't implemented" in body["plan"]["rules"][0]["unenforced"]


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"spec": SPEC, "colour": "red"}, "colour", "invalid"),
        ({"spec": SPEC, "by": {"name": "mallory", "kind": "human"}}, "by", "invalid"),
        ({"spec": {**SPEC, "colour": "red"}}, "spec.colour", "invalid"),
        ({"spec": {**SPEC, "max_launch_attempts": "three"}}, "spec.max_launch_attempts", "invalid"),
        ({"spec": {**SPEC, "max_launch_attempts": 0}}, "spec.max_launch_attempts", "invalid"),
        ({"spec": {**SPEC, "unresolved_age_s": 0}}, "spec.unresolved_age_s", "invalid"),
        ({"spec": {**SPEC, "cleanup_deadline_s": 1e300}}, "spec.cleanup_deadline_s", "invalid"),
        (
            {"spec": {**SPEC, "extensions": [{"type": "magic"}]}},
            "spec.extensions[0].type",
            "invalid",
        ),
        ({"spec": {"command": ["x"]}}, "spec.cluster", "invalid"),
        ({"policy": {"rules": []}}, "spec", "invalid"),
        (
            {"spec": SPEC, "policy": {"rules": [{"on": ["evicted"], "action": "hold"}]}},
            "policy.rules[0].on[0]",
            "invalid",
        ),
        (
            {"spec": SPEC, "policy": {"rules": [{"on": ["oom"], "action": "hold", "x": 1}]}},
            "policy.rules[0].on[0]",
            "invalid",
        ),
        (
            {"spec": SPEC, "policy": {"rules": [{"on": ["preempted"], "action": "hold", "x": 1}]}},
            "policy.rules[0].x",
            "invalid",
        ),
        (
            {"spec": SPEC, "policy": {"rules": [{"on": ["none"], "action": "resubmit"}]}},
            "policy.rules[0].on",
            "invalid-policy",
        ),
        (
            {
                "spec": SPEC,
                "policy": {
                    "rules": [
                        {"on": ["preempted"], "action": "resubmit"},
                        {"on": ["preempted"], "action": "hold"},
                    ]
                },
            },
            "policy.rules[1].on",
            "invalid-policy",
        ),
        ({"spec": {**SPEC, "cluster": "mars"}}, "spec.cluster", "unknown-cluster"),
        ({"spec": SPEC, "job_id": "Not_An_Id"}, "job_id", "invalid"),
        ({"spec": SPEC, "job_id": "a" * 64}, "job_id", "invalid"),
        ({"spec": SPEC, "name": "n" * 55}, "name", "invalid"),
        ({"spec": SPEC, "name": "-dash"}, "name", "invalid"),
    ],
)
async def test_a_malformed_body_is_400_naming_the_field(
    api: Api, body: dict[str, Any], field: str, code: str
) -> None:
    reply = await api.call("POST", "/v1/jobs", body=body)
    assert reply.status == 400, reply.text
    assert reply.error["code"] == code
    assert reply.error["field"] == field
    assert reply.error["message"]
    assert await api.records.list_jobs() == []


@pytest.mark.parametrize(
    ("body", "field", "accepted"),
    [
        (
            {"spec": SPEC, "policy": {"rules": [{"on": ["preemptd"], "action": "hold"}]}},
            "policy.rules[0].on[0]",
            [k.value for k in CauseKind],
        ),
        (
            {"spec": SPEC, "policy": {"rules": [{"on": ["preempted"], "action": "hld"}]}},
            "policy.rules[0].action",
            [a.value for a in Action],
        ),
        (
            {"spec": {**SPEC, "on_unknown_launch": "retry"}},
            "spec.on_unknown_launch",
            [p.value for p in UnknownLaunchPolicy],
        ),
    ],
)
async def test_an_invalid_enum_value_is_400_listing_the_accepted_values(
    api: Api, body: dict[str, Any], field: str, accepted: list[str]
) -> None:
    """msgspec names the path of a value an enum doesn't have; the 400 also says which
    values the field accepts, whichever enum it is."""
    reply = await api.call("POST", "/v1/jobs", body=body)
    assert reply.status == 400, reply.text
    assert reply.error["code"] == "invalid"
    assert reply.error["field"] == field
    assert reply.error["message"].endswith("; accepted values: " + ", ".join(accepted))
    assert f"at `$.{field}`" in reply.error["message"]


async def test_only_an_invalid_enum_value_lists_accepted_values(api: Api) -> None:
    reply = await api.call("POST", "/v1/jobs", body={"spec": SPEC, "job_id": "Not_An_Id"})
    assert reply.status == 400, reply.text
    assert "accepted values" not in reply.error["message"]


class _Kind(enum.Enum):
    A = "a"
    B = "b"


class _Nested(msgspec.Struct, frozen=True, kw_only=True):
    by_kind: dict[_Kind, int] = msgspec.field(default_factory=dict)
    kinds: dict[str, tuple[_Kind, ...]] = msgspec.field(default_factory=dict)
    mode: Literal["fast", "slow"] | None = None
    pair: tuple[int, _Kind] | None = None


@pytest.mark.parametrize(
    ("data", "accepted"),
    [
        (b'{"by_kind": {"c": 1}}', ("a", "b")),
        (b'{"kinds": {"x": ["a", "c"]}}', ("a", "b")),
        (b'{"mode": "medium"}', ("fast", "slow")),
        (b'{"pair": [1, "c"]}', ("a", "b")),
        (b'{"pair": ["x", "a"]}', None),
    ],
)
def test_accepted_values_follow_the_path_through_any_type(
    data: bytes, accepted: tuple[str, ...] | None
) -> None:
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.json.decode(data, type=_Nested)
    assert accepted_values(str(refused.value), _Nested) == accepted


@pytest.mark.parametrize("data", [b"", b"{", b"[1, 2]", b"null", b"\xff\xfe"])
async def test_a_body_that_is_not_a_json_object_is_400(api: Api, data: bytes) -> None:
    reply = await api.call("POST", "/v1/jobs", data=data)
    assert reply.status == 400, reply.text
    assert reply.error["code"] == "invalid"
    assert await api.records.list_jobs() == []


async def test_an_unknown_cluster_names_the_known_ones(api: Api) -> None:
    reply = await api.call("POST", "/v1/jobs", body={"spec": {**SPEC, "cluster": "mars"}})
    assert "local" in reply.error["message"]
    assert "other" in reply.error["message"]


async def test_a_service_actor_may_submit(api: Api) -> None:
    body = await api.submit(token=SERVICE_TOKEN)
    (created,) = await api.events(body["job_id"])
    assert isinstance(created, JobCreated)
    assert created.by.name == "ci"
    assert created.by.kind is ActorKind.SERVICE


async def test_a_retried_submit_with_an_idempotency_key_creates_one_job(api: Api) -> None:
    headers = {"Idempotency-Key": "submit-7f3a"}
    body = {"spec": SPEC, "name": "retry"}
    first = await api.call("POST", "/v1/jobs", body=body, headers=headers)
    second = await api.call("POST", "/v1/jobs", body=body, headers=headers)
    assert first.status == second.status == 201
    assert first.body["job_id"] == second.body["job_id"]
    assert first.body["seq"] == second.body["seq"]
    assert first.body["replayed"] is False
    assert second.body["replayed"] is True
    assert await api.records.list_jobs() == [first.body["job_id"]]
    assert len(await api.events(first.body["job_id"])) == 1
    assert api.metric("dispatch_api_commands_total", {"command": "submit", "outcome": "replayed"})

    other = await api.call("POST", "/v1/jobs", body=body, headers={"Idempotency-Key": "other"})
    assert other.body["job_id"] != first.body["job_id"]


@pytest.mark.parametrize(
    "changed",
    [
        {"spec": {**SPEC, "command": ["python", "eval.py"]}},
        {"spec": SPEC, "policy": HOLD_ON_PREEMPTION},
    ],
    ids=["spec", "policy"],
)
async def test_a_key_reused_with_another_request_is_409_and_creates_nothing(
    api: Api, changed: dict[str, Any]
) -> None:
    """A retry must repeat its request: a different spec or policy under the key of an earlier
    submit would otherwise be answered 201 with the first job, and never be done."""
    headers = {"Idempotency-Key": "submit-reused"}
    first = await api.call(
        "POST", "/v1/jobs", body={"spec": SPEC, "name": "reuse"}, headers=headers
    )
    assert first.status == 201, first.text
    other = await api.call("POST", "/v1/jobs", body={**changed, "name": "reuse"}, headers=headers)
    assert other.status == 409, other.text
    assert other.error["code"] == "idempotency-key-reused"
    assert "submit-reused" in other.error["message"]
    assert await api.records.list_jobs() == [first.body["job_id"]]
    assert len(await api.events(first.body["job_id"])) == 1
    again = await api.call(
        "POST", "/v1/jobs", body={"spec": SPEC, "name": "reuse"}, headers=headers
    )
    assert (again.status, again.body["replayed"]) == (201, True)  # the exact retry still is


async def test_the_same_key_from_another_actor_is_another_request(api: Api) -> None:
    headers = {"Idempotency-Key": "shared-key"}
    body = {"spec": SPEC}
    alice = await api.call("POST", "/v1/jobs", body=body, headers=headers)
    ci = await api.call("POST", "/v1/jobs", body=body, headers=headers, token=SERVICE_TOKEN)
    assert alice.status == ci.status == 201
    assert alice.body["job_id"] != ci.body["job_id"]


@pytest.mark.parametrize("key", ["", "has space", "x" * 201, "é"])
async def test_a_bad_idempotency_key_is_400(api: Api, key: str) -> None:
    reply = await api.call(
        "POST", "/v1/jobs", body={"spec": SPEC}, headers={"Idempotency-Key": key}
    )
    assert reply.status == 400, reply.text
    assert reply.error["field"] == "Idempotency-Key"


async def test_a_too_large_body_is_413(api: Api) -> None:
    reply = await api.call("POST", "/v1/jobs", body={"spec": {**SPEC, "script": "x" * 2_000_000}})
    assert reply.status == 413
    assert reply.error["code"] == "too-large"
    assert await api.records.list_jobs() == []


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"command": ["python"], "script": "#!/bin/sh\ntrue\n"}, "spec.script", "both"),
        ({"command": ["python", "train.py\u0000"]}, "spec.command", "NUL"),
        ({"script": "#!/bin/sh\necho \u0000\n"}, "spec.script", "NUL"),
        ({"command": ["true"], "env": {"A=B": "1"}}, "spec.env", "'A=B'"),
        ({"command": ["true"], "env": {"A\u0000": "1"}}, "spec.env", "NUL"),
        ({"command": ["true"], "env": {"A": "x\u0000y"}}, "spec.env", "NUL"),
        ({"command": ["true"], "options": {"chdir": "/tmp\u0000x"}}, "spec.options.chdir", "NUL"),
    ],
)
async def test_what_no_runner_could_start_is_refused_at_the_door(
    api: Api, spec: dict[str, Any], field: str, words: str
) -> None:
    """Issue 15, item 7: a NUL byte in the command, the script, an environment key or value
    or options.chdir, an ``=`` in an environment key, or both a command and a script: 400
    naming the field (it was 201, then the runner died), and no job is made."""
    body = {"spec": {"cluster": SPEC["cluster"], **spec}}
    reply = await api.call("POST", "/v1/jobs", body=body)
    assert reply.status == 400, reply.text
    assert reply.error["field"] == field, reply.error
    assert words in reply.error["message"], reply.error
    assert await api.records.list_jobs() == []


async def test_equals_signs_in_arguments_values_and_paths_are_accepted(api: Api) -> None:
    """``=`` is refused only in an environment key (``execve`` reads ``KEY=VALUE`` up to the
    first ``=``): ``--lr=0.1``, a value ``a=b`` and a directory ``/tmp/run=3`` are legal."""
    body = await api.submit(
        spec={
            **SPEC,
            "command": ["python", "train.py", "--lr=0.1"],
            "env": {"OPTS": "a=b"},
            "options": {"chdir": "/tmp/run=3"},
        }
    )
    assert body["job_id"]

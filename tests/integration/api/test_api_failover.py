"""``POST /v1/jobs`` checks a failover rule (issue 14, part 2) against the clusters file:
every listed cluster exists, its backend accepts the spec's options, and the checkpoint root
is reachable from the job's cluster and every listed one (``shared_paths``; ``s3://``
everywhere). A refusal is a 400 naming the field, and nothing is recorded."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_backends.config import LocalCluster, SlurmCluster
from dispatch_core import Declarations, JobCreated
from tests.integration.api.support import SPEC, Api

pytestmark = pytest.mark.integration

FAILOVER_ON = ["node-lost", "no-capacity", "launch-failed"]


@pytest.fixture
def failover_api(api: Api) -> Api:
    """The API with a third cluster, ``slurm``, in its clusters file: a Slurm entry whose
    nodes see ``/shared`` (read only: checking builds no backend, runs no Slurm command).
    ``local`` is a local entry that sees every path of its machine."""
    api.ops._declarations["slurm"] = Declarations(node_loss_window_s=600.0)
    api.ops._cluster_configs["slurm"] = SlurmCluster(name="slurm", shared_paths=("/shared",))
    assert isinstance(api.ops._cluster_configs["local"], LocalCluster)
    return api


def _body(job_id: str, checkpoint: str | None, clusters: list[str], **spec: Any) -> Any:
    body: dict[str, Any] = {
        "job_id": job_id,
        "spec": {**SPEC, **spec},
        "policy": {
            "rules": [{"on": FAILOVER_ON, "action": "resubmit", "budget": 3, "clusters": clusters}]
        },
    }
    if checkpoint is not None:
        body["spec"]["checkpoint"] = checkpoint
    return body


async def _refused(api: Api, body: Any) -> dict[str, Any]:
    reply = await api.call("POST", "/v1/jobs", body=body)
    assert reply.status == 400, reply.text
    assert await api.events(body["job_id"]) == []
    error: dict[str, Any] = reply.error
    return error


async def test_a_local_root_a_listed_cluster_cannot_see_is_refused_naming_both(
    failover_api: Api,
) -> None:
    error = await _refused(
        failover_api, _body("unreachable", "/data/ckpt/{job}", ["local", "slurm"])
    )
    assert error["code"] == "unreachable-checkpoint"
    assert error["field"] == "spec.checkpoint"
    assert "'/data/ckpt/{job}'" in error["message"]
    assert "'slurm'" in error["message"]


@pytest.mark.parametrize("root", ["/shared/ckpt/{job}", "s3://bucket/ckpt/{job}"])
async def test_a_root_every_listed_cluster_sees_is_accepted_and_planned(
    failover_api: Api, root: str
) -> None:
    body = await failover_api.submit(
        spec={**SPEC, "checkpoint": root},
        policy=_body("x", None, ["local", "slurm"])["policy"],
    )
    assert body["plan"]["rules"][0]["clusters"] == ["local", "slurm"]
    (created,) = await failover_api.events(body["job_id"])
    assert isinstance(created, JobCreated)
    assert created.policy.rules[0].clusters == ("local", "slurm")


async def test_an_unknown_listed_cluster_is_refused(failover_api: Api) -> None:
    error = await _refused(failover_api, _body("unknown", None, ["local", "nowhere"]))
    assert error["code"] == "unknown-cluster"
    assert error["field"] == "policy.rules[0].clusters"
    assert "'nowhere'" in error["message"]


async def test_an_option_a_listed_clusters_backend_refuses_is_refused_naming_it(
    failover_api: Api,
) -> None:
    """A Slurm option (``partition``) on a job that may fail over to the local backend,
    which doesn't read it."""
    body = _body(
        "slurm-only", None, ["slurm", "local"], cluster="slurm", options={"partition": "gpu"}
    )
    error = await _refused(failover_api, body)
    assert error["field"] == "spec.options.partition"
    assert "'local'" in error["message"]


async def test_clusters_on_a_hold_rule_is_an_invalid_policy(failover_api: Api) -> None:
    body = _body("hold-failover", None, ["local", "slurm"])
    body["policy"]["rules"][0]["action"] = "hold"
    error = await _refused(failover_api, body)
    assert error["code"] == "invalid-policy"
    assert error["field"] == "policy.rules[0]"
    assert "only for a resubmit rule" in error["message"]


async def test_an_owner_a_listed_slurm_cluster_may_not_act_for_is_refused_naming_it(
    failover_api: Api,
) -> None:
    """A job may fail over to a Slurm cluster only if dispatch may act for its owner there
    too (issue 16, item 1): alice maps to Unix user ``alice``, the ``slurm`` entry may act
    for ``bob`` only, so a failover from ``local`` to ``slurm`` is refused at the door."""
    failover_api.ops._unix_users["alice"] = "alice"
    failover_api.ops._cluster_configs["slurm"] = SlurmCluster(
        name="slurm", shared_paths=("/shared",), users=("bob",)
    )
    body = _body("owned", "/shared/ckpt/{job}", ["local", "slurm"])
    reply = await failover_api.call("POST", "/v1/jobs", body=body)
    assert reply.status == 403, reply.text
    assert reply.error["field"] == "spec.owner"
    assert "'slurm'" in reply.error["message"]
    assert "'alice'" in reply.error["message"]
    assert await failover_api.events("owned") == []
    # The same job without the failover rule runs on local, which may: accepted.
    accepted = await failover_api.submit(spec={**SPEC, "checkpoint": "/shared/ckpt/{job}"})
    assert accepted["job_id"]

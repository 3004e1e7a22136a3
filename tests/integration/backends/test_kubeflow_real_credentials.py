"""Credentials refused for real (401 Unauthorized, 403 Forbidden) on the lane's kube-apiserver
1.20.2: RBAC taken away by deleting the deploy/kubernetes RoleBinding, a token replaced by one
the server does not know, a namespace the ServiceAccount has no binding in. An answer from the
API server, not an outage: a :class:`BackendError` (never :class:`Unreachable`) with the
server's own words, that changes no job's state; discovery recovers by itself once allowed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from dispatch_backends.kubeflow import GateMode, KubeflowBackend, KubeflowSettings
from dispatch_backends.protocol import BackendError, LaunchRefusedError, Snapshot, Unreachable
from dispatch_core.state import CauseKind, JobSpec, ObjectPhase
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_scenarios import running
from tests.integration.backends.test_kubeflow_support import NS, KubeflowHarness, real_kube_env
from tests.servers.kube import KubeApiServer
from tests.servers.kube_resources import TRAINJOBS
from tests.servers.pytest_kube_real import SA_NAME, SA_NAMESPACE, manifest_docs
from tests.util import assert_eventually

__all__ = ["real_kube_env"]

pytestmark = pytest.mark.integration

SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
BINDING = (
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/dispatch-kubeflow-backend"
)


@pytest.fixture
async def harness(real_kube_env: tuple[Any, ClusterSimulator]) -> AsyncIterator[KubeflowHarness]:
    server, cluster = real_kube_env
    h = KubeflowHarness(server, cluster, GateMode.KUEUE, sync_timeout_s=5.0)
    try:
        yield h
    finally:
        await h.cleanup()


@contextlib.contextmanager
def rbac_taken_away(lab: KubeApiServer) -> Iterator[None]:
    """Delete the ServiceAccount's RoleBinding in :data:`NS`; put it back afterwards."""
    (binding,) = [d for d in manifest_docs("20-rbac.yaml") if d["kind"] == "RoleBinding"]
    status, answer = lab.request("DELETE", BINDING)
    assert status == 200, answer
    try:
        yield
    finally:
        status, answer = lab.create(binding)
        assert status in (201, 409), answer


async def refused(harness: KubeflowHarness) -> BackendError:
    """Discover until the refusal shows (RBAC changes reach the authorizer within moments)."""

    async def check() -> BackendError:
        try:
            await harness.discover()
        except BackendError as err:
            caught = err
        else:
            raise AssertionError("discovery was not refused yet")
        assert type(caught) is BackendError, f"expected a BackendError, got {caught!r}"
        return caught

    return await assert_eventually(check, timeout_s=30, interval_s=0.2)


async def recovered(harness: KubeflowHarness) -> Snapshot:
    async def check() -> Snapshot:
        try:
            return await harness.discover()
        except BackendError as err:
            raise AssertionError(f"discovery has not recovered: {err}") from err

    return await assert_eventually(check, timeout_s=60, interval_s=0.2)


async def test_rbac_taken_away_mid_run_changes_no_job_and_discovery_recovers(
    harness: KubeflowHarness,
) -> None:
    job = new_job_id()
    ref = await running(harness, job)
    lab = harness.server.lab
    with rbac_taken_away(lab):
        err = await refused(harness)
        assert "403 Forbidden" in err.detail, err.detail
        assert f'User "{SA_USER}" cannot list resource "trainjobs"' in err.detail, err.detail
        assert not err.retryable
    snapshot = await recovered(harness)
    (observed,) = snapshot.objects[job]
    assert observed.ref == ref
    assert observed.phase is ObjectPhase.RUNNING, "a refusal must change no job"


async def test_a_token_the_server_does_not_know_is_401_and_recovers_with_a_good_one(
    harness: KubeflowHarness,
) -> None:
    job = new_job_id()
    ref = await running(harness, job)
    config = harness.api.configuration
    good = config.api_key["authorization"]
    config.api_key["authorization"] = "rotated-away"  # every client of the backend shares it
    try:
        harness.server.drop_watches()  # the watches reconnect with it
        err = await refused(harness)
        assert "401 Unauthorized" in err.detail, err.detail
        with pytest.raises(Unreachable, match="401"):  # nothing was made: the launch is retried
            await harness.backend.start(make_launch(new_job_id(), harness.spec(Program.SLEEP)))
    finally:
        config.api_key["authorization"] = good
    snapshot = await recovered(harness)
    assert [o.ref for o in snapshot.objects[job]] == [ref]


async def test_a_namespace_without_a_binding_refuses_the_create_with_the_rbac_words(
    kube_lab: KubeApiServer, kube_dispatch_token: str
) -> None:
    kube_lab.ensure_namespace("team-unbound")
    api = kube_lab.api_client(kube_dispatch_token)
    backend = KubeflowBackend(
        "real",
        KubeflowSettings(namespaces=("team-unbound",), gate=GateMode.SUSPEND, sync_timeout_s=5),
        api,
    )
    try:
        spec = JobSpec(cluster="real", command=("python", "t.py"), options={"image": "i:1"})
        with pytest.raises(LaunchRefusedError) as info:
            await backend.start(make_launch(new_job_id(), spec))
        assert "403 Forbidden" in str(info.value)
        assert f'User "{SA_USER}" cannot create resource "trainjobs"' in str(info.value)
        with pytest.raises(BackendError) as refused_info:
            await asyncio.wait_for(backend.discover(), 60)
        assert type(refused_info.value) is BackendError
        assert "forbidden" in refused_info.value.detail
    finally:
        await backend.aclose()
        api.close()


ROLE = "/apis/rbac.authorization.k8s.io/v1/clusterroles/dispatch-kubeflow-backend"


@contextlib.contextmanager
def pod_lists_forbidden(lab: KubeApiServer) -> Iterator[None]:
    """The ServiceAccount's role loses ``list`` on pods (``watch`` stays); restored after."""
    status, role = lab.request("GET", ROLE)
    assert status == 200, role
    rules = [
        {**r, "verbs": [v for v in r["verbs"] if v != "list"]} if r["resources"] == ["pods"] else r
        for r in role["rules"]
    ]
    status, answer = lab.request(
        "PATCH", ROLE, {"rules": rules}, content_type="application/merge-patch+json"
    )
    assert status == 200, answer
    try:
        yield
    finally:
        status, answer = lab.request(
            "PATCH", ROLE, {"rules": role["rules"]}, content_type="application/merge-patch+json"
        )
        assert status == 200, answer


async def test_a_relist_refused_after_a_real_410_changes_no_job_and_discovery_recovers(
    harness: KubeflowHarness,
) -> None:
    """The pod watch expires (410, etcd compaction) and its relist is refused (RBAC): the
    backend must not report from a pod cache it can no longer refresh, nor call the job ended
    or gone."""
    job = new_job_id()
    ref = await running(harness, job)
    env = harness.server
    pods = harness.backend._reflectors[("pods", NS)]
    lists = pods.lists
    with pod_lists_forbidden(env.lab):
        await asyncio.to_thread(env.expire_watch_cache)

        def relist_refused() -> None:
            assert pods.error_status == 403, pods.error

        await assert_eventually(relist_refused, timeout_s=60)
        for _ in range(3):  # every poll while refused: an error, never a snapshot
            err = await refused(harness)
            assert f'User "{SA_USER}" cannot list resource "pods"' in err.detail, err.detail
        assert harness.trainjob(ref) is not None, "nothing was deleted"
    snapshot = await recovered(harness)
    shown = [o for o in snapshot.objects.get(job, ()) if o.ref == ref]
    assert [o.phase for o in shown] == [ObjectPhase.RUNNING]
    assert pods.lists > lists
    await asyncio.to_thread(harness.cluster.oom_kill, NS, ref.id.partition("/")[2])
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.OUT_OF_MEMORY, observed.cause


async def test_a_create_unauthorized_is_unreachable_and_the_retry_makes_one_trainjob(
    harness: KubeflowHarness,
) -> None:
    """401: the API server never got as far as the launch (an expired token): nothing was
    made, and the same launch retried with a good token makes its TrainJob once."""
    launch = make_launch(new_job_id(), harness.spec(Program.SLEEP))
    config = harness.api.configuration
    good = config.api_key["authorization"]
    config.api_key["authorization"] = "expired"
    try:
        with pytest.raises(Unreachable, match="401"):
            await harness.backend.start(launch)
    finally:
        config.api_key["authorization"] = good
    store = harness.server.store
    items, _, _ = store.list_objects(TRAINJOBS, NS)
    assert items == []
    ref = await harness.backend.start(launch)
    harness.started.append(ref)
    assert await harness.backend.start(launch) == ref  # a lost answer's retry finds it
    items, _, _ = store.list_objects(TRAINJOBS, NS)
    assert [i["metadata"]["name"] for i in items] == [ref.id.partition("/")[2]]

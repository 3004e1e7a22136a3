"""Credentials refused (401 Unauthorized, 403 Forbidden) through the kubeflow backend.

An expired token or RBAC taken away is an answer from the API server, not an outage: it is a
:class:`BackendError` (never :class:`Unreachable`) with the server's words, and, as seed 000
says of a scheduler that can't be reached, it changes no job's state. The fake API server
(TEST DOUBLE) answers these faults with the ``Status`` bodies kube-apiserver sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dispatch_backends.kubeflow import GateMode
from dispatch_backends.kubeflow.watch import Reflector
from dispatch_backends.protocol import (
    BackendError,
    LaunchRefusedError,
    Snapshot,
    Unreachable,
)
from dispatch_core.state import CauseKind, ObjectPhase, ObjectRef
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.fakes.kube_apiserver import DEFAULT_USER, PODS, TRAINJOBS, FakeKubeApiServer
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import NS, KubeflowHarness, kube_env
from tests.util import assert_eventually

__all__ = ["kube_env"]

pytestmark = pytest.mark.integration

FOREVER = 10**6
PODS_FORBIDDEN = (
    f'pods is forbidden: User "{DEFAULT_USER}" cannot list resource "pods" in API group "" '
    f'in the namespace "{NS}"'
)
TRAINJOBS_FORBIDDEN = (
    f'trainjobs.trainer.kubeflow.org is forbidden: User "{DEFAULT_USER}" cannot list resource '
    f'"trainjobs" in API group "trainer.kubeflow.org" in the namespace "{NS}"'
)


@pytest.fixture
async def harness(
    kube_env: tuple[FakeKubeApiServer, ClusterSimulator],
) -> AsyncIterator[KubeflowHarness]:
    server, cluster = kube_env
    h = KubeflowHarness(server, cluster, GateMode.KUEUE, sync_timeout_s=1.0)
    try:
        yield h
    finally:
        await h.cleanup()


async def running(harness: KubeflowHarness, job: str) -> ObjectRef:
    """Start a sleeping TrainJob for ``job``, open its gate and wait until it runs."""
    ref = await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
    harness.started.append(ref)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    return ref


async def refused(harness: KubeflowHarness) -> BackendError:
    """Discover, expecting a credentials error (a BackendError that is not Unreachable)."""
    with pytest.raises(BackendError) as info:
        await harness.discover()
    assert type(info.value) is BackendError, f"expected a BackendError, got {info.value!r}"
    return info.value


async def recovered(harness: KubeflowHarness) -> Snapshot:
    """Poll until discovery answers again (no one restarts anything)."""

    async def check() -> Snapshot:
        try:
            return await harness.discover()
        except BackendError as err:
            raise AssertionError(f"discovery has not recovered: {err}") from err

    return await assert_eventually(check, timeout_s=20, interval_s=0.2)


# -- refused at start ---------------------------------------------------------------------


async def test_forbidden_at_start_is_a_backend_error_with_the_rbac_words(
    harness: KubeflowHarness,
) -> None:
    harness.server.faults.fail_next(FOREVER, status=403)
    err = await refused(harness)
    assert "403 Forbidden" in err.detail
    assert PODS_FORBIDDEN in err.detail, err.detail
    assert not err.retryable


async def test_unauthorized_at_start_is_a_backend_error_saying_unauthorized(
    harness: KubeflowHarness,
) -> None:
    harness.server.faults.fail_next(FOREVER, status=401)
    err = await refused(harness)
    assert "401 Unauthorized: Unauthorized" in err.detail, err.detail
    assert "pods" in err.detail


async def test_a_forbidden_trainjob_list_is_a_backend_error_naming_trainjobs(
    harness: KubeflowHarness,
) -> None:
    # The watches may read; the TrainJob list is what RBAC refuses.
    harness.server.faults.fail_next(FOREVER, status=403, path_contains="/trainjobs")
    err = await refused(harness)
    assert f"list TrainJobs in {NS}: 403 Forbidden: {TRAINJOBS_FORBIDDEN}" in err.detail


async def test_discovery_recovers_at_start_once_the_credentials_are_accepted(
    harness: KubeflowHarness,
) -> None:
    harness.server.faults.fail_next(FOREVER, status=401)
    await refused(harness)
    harness.server.faults.clear()
    await recovered(harness)


# -- refused mid-run ----------------------------------------------------------------------


async def test_a_relist_refused_after_a_410_changes_no_job_and_discovery_recovers(
    harness: KubeflowHarness,
) -> None:
    """The pod watch expires (410) and its relist is refused: the backend must not report
    from a pod cache it can no longer refresh, nor call the job ended or gone."""
    job = new_job_id()
    ref = await running(harness, job)
    server = harness.server
    pods: Reflector = harness.backend._reflectors[("pods", NS)]
    lists_before = pods.lists
    # Watches may go on (and meet the 410); lists of pods are refused.
    server.faults.fail_next(FOREVER, status=403, path_contains="/pods", watch=False)
    server.expire_watch_cache(PODS)
    server.drop_watches(resource=PODS)

    def relist_refused() -> None:
        assert pods.error_status == 403, pods.error

    await assert_eventually(relist_refused, timeout_s=10)
    for _ in range(3):  # every poll while refused: an error, never a snapshot
        err = await refused(harness)
        assert PODS_FORBIDDEN in err.detail, err.detail
    assert harness.trainjob(ref) is not None, "nothing was deleted"

    server.faults.clear()
    snapshot = await recovered(harness)
    shown = [o for o in snapshot.objects.get(job, ()) if o.ref == ref]
    assert len(shown) == 1, snapshot.objects.get(job)
    assert shown[0].phase is ObjectPhase.RUNNING, shown[0]
    assert pods.lists > lists_before
    # ...and what happens next is read as before.
    await asyncio.to_thread(harness.cluster.oom_kill, NS, ref.id.partition("/")[2])
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.OUT_OF_MEMORY, observed.cause


@pytest.mark.parametrize(
    ("status", "words"),
    [(401, "401 Unauthorized: Unauthorized"), (403, f"403 Forbidden: {TRAINJOBS_FORBIDDEN}")],
)
async def test_credentials_withdrawn_mid_run_change_no_job_and_discovery_recovers(
    harness: KubeflowHarness, status: int, words: str
) -> None:
    """The token expires (401) or the RBAC binding is removed (403) while a job runs: every
    request is refused, the watches' reconnects included."""
    job = new_job_id()
    ref = await running(harness, job)
    server = harness.server
    server.faults.fail_next(FOREVER, status=status)
    server.drop_watches(abrupt=True)

    def a_watch_refused() -> None:
        assert any(r.error_status == status for r in harness.backend._reflectors.values())

    await assert_eventually(a_watch_refused, timeout_s=10)
    for _ in range(3):
        err = await refused(harness)
        assert str(status) in err.detail
    # The TrainJob list itself is refused with the server's words, once the watches are back.
    server.faults.clear()

    def watches_back() -> None:
        assert all(r.error is None for r in harness.backend._reflectors.values())

    await assert_eventually(watches_back, timeout_s=15)
    server.faults.fail_next(FOREVER, status=status, path_contains="/trainjobs")
    err = await refused(harness)
    assert words in err.detail, err.detail

    server.faults.clear()
    snapshot = await recovered(harness)
    shown = [o for o in snapshot.objects.get(job, ()) if o.ref == ref]
    assert len(shown) == 1, snapshot.objects.get(job)
    assert shown[0].phase is ObjectPhase.RUNNING, shown[0]


# -- create -------------------------------------------------------------------------------


async def test_a_create_forbidden_is_refused_with_the_rbac_words(
    harness: KubeflowHarness,
) -> None:
    job = new_job_id()
    harness.server.faults.fail_next(1, status=403, method="POST", path_contains="/trainjobs")
    with pytest.raises(LaunchRefusedError) as info:
        await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
    assert (
        f'403 Forbidden: trainjobs.trainer.kubeflow.org is forbidden: User "{DEFAULT_USER}" '
        f'cannot create resource "trainjobs" in API group "trainer.kubeflow.org" in the '
        f'namespace "{NS}"'
    ) in info.value.detail
    items, _, _ = harness.server.store.list_objects(TRAINJOBS, NS)
    assert items == []


async def test_a_create_unauthorized_is_unreachable_and_the_retry_makes_one_trainjob(
    harness: KubeflowHarness,
) -> None:
    """401: the API server never got as far as the launch (an expired token), so it is not a
    refusal of it: nothing was made, and the same launch retried makes its TrainJob once."""
    job = new_job_id()
    launch = make_launch(job, harness.spec(Program.SLEEP))
    harness.server.faults.fail_next(1, status=401, method="POST", path_contains="/trainjobs")
    with pytest.raises(Unreachable) as info:
        await harness.backend.start(launch)
    assert "401 Unauthorized: Unauthorized" in info.value.detail
    items, _, _ = harness.server.store.list_objects(TRAINJOBS, NS)
    assert items == []
    ref = await harness.backend.start(launch)
    harness.started.append(ref)
    items, _, _ = harness.server.store.list_objects(TRAINJOBS, NS)
    assert [i["metadata"]["name"] for i in items] == [ref.id.partition("/")[2]]

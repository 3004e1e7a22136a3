"""One scenario per cause path of the kubeflow backend, through the real ``kubernetes`` client.

A real kube-apiserver 1.20.2 (the lane, ``tests/servers/kube.py``) serves them, the backend
running as the deploy/kubernetes ServiceAccount; the cluster simulator's scenario steps write,
through the same server, what the controllers would (``shared/labs/kubeflow-facts.md``, cited
per test). Each test reads
the cause back through :meth:`KubeflowBackend.discover` and checks the kind and that the
scheduler's words are kept verbatim.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from dispatch_backends.kubeflow import GateMode
from dispatch_backends.kubeflow.names import ANNOTATION_OBSERVED
from dispatch_backends.kubeflow.observe import decode_observed
from dispatch_core.state import (
    CauseKind,
    GateState,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_support import NS, KubeflowHarness, real_kube_env
from tests.servers.kube_lane import RealKube
from tests.servers.kube_resources import TRAINJOBS
from tests.util import assert_eventually

__all__ = ["real_kube_env"]

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(
    real_kube_env: tuple[RealKube, ClusterSimulator],
) -> AsyncIterator[KubeflowHarness]:
    """The backend (as the deploy/kubernetes ServiceAccount) on the real kube-apiserver."""
    server, cluster = real_kube_env
    h = KubeflowHarness(server, cluster, GateMode.KUEUE)
    try:
        yield h
    finally:
        await h.cleanup()


async def running(harness: KubeflowHarness, job: str, **options: str) -> ObjectRef:
    """Start a sleeping TrainJob for ``job``, open its gate and wait until it runs."""
    launch_spec = harness.spec(Program.SLEEP, options=options)
    ref = await harness.backend.start(make_launch(job, launch_spec))
    harness.started.append(ref)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    return ref


async def step(fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Run a simulator scenario step off the event loop."""
    await asyncio.to_thread(fn, *args, **kwargs)


def name_of(ref: ObjectRef) -> str:
    return ref.id.partition("/")[2]


async def ended(harness: KubeflowHarness, job: str, ref: ObjectRef) -> ObservedObject:
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    return observed


async def test_success_is_cause_none_with_the_jobset_words(harness: KubeflowHarness) -> None:
    # facts B1: TrainJob Complete copies JobSet Completed / AllJobsCompleted.
    job = new_job_id()
    ref = await running(harness, job)
    await step(harness.cluster.succeed, NS, name_of(ref))
    observed = await ended(harness, job, ref)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.NONE
    assert "TrainJob " + name_of(ref) + " Complete (AllJobsCompleted)" in observed.cause.detail


async def test_exit_1_is_non_zero_exit_with_the_code_and_every_word(
    harness: KubeflowHarness,
) -> None:
    # facts B1-B3: the pod exits 1; Job Failed BackoffLimitExceeded; JobSet/TrainJob FailedJobs.
    job = new_job_id()
    ref = await running(harness, job)
    await step(harness.cluster.fail, NS, name_of(ref), exit_code=1, index=1)
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert (cause.kind, cause.exit_code, cause.provenance) == (
        CauseKind.NON_ZERO_EXIT,
        1,
        Provenance.APPLICATION,
    )
    detail = cause.detail
    assert "Failed (FailedJobs): jobset failed due to one or more job failures" in detail
    assert "Failed (BackoffLimitExceeded): Job has reached the specified backoff limit" in detail
    # the pod that failed on its own, not the one the Job controller then killed (143)
    assert "-node-0-1-" in detail
    assert "terminated (Error), exit code 1" in detail
    assert "exit code 143" not in detail


async def test_oom_killed_is_out_of_memory(harness: KubeflowHarness) -> None:
    # facts B3: container terminated reason OOMKilled, exitCode 137.
    job = new_job_id()
    ref = await running(harness, job)
    await step(harness.cluster.oom_kill, NS, name_of(ref))
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert (cause.kind, cause.exit_code) == (CauseKind.OUT_OF_MEMORY, 137)
    assert "terminated (OOMKilled), exit code 137" in cause.detail


async def test_deadline_is_time_limit(harness: KubeflowHarness) -> None:
    # facts B1: activeDeadlineSeconds -> Failed DeadlineExceeded, JobSet deleted.
    job = new_job_id()
    ref = await running(harness, job, time="0:30")
    tj = harness.trainjob(ref)
    assert tj is not None
    assert tj["spec"]["activeDeadlineSeconds"] == 30
    await step(harness.cluster.exceed_deadline, NS, name_of(ref))
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.TIME_LIMIT
    assert "Failed (DeadlineExceeded): TrainJob exceeded its active deadline" in cause.detail


async def test_scheduler_preemption_is_read_from_a_pod_that_is_gone(
    harness: KubeflowHarness,
) -> None:
    # facts B3: DisruptionTarget PreemptionByScheduler; the pod is deleted before the TrainJob
    # fails, so only the pod watch saw the reason.
    job = new_job_id()
    ref = await running(harness, job)
    await step(harness.cluster.preempt_by_scheduler, NS, name_of(ref))
    assert all("-node-0-0-" not in p["metadata"]["name"] for p in harness.pods(ref))
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.PREEMPTED
    assert (
        "DisruptionTarget (PreemptionByScheduler): default-scheduler: preempting to accommodate "
        "a higher priority pod"
    ) in cause.detail
    assert "FailedJobs" in cause.detail


@pytest.mark.parametrize(
    ("disruption_condition", "gone", "kind"),
    [
        (True, False, CauseKind.PREEMPTED),
        (False, False, CauseKind.PREEMPTED),
        (True, True, CauseKind.NODE_LOST),
        (False, True, CauseKind.NODE_LOST),
    ],
    ids=[
        "disruption-target-node-shutting-down",
        "status-reason-only-node-shutting-down",
        "disruption-target-node-gone",
        "status-reason-only-node-gone",
    ],
)
async def test_a_graceful_node_shutdown_is_preempted_or_node_lost(
    harness: KubeflowHarness, disruption_condition: bool, gone: bool, kind: CauseKind
) -> None:
    # Issue 15 / kubeflow/trainer#1570: the kubelet's shutdown manager fails the pods of a
    # node being shut down (status reason Terminated, "Pod was terminated in response to
    # imminent node shutdown.", exit 143; DisruptionTarget TerminationByKubelet where the
    # kubelet has PodDisruptionConditions). While the node is being shut down that is a spot
    # node reclaimed: preempted; once the node is gone: node-lost. Never non-zero-exit 143.
    job = new_job_id()
    ref = await running(harness, job)
    node = sorted(harness.cluster.nodes_of(NS, name_of(ref)))[0]
    await step(
        harness.cluster.shut_down_node, node, disruption_condition=disruption_condition, gone=gone
    )
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert (cause.kind, cause.exit_code, cause.provenance) == (kind, None, Provenance.SCHEDULER)
    assert "Pod was terminated in response to imminent node shutdown." in cause.detail
    if disruption_condition:
        assert "DisruptionTarget (TerminationByKubelet)" in cause.detail
    else:
        assert "(Terminated): Pod was terminated" in cause.detail
    if gone:
        assert f"node {node} no longer exists" in cause.detail
    else:
        assert f"node {node} Ready=False (KubeletNotReady): node is shutting down" in cause.detail
    assert "FailedJobs" in cause.detail  # the TrainJob's own words come first


async def test_kueue_eviction_without_pod_reasons_is_preempted_and_never_readmitted(
    harness: KubeflowHarness,
) -> None:
    # facts B4: Workload Evicted (Preempted) + Preempted (InClusterQueue); the TrainJob is
    # suspended and its pods go without any pod-level reason.
    job = new_job_id()
    ref = await running(harness, job)
    await step(harness.cluster.kueue_evict, NS, name_of(ref))
    observed = await ended(harness, job, ref)
    cause = observed.cause
    assert cause is not None
    assert cause.kind is CauseKind.PREEMPTED
    assert "Evicted (Preempted): Preempted to accommodate a workload" in cause.detail
    assert "Preempted (InClusterQueue)" in cause.detail
    assert "DisruptionTarget" not in cause.detail
    workload = harness.cluster.workload(NS, name_of(ref))
    assert workload is not None
    assert workload["spec"]["active"] is False, "the evicted Workload must be deactivated"
    tj = harness.trainjob(ref)
    assert tj is not None
    recorded = decode_observed(tj["metadata"]["annotations"][ANNOTATION_OBSERVED])
    assert recorded is not None
    assert recorded.ended == cause
    assert recorded.evicted


async def test_an_unmapped_reason_is_unknown_with_the_words_kept(harness: KubeflowHarness) -> None:
    # facts B1: the Trainer copies the JobSet's reason and message verbatim; a newer JobSet's
    # reason nobody mapped is unknown, never a guess.
    job = new_job_id()
    ref = await running(harness, job)
    await step(
        harness.cluster.fail_with_reason,
        NS,
        name_of(ref),
        reason="GangSchedulingTimeout",
        message="jobset could not be gang-scheduled within 600s",
    )
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.UNKNOWN
    assert (
        "Failed (GangSchedulingTimeout): jobset could not be gang-scheduled within 600s"
        in cause.detail
    )
    assert "no pod disruption, node loss or failing container termination was seen" in cause.detail


async def test_the_first_end_is_kept_when_the_trainer_revives_the_trainjob(
    harness: KubeflowHarness,
) -> None:
    # facts B1: up to v2.3.0 the Trainer clears Failed when the JobSet goes and re-creates it
    # (#3779). The first end stays, is persisted on the object, and the revived TrainJob is
    # suspended; a fresh backend (a restarted observer) reads the same answer.
    job = new_job_id()
    ref = await running(harness, job)
    await step(harness.cluster.fail, NS, name_of(ref), exit_code=2)
    first = (await ended(harness, job, ref)).cause
    assert first is not None
    assert first.exit_code == 2
    await step(harness.cluster.expire_finished_jobset, NS, name_of(ref))

    async def suspended() -> None:
        again = await harness.find(job, ref)
        assert again is not None
        assert (again.phase, again.cause) == (ObjectPhase.ENDED, first)
        tj = harness.trainjob(ref)
        assert tj is not None
        assert tj["spec"]["suspend"] is True, "the revived TrainJob must be suspended"
        assert not [p for p in harness.pods(ref) if p["status"].get("phase") == "Running"]

    await assert_eventually(suspended, timeout_s=30)
    fresh = KubeflowHarness(harness.server, harness.cluster, GateMode.KUEUE)
    try:
        observed = await fresh.find(job, ref)
        assert observed is not None
        assert (observed.phase, observed.cause) == (ObjectPhase.ENDED, first)
    finally:
        await fresh.cleanup()


async def test_suspend_mode_someone_elses_suspend_is_admin_held(
    real_kube_env: tuple[RealKube, ClusterSimulator],
) -> None:
    server, cluster = real_kube_env
    harness = KubeflowHarness(server, cluster, GateMode.SUSPEND)
    try:
        job = new_job_id()
        ref = await running(harness, job)
        await asyncio.to_thread(
            server.store.patch, TRAINJOBS, NS, name_of(ref), "merge", {"spec": {"suspend": True}}
        )
        observed = await harness.wait_phase(job, ref, ObjectPhase.PENDING)
        assert observed.gate is GateState.ADMIN_HELD
        assert observed.cause is not None
        assert observed.cause.detail == "spec.suspend: true (dispatch.dev/gate: open)"
    finally:
        await harness.cleanup()


async def test_a_second_start_of_a_launch_returns_its_trainjob_pending_or_ended(
    harness: KubeflowHarness,
) -> None:
    # Issue 15, "Launches survive the launcher": the TrainJob's name is deterministic per
    # launch, so a start a restarted supervisor repeats finds the one the first start made
    # (declared: idempotent_start), pending or ended, and never makes a second.
    assert harness.backend.declarations().idempotent_start
    job = new_job_id()
    launch = make_launch(job, harness.spec(Program.SLEEP))
    ref = await harness.backend.start(launch)
    harness.started.append(ref)
    assert await harness.backend.start(launch) == ref
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    await step(harness.cluster.succeed, NS, name_of(ref))
    await ended(harness, job, ref)
    assert await harness.backend.start(launch) == ref
    shown = (await harness.discover()).objects[job]
    assert [o.ref for o in shown] == [ref]
    assert shown[0].phase is ObjectPhase.ENDED

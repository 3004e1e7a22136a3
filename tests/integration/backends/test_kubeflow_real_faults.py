"""Faults on the real kube-apiserver 1.20.2 (the lane): the watch dropped on the wire (all at
once, or the pod watch alone at an exact event after failed reconnects), 410 Expired produced
for real by etcd compaction, evidence lost in that gap, someone else's gate (added later, or by
a site's mutating admission webhook at creation), a foreign TrainJob never written to. The
backend runs as the deploy/kubernetes ServiceAccount through the lane's HTTP proxy
(``tests/servers/kube_proxy.py``: connections cut or refused, requests answered 500, a watch
cut after N events, every request recorded); the simulator writes through the server
directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatch_backends.kubeflow import ForeignObjectError, GateMode
from dispatch_backends.kubeflow.names import ADMISSION_GATED_BY, ANNOTATION_OBSERVED
from dispatch_backends.kubeflow.watch import Reflector
from dispatch_core.state import CauseKind, GateState, ObjectPhase, ObjectRef, ObservedObject
from tests.contract.backend_contract import Program, new_job_id
from tests.fakes.kube_controller import ClusterSimulator
from tests.integration.backends.test_kubeflow_scenarios import ended, name_of, running, step
from tests.integration.backends.test_kubeflow_support import NS, KubeflowHarness, real_kube_env
from tests.servers.kube_lane import RealKube
from tests.servers.kube_resources import TRAINJOBS, JsonObject
from tests.servers.kube_webhook import SiteWebhook
from tests.util import assert_eventually

__all__ = ["real_kube_env"]

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(
    real_kube_env: tuple[RealKube, ClusterSimulator],
) -> AsyncIterator[KubeflowHarness]:
    server, cluster = real_kube_env
    h = KubeflowHarness(server, cluster, GateMode.KUEUE)
    try:
        yield h
    finally:
        await h.cleanup()


async def test_a_watch_cut_on_the_wire_resumes_from_its_resource_version(
    harness: KubeflowHarness,
) -> None:
    job = new_job_id()
    ref = await running(harness, job)
    pods: Reflector[Any] = harness.backend._reflectors[("pods", NS)]
    lists, watches = pods.lists, pods.watches
    proxy = harness.server.proxy
    with proxy.refusing():  # every open watch is cut; reconnecting fails meanwhile
        await step(harness.cluster.preempt_by_scheduler, NS, name_of(ref))

        def retried() -> None:
            assert pods.error is not None, "the pod watch did not notice the cut"

        await assert_eventually(retried, timeout_s=30)
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.PREEMPTED, cause
    assert pods.lists == lists, "a dropped watch resumes from its resourceVersion; no relist"
    assert pods.watches > watches


async def test_410_from_etcd_compaction_relists_and_the_backend_goes_on(
    harness: KubeflowHarness,
) -> None:
    job = new_job_id()
    ref = await running(harness, job)
    pods: Reflector[Any] = harness.backend._reflectors[("pods", NS)]
    lists = pods.lists
    await asyncio.to_thread(harness.server.expire_watch_cache)

    def relisted() -> None:
        assert pods.lists > lists

    await assert_eventually(relisted, timeout_s=60)
    await step(harness.cluster.oom_kill, NS, name_of(ref))
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.OUT_OF_MEMORY


async def test_evidence_lost_in_a_real_410_gap_is_unknown_never_a_guess(
    harness: KubeflowHarness,
) -> None:
    # While the backend can't reach the server, the preempted pod comes and goes and etcd is
    # compacted: the resumed watch gets 410, the relist no longer shows the pod, so its
    # reason was never seen. The cause says so; it is neither 143 nor a guessed preemption.
    job = new_job_id()
    ref = await running(harness, job)
    env = harness.server
    with env.proxy.refusing():
        await step(harness.cluster.preempt_by_scheduler, NS, name_of(ref))
        await asyncio.to_thread(env.lab.compact)
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.UNKNOWN, cause
    assert "FailedJobs" in cause.detail
    assert "expired (410)" in cause.detail


async def test_someone_elses_gate_keeps_it_held_and_only_ours_is_removed(
    harness: KubeflowHarness,
) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    store = harness.server.store
    ours = store.get(TRAINJOBS, NS, name_of(ref))["metadata"]["annotations"][ADMISSION_GATED_BY]
    await asyncio.to_thread(
        store.patch,
        TRAINJOBS,
        NS,
        name_of(ref),
        "merge",
        {"metadata": {"annotations": {ADMISSION_GATED_BY: f"{ours},site.example/audit"}}},
    )
    await harness.backend.open_gate(ref)

    def held(observed: ObservedObject) -> None:
        assert observed.phase is ObjectPhase.PENDING, observed
        assert observed.gate is GateState.ADMIN_HELD, observed
        assert observed.cause is not None
        assert observed.cause.kind is CauseKind.HELD
        assert "site.example/audit" in observed.cause.detail

    await harness.wait_for(job, ref, held)
    tj = store.get(TRAINJOBS, NS, name_of(ref))
    assert tj["metadata"]["annotations"][ADMISSION_GATED_BY] == "site.example/audit"
    assert await harness.execution_env(ref) is None, "it ran while someone else's gate held it"
    await asyncio.to_thread(
        store.patch,
        TRAINJOBS,
        NS,
        name_of(ref),
        "json",
        [{"op": "remove", "path": "/metadata/annotations/kueue.x-k8s.io~1admission-gated-by"}],
    )
    observed = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    assert observed.gate is GateState.OPEN


async def test_a_foreign_trainjob_is_reported_and_never_touched(harness: KubeflowHarness) -> None:
    job = new_job_id()
    await harness.inject_foreign(job)
    name = f"dj-{job}"
    ref = ObjectRef(cluster=harness.backend.cluster, id=f"{NS}/{name}")
    store = harness.server.store
    await asyncio.to_thread(store.patch, TRAINJOBS, NS, name, "merge", {"spec": {"suspend": False}})
    await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    await step(harness.cluster.fail, NS, name, exit_code=1)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.foreign
    before = store.get(TRAINJOBS, NS, name)
    for call in (harness.backend.stop, harness.backend.open_gate, harness.backend.emergency_stop):
        with pytest.raises(ForeignObjectError):
            await call(ref)
    await harness.discover()
    after = store.get(TRAINJOBS, NS, name)
    assert not after["metadata"].get("deletionTimestamp"), "a foreign TrainJob was deleted"
    assert ANNOTATION_OBSERVED not in (after["metadata"].get("annotations") or {})
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["spec"] == before["spec"]
    writes = [
        r
        for r in harness.server.proxy.requests
        if r.method in ("POST", "PUT", "PATCH", "DELETE") and name in r.path
    ]
    assert writes == [], f"dispatch wrote to a foreign TrainJob: {writes}"


async def test_the_pod_watch_failing_then_cut_after_one_event_loses_no_evidence(
    harness: KubeflowHarness,
) -> None:
    # The open pod watch is cut abruptly; reopening it is answered 500 three times (the
    # backend backs off about 1.7 s), so the preemption happens while no pod watch is open;
    # the first pod watch that opens again is cut abruptly after one event. Everything must
    # come through by resuming from the last resourceVersion seen, without a relist.
    job = new_job_id()
    ref = await running(harness, job)
    pods: Reflector[Any] = harness.backend._reflectors[("pods", NS)]
    lists, watches = pods.lists, pods.watches
    proxy = harness.server.proxy
    proxy.drop_next_watch(after_events=1, abrupt=True, path_contains="/pods")
    proxy.fail_next(3, status=500, path_contains="/pods", watch=True)

    def cut() -> None:  # the pod watch is renewed every watch_timeout_s: cut an open one
        assert proxy.drop_watches(abrupt=True, path_contains="/pods") == 1

    await assert_eventually(cut, timeout_s=30)

    def pod_watch_down() -> None:
        assert proxy.active_watches("/pods") == 0

    await assert_eventually(pod_watch_down, timeout_s=10)
    await step(harness.cluster.preempt_by_scheduler, NS, name_of(ref))
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.PREEMPTED, cause
    assert pods.lists == lists, "a dropped watch resumes; it must not relist"
    # reopened after the 500s, then again after the cut at its first event
    assert pods.watches >= watches + 2, "the pod watch was not reopened"
    failed = [r for r in proxy.requests if r.injected and "/pods" in r.path]
    assert len(failed) == 3, failed
    assert proxy.watches_dropped == 2, "the open pod watch, then the first reopened one"


async def test_evidence_lost_while_only_the_pod_watch_fails_is_unknown(
    harness: KubeflowHarness,
) -> None:
    # Only the pod watch can't reconnect (500s; the TrainJob, JobSet and Job watches run on)
    # while the preempted pod comes and goes, and etcd is compacted past it: the resumed pod
    # watch gets a real 410, the relist no longer shows the pod, so its reason was never seen.
    # The cause is unknown, saying so, not non-zero-exit (143) nor a guessed preemption.
    job = new_job_id()
    ref = await running(harness, job)
    env = harness.server
    env.proxy.fail_next(10**6, status=500, path_contains="/pods", watch=True)
    env.drop_watches(path_contains="/pods")

    def pod_watch_down() -> None:
        assert env.proxy.active_watches("/pods") == 0

    await assert_eventually(pod_watch_down, timeout_s=10)
    await step(harness.cluster.preempt_by_scheduler, NS, name_of(ref))
    await asyncio.to_thread(env.move_etcd_on_and_compact)
    env.proxy.clear()
    cause = (await ended(harness, job, ref)).cause
    assert cause is not None
    assert cause.kind is CauseKind.UNKNOWN, cause
    assert "FailedJobs" in cause.detail
    assert "expired (410)" in cause.detail


async def test_a_sites_webhook_gate_at_creation_is_admin_held(harness: KubeflowHarness) -> None:
    # facts B4: admission-gated-by is set at creation, here by a site's mutating admission
    # webhook that adds its own gate on the real server; dispatch removes only its own, and
    # the other keeps the TrainJob held until the site lifts it.
    env = harness.server

    def site_gate(operation: str, obj: JsonObject, old: JsonObject | None) -> list[JsonObject]:
        annotations = dict(obj["metadata"].get("annotations") or {})
        gates = annotations.get(ADMISSION_GATED_BY, "")
        annotations[ADMISSION_GATED_BY] = ",".join(filter(None, [gates, "site.example/audit"]))
        return [{"op": "add", "path": "/metadata/annotations", "value": annotations}]

    job = new_job_id()
    with SiteWebhook(env.lab, NS, TRAINJOBS, site_gate) as hook:
        ref = await harness.start(job, Program.SLEEP)
        assert [r["name"] for r in hook.reviews] == [name_of(ref)]

    def held(observed: ObservedObject) -> None:
        assert observed.phase is ObjectPhase.PENDING, observed
        assert observed.gate is GateState.ADMIN_HELD, observed
        assert observed.cause is not None
        assert observed.cause.kind is CauseKind.HELD
        assert "site.example/audit" in observed.cause.detail

    await harness.wait_for(job, ref, held)
    await harness.backend.open_gate(ref)
    store = env.store
    tj = store.get(TRAINJOBS, NS, name_of(ref))
    assert tj["metadata"]["annotations"][ADMISSION_GATED_BY] == "site.example/audit"
    await harness.wait_for(job, ref, held)
    assert await harness.execution_env(ref) is None, "it ran while someone else's gate held it"
    await asyncio.to_thread(
        store.patch,
        TRAINJOBS,
        NS,
        name_of(ref),
        "json",
        [{"op": "remove", "path": "/metadata/annotations/" + _escaped(ADMISSION_GATED_BY)}],
    )
    observed = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    assert observed.gate is GateState.OPEN


def _escaped(key: str) -> str:
    """``key`` as one JSON-pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")

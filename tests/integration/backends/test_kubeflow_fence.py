"""The kubeflow backend under the real planner: the node-loss fence, Kueue preemption and
resubmission, native JobSet restarts, the cessation signal and the emergency stop.

A small supervisor loop (:class:`Supervisor`) plans each pass with ``dispatch_core.next_steps``
on what :meth:`KubeflowBackend.discover` shows and carries it out on the backend, against the
real kube-apiserver 1.20.2 of the lane (the backend as the deploy/kubernetes ServiceAccount)
and the cluster simulator writing through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from dispatch_backends import CessationAnswer
from dispatch_backends.kubeflow import GateMode
from dispatch_backends.kubeflow.names import LABEL_SUBMISSION
from dispatch_core.epoch import epoch
from dispatch_core.events import (
    ExecutionEnded,
    NodeLossObserved,
    OutcomeCommitted,
    SubmissionOpened,
)
from dispatch_core.state import (
    Action,
    CauseKind,
    ObjectPhase,
    ObjectRef,
    RecoveryRule,
    State,
)
from dispatch_core.steps import Commit, Launch, OpenGate, Pass, Stop
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.integration.backends.test_kubeflow_support import (
    NS,
    KubeflowHarness,
    Supervisor,
    container_env,
    real_simulated,
)
from tests.servers.kube import KubeApiServer
from tests.servers.kube_resources import NODES, TRAINJOBS
from tests.util import assert_eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def simulated(kube_lab: KubeApiServer, kube_dispatch_token: str) -> Callable[..., Any]:
    """The real kube-apiserver of the lane with the simulator (``options`` for it) writing
    through it; the backend runs as the deploy/kubernetes ServiceAccount."""

    def make(**options: Any) -> Any:
        return real_simulated(kube_lab, token=kube_dispatch_token, **options)

    return make


WINDOW_S = 2.0


def name_of(ref: ObjectRef) -> str:
    return ref.id.partition("/")[2]


def committed(the_pass: Pass, kind: type[Any]) -> list[Any]:
    return [s.event for s in the_pass.steps if isinstance(s, Commit) and isinstance(s.event, kind)]


async def until(
    sup: Supervisor, check: Callable[[Pass], bool], *, passes: int = 200, interval_s: float = 0.1
) -> Pass:
    """Run passes until ``check`` holds for one; return it."""
    for _ in range(passes):
        the_pass = await sup.step()
        if check(the_pass):
            return the_pass
        await asyncio.sleep(interval_s)
    raise AssertionError(f"no pass satisfied the check in {passes} passes")


async def to_running(sup: Supervisor) -> ObjectRef:
    """Pass until the current submission's TrainJob runs; return its ref."""

    def runs(_: Pass) -> bool:
        obj = sup.current()
        return obj is not None and obj.phase is ObjectPhase.RUNNING

    await until(sup, runs)
    obj = sup.current()
    assert obj is not None
    return obj.ref


@pytest.mark.parametrize("release", [False, True], ids=["held-until-node-returns", "released"])
async def test_node_lost_past_the_window_is_fenced_and_the_replacement_waits(
    release: bool, simulated: Callable[..., Any]
) -> None:
    # facts B5: the taint manager deletes the pods, no kubelet confirms, the Job gets
    # FailureTarget but never Failed, and the TrainJob never ends. The backend reports it
    # running with node-lost; past the window the planner stops it and resubmits, and the
    # replacement's gate opens only once the old TrainJob is gone.
    with simulated() as (server, cluster):
        harness = KubeflowHarness(
            server,
            cluster,
            GateMode.KUEUE,
            node_loss_window_s=WINDOW_S,
            release_lost_pods=release,
        )
        try:
            job = new_job_id("fence")
            rule = RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1)
            sup = Supervisor(harness, job, harness.spec(Program.SLEEP), rule)
            old = await to_running(sup)
            node = cluster.nodes_of(NS, name_of(old))[0]
            await asyncio.to_thread(cluster.lose_node, node)

            seen = await until(sup, lambda p: bool(committed(p, NodeLossObserved)))
            obj = sup.current()
            assert obj is not None
            assert obj.phase is ObjectPhase.RUNNING, "a TrainJob on a lost node stays running"
            assert obj.cause is not None
            assert obj.cause.kind is CauseKind.NODE_LOST
            assert obj.cause.at is not None
            assert f"node {node} Ready=Unknown (NodeStatusUnknown)" in obj.cause.detail
            assert "DeletionByTaintManager" in obj.cause.detail
            assert committed(seen, NodeLossObserved)[0].since == obj.cause.at

            fence = await until(
                sup, lambda p: any(isinstance(s, Stop) for s in p.steps), interval_s=0.25
            )
            stop = next(s for s in fence.steps if isinstance(s, Stop))
            assert (stop.ref, stop.intent.why) == (old, "fence")
            ended = committed(fence, ExecutionEnded)
            assert ended
            assert ended[0].fenced
            assert ended[0].cause.kind is CauseKind.NODE_LOST
            assert committed(fence, SubmissionOpened)[0].submission == 2
            launched = next(s for s in fence.steps if isinstance(s, Launch))
            assert node in launched.exclude_nodes

            new_name = f"dj-{job}-2-1"
            if not release:
                # The old TrainJob can't go: its pod waits for a kubelet that is gone.
                for _ in range(10):
                    the_pass = await sup.step()
                    assert not any(isinstance(s, OpenGate) for s in the_pass.steps), (
                        "the replacement's gate opened while the old TrainJob still exists"
                    )
                    assert sup.snapshot is not None
                    old_obj = next(o for o in sup.snapshot.objects[job] if o.ref == old)
                    assert old_obj.phase is ObjectPhase.STOPPING
                    await asyncio.sleep(0.1)
                assert server.store.find(TRAINJOBS, NS, name_of(old)) is not None
                answer = await harness.backend.cessation(old, (node,))
                assert not answer.ceased
                await asyncio.to_thread(cluster.restore_node, node)

            opened = await until(sup, lambda p: any(isinstance(s, OpenGate) for s in p.steps))
            assert server.store.find(TRAINJOBS, NS, name_of(old)) is None, (
                "the gate opened before the old TrainJob was gone"
            )
            assert [s.ref for s in opened.steps if isinstance(s, OpenGate)] == [
                ObjectRef(cluster=harness.backend.cluster, id=f"{NS}/{new_name}")
            ]
            if release:
                # released by dispatch's stop while the node is still lost
                lost = server.store.get(NODES, None, node)
                ready = next(c for c in lost["status"]["conditions"] if c["type"] == "Ready")
                assert ready["status"] == "Unknown"
            new = await to_running(sup)
            await asyncio.to_thread(cluster.succeed, NS, name_of(new))
            done = await until(sup, lambda p: bool(committed(p, OutcomeCommitted)))
            assert committed(done, OutcomeCommitted)[0].state is State.SUCCEEDED
        finally:
            await harness.cleanup()


async def test_kueue_preemption_is_resubmitted_with_a_higher_epoch_and_succeeds(
    simulated: Callable[..., Any],
) -> None:
    with simulated() as (server, cluster):
        harness = KubeflowHarness(server, cluster, GateMode.KUEUE)
        try:
            job = new_job_id("kq")
            rule = RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2)
            sup = Supervisor(harness, job, harness.spec(Program.SLEEP, checkpoint="/ckpt"), rule)
            first = await to_running(sup)
            env1 = await harness.wait_env(first)
            await asyncio.to_thread(cluster.kueue_evict, NS, name_of(first))
            recovered = await until(sup, lambda p: bool(committed(p, SubmissionOpened)))
            ended = committed(recovered, ExecutionEnded)[0]
            assert ended.cause.kind is CauseKind.PREEMPTED
            assert "Evicted (Preempted)" in ended.cause.detail
            second = await to_running(sup)
            assert second != first
            env2 = await harness.wait_env(second)
            assert int(env2["DISPATCH_EPOCH"]) > int(env1["DISPATCH_EPOCH"])
            assert env2["DISPATCH_EPOCH"] == str(epoch(0, 2, 0))
            assert env2["DISPATCH_ATTEMPT"] != env1["DISPATCH_ATTEMPT"]
            # the evicted TrainJob is never admitted again (its Workload is deactivated)
            workload = cluster.workload(NS, name_of(first))
            assert workload is not None
            assert workload["spec"]["active"] is False
            await asyncio.to_thread(cluster.succeed, NS, name_of(second))
            done = await until(sup, lambda p: bool(committed(p, OutcomeCommitted)))
            assert committed(done, OutcomeCommitted)[0].state is State.SUCCEEDED
            labels = cluster.trainjob(NS, name_of(second))["metadata"]["labels"]
            assert labels[LABEL_SUBMISSION] == "2"
        finally:
            await harness.cleanup()


async def test_jobset_restarts_are_executions_with_their_own_attempt(
    simulated: Callable[..., Any],
) -> None:
    # facts B2: a JobSet restart recreates the Jobs with restart-attempt R+1; R is the
    # backend's restart count, and each execution gets its own DISPATCH_ATTEMPT.
    with simulated(max_restarts=1) as (server, cluster):
        harness = KubeflowHarness(server, cluster, GateMode.SUSPEND)
        try:
            job = new_job_id("rs")
            ref = await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
            harness.started.append(ref)
            await harness.backend.open_gate(ref)
            await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
            env0 = await harness.wait_env(ref)
            await asyncio.to_thread(cluster.fail, NS, name_of(ref), exit_code=4)

            def restarted(observed: Any) -> None:
                assert observed.restarts == 1, observed
                assert observed.phase is ObjectPhase.RUNNING, observed
                assert [e.restart for e in observed.executions] == [0], observed

            observed = await harness.wait_for(job, ref, restarted)
            cause = observed.executions[0].cause
            assert (cause.kind, cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 4)
            assert "restarted" in cause.detail
            pods = [
                p
                for p in harness.pods(ref)
                if p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
            ]
            env1 = {k: v for k, v in container_env(pods[0]).items() if k.startswith("DISPATCH_")}
            assert (env0["DISPATCH_RESTART"], env1["DISPATCH_RESTART"]) == ("0", "1")
            assert env0["DISPATCH_ATTEMPT"].endswith("-r0")
            assert env1["DISPATCH_ATTEMPT"] == env0["DISPATCH_ATTEMPT"][:-1] + "1"
            # the documented limit: DISPATCH_EPOCH is R=0's; epoch(G, N, R) = it + R
            assert int(env1["DISPATCH_EPOCH"]) + int(env1["DISPATCH_RESTART"]) == epoch(0, 1, 1)
            await asyncio.to_thread(cluster.fail, NS, name_of(ref), exit_code=5)
            final = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
            assert final.restarts == 1
            assert final.cause is not None
            assert (final.cause.kind, final.cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 5)
            assert "ReachedMaxRestarts" in final.cause.detail
        finally:
            await harness.cleanup()


async def test_cessation_follows_the_nodes_and_the_pods(simulated: Callable[..., Any]) -> None:
    with simulated() as (server, cluster):
        harness = KubeflowHarness(server, cluster, GateMode.KUEUE, release_lost_pods=False)
        try:
            job = new_job_id("cs")
            ref = await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
            harness.started.append(ref)
            await harness.backend.open_gate(ref)
            observed = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
            nodes = observed.nodes
            answer = await harness.backend.cessation(ref, nodes)
            assert not answer.ceased
            assert "is still there (phase Running)" in answer.detail
            await asyncio.to_thread(cluster.lose_node, nodes[0])
            await harness.backend.stop(ref)
            answer = await harness.backend.cessation(ref, nodes)
            assert not answer.ceased
            await asyncio.to_thread(cluster.delete_node, nodes[0])

            async def gone() -> None:
                assert server.store.find(TRAINJOBS, *ref.id.split("/")) is None

            await assert_eventually(gone, timeout_s=10)

            async def node_gone() -> CessationAnswer:
                # the node watch sees the deletion a moment after the API server made it
                answer = await harness.backend.cessation(ref, nodes)
                assert f"node {nodes[0]} no longer exists" in answer.detail
                return answer

            answer = await assert_eventually(node_gone, timeout_s=10)
            assert not answer.ceased, "a node that is gone may still run the processes"
            other = await harness.backend.cessation(ref, nodes[1:])
            # the backend saw a pod of it on the lost node: still not ceased
            assert not other.ceased
        finally:
            await harness.cleanup()


async def test_cessation_after_a_clean_end_is_ceased(simulated: Callable[..., Any]) -> None:
    with simulated() as (server, cluster):
        harness = KubeflowHarness(server, cluster, GateMode.KUEUE)
        try:
            job = new_job_id("cc")
            ref = await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
            harness.started.append(ref)
            await harness.backend.open_gate(ref)
            observed = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
            await harness.backend.stop(ref)
            await harness.wait_gone_or_ended(job, ref)
            answer = await harness.backend.cessation(ref, observed.nodes)
            assert answer.ceased, answer
        finally:
            await harness.cleanup()


async def test_emergency_stop_releases_pods_on_a_lost_node_at_once(
    simulated: Callable[..., Any],
) -> None:
    with simulated() as (server, cluster):
        harness = KubeflowHarness(server, cluster, GateMode.KUEUE, release_lost_pods=False)
        try:
            job = new_job_id("es")
            ref = await harness.backend.start(make_launch(job, harness.spec(Program.SLEEP)))
            harness.started.append(ref)
            await harness.backend.open_gate(ref)
            observed = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
            await asyncio.to_thread(cluster.lose_node, observed.nodes[0])
            await harness.backend.stop(ref)
            await asyncio.sleep(0.5)
            assert server.store.find(TRAINJOBS, NS, name_of(ref)) is not None, (
                "a normal stop waits for the lost pod (release_lost_pods off)"
            )
            await harness.backend.emergency_stop(ref)
            assert await harness.wait_gone_or_ended(job, ref) is None
        finally:
            await harness.cleanup()

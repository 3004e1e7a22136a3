"""What one TrainJob is for dispatch (phase, gate, executions, memory, housekeeping), from
recorded-looking dicts: the table in ``dispatch_backends.kubeflow.observe``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from dispatch_backends.kubeflow.causes import NodeFacts, PodFacts, parse_time
from dispatch_backends.kubeflow.causes import node_facts as typed_node_facts
from dispatch_backends.kubeflow.causes import pod_facts as typed_pod_facts
from dispatch_backends.kubeflow.names import ADMISSION_GATED_BY, ANNOTATION_OBSERVED
from dispatch_backends.kubeflow.objects import Job, JobSet, Node, Pod, TrainJob, Workload, decode
from dispatch_backends.kubeflow.observe import (
    Housekeeping,
    Observation,
    Observed,
    decode_observed,
    encode_observed,
    merge_observed,
    observe,
)
from dispatch_backends.kubeflow.settings import KubeflowSettings
from dispatch_core.state import Cause, CauseKind, Execution, GateState, ObjectPhase, Provenance
from tests.unit.kubeflow.records import T0, T2, cond, job, jobset, node, pod, trainjob, workload

SETTINGS = KubeflowSettings(queue="lq", retain_ended_s=3600.0)


def node_facts(obj: dict[str, Any]) -> NodeFacts:
    """The facts of a recorded-looking Node (decoded as the watch does)."""
    return typed_node_facts(decode(Node, obj))


NOW = datetime.fromisoformat(T2.replace("Z", "+00:00"))
READY = {"node-a": node_facts(node("node-a")), "node-b": node_facts(node("node-b"))}
GATE = {ADMISSION_GATED_BY: "dispatch.dev/start-gate"}
FAILED = cond(
    "Failed", reason="FailedJobs", message="jobset failed due to one or more job failures"
)


def facts(*pods: dict[str, Any], deleted: bool = False) -> list[PodFacts]:
    return [typed_pod_facts(None, decode(Pod, p), deleted=deleted) for p in pods]


def run(
    tj: dict[str, Any],
    *,
    pods: list[PodFacts] | None = None,
    js: dict[str, Any] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    wl: dict[str, Any] | None = None,
    nodes: dict[str, NodeFacts] = READY,
    memory: Observed | None = None,
    caught_up: bool = True,
    now: datetime = NOW,
) -> Observation:
    return observe(
        decode(TrainJob, tj),
        cluster="c1",
        settings=SETTINGS,
        jobset=None if js is None else decode(JobSet, js),
        jobs=[decode(Job, j) for j in jobs or []],
        pods=pods or [],
        nodes=nodes,
        workload=None if wl is None else decode(Workload, wl),
        memory=memory,
        caught_up=lambda rv: caught_up,
        now=now,
    )


def test_a_gated_trainjob_is_pending_closed() -> None:
    result = run(trainjob(annotations=GATE, suspend=True))
    obs = result.observed
    assert (obs.phase, obs.gate, obs.cause) == (ObjectPhase.PENDING, GateState.CLOSED, None)
    assert (obs.name, obs.submission, obs.attempt) == ("dj-j1", 1, 1)
    assert obs.ref.id == "team-a/dj-j1-1-1"
    assert result.housekeeping == ()


def test_someone_elses_gate_is_admin_held_with_their_words() -> None:
    tj = trainjob(annotations={ADMISSION_GATED_BY: "dispatch.dev/start-gate,site/x"}, suspend=True)
    obs = run(tj).observed
    assert (obs.phase, obs.gate) == (ObjectPhase.PENDING, GateState.ADMIN_HELD)
    assert obs.cause == Cause(
        kind=CauseKind.HELD,
        provenance=Provenance.SCHEDULER,
        detail=f"{ADMISSION_GATED_BY}: dispatch.dev/start-gate,site/x",
    )


def test_running_pods_make_it_running_with_its_nodes() -> None:
    pods = facts(pod(), pod("p1", uid="pod-1", node="node-b"))
    obs = run(trainjob(), pods=pods, js=jobset()).observed
    assert (obs.phase, obs.gate, obs.cause, obs.nodes) == (
        ObjectPhase.RUNNING,
        GateState.OPEN,
        None,
        ("node-a", "node-b"),
    )


def test_admitted_but_no_pod_yet_is_pending() -> None:
    assert run(trainjob(), js=jobset()).observed.phase is ObjectPhase.PENDING
    assert run(trainjob(suspend=True)).observed.phase is ObjectPhase.PENDING  # Kueue quota


def test_a_pod_on_a_lost_node_is_running_with_node_lost_whatever_active_says() -> None:
    # facts B5 + the simulator's note: after eviction jobsStatus[].active is 0 while the
    # TrainJob is neither finished nor suspended; the pod is Terminating, phase Running.
    nodes = {**READY, "node-a": node_facts(node("node-a", "Unknown", at=T0))}
    stuck = facts(pod(deleting=True))
    tj = trainjob()
    tj["status"]["jobsStatus"] = [{"name": "node", "active": 0, "ready": 0}]
    obs = run(tj, pods=stuck, js=jobset(), nodes=nodes).observed
    assert obs.phase is ObjectPhase.RUNNING
    assert obs.cause is not None
    assert (obs.cause.kind, obs.cause.at) == (CauseKind.NODE_LOST, parse_time(T0))
    assert obs.nodes == ("node-a",)


def test_an_end_waits_for_the_evidence_then_is_recorded() -> None:
    tj = trainjob(conditions=[FAILED])
    pods = facts(pod(phase="Failed", terminated={"exitCode": 1, "reason": "Error"}))
    waiting = run(tj, pods=pods, js=jobset(), caught_up=False)
    assert waiting.waiting
    assert waiting.observed.phase is ObjectPhase.STOPPING
    assert waiting.memory.ended is None
    done = run(tj, pods=pods, js=jobset())
    assert done.observed.phase is ObjectPhase.ENDED
    cause = done.observed.cause
    assert cause is not None
    assert (cause.kind, cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 1)
    assert done.memory.ended == cause
    assert done.memory.ended_seen == NOW
    assert done.memory.ended_nodes == ("node-a",)
    assert done.housekeeping == (Housekeeping.RECORD,)


def test_the_recorded_end_wins_over_what_the_trainjob_shows_now() -> None:
    # facts B1 (#3779): the Trainer cleared Failed and re-created the JobSet; the recorded end
    # stays, and the revived TrainJob is to be suspended.
    first = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="first words")
    record = Observed(ended=first, ended_seen=NOW, ended_nodes=("node-a",))
    tj = trainjob(annotations={ANNOTATION_OBSERVED: encode_observed(record)})
    result = run(tj, pods=facts(pod()), js=jobset())
    assert (result.observed.phase, result.observed.cause) == (ObjectPhase.ENDED, first)
    assert result.housekeeping == (Housekeeping.SUSPEND,)
    suspended = run(trainjob(annotations=tj["metadata"]["annotations"], suspend=True))
    assert suspended.housekeeping == ()


def test_an_ended_trainjob_is_deleted_after_the_retention() -> None:
    record = Observed(
        ended=Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER),
        ended_seen=NOW - timedelta(seconds=3600),
    )
    tj = trainjob(
        conditions=[cond("Complete", reason="AllJobsCompleted")],
        annotations={ANNOTATION_OBSERVED: encode_observed(record)},
    )
    assert run(tj).housekeeping == (Housekeeping.DELETE,)
    assert run(tj, now=NOW - timedelta(seconds=1)).housekeeping == ()
    assert (
        run(trainjob(annotations=tj["metadata"]["annotations"], deleting=True)).housekeeping == ()
    )


def test_a_kueue_eviction_ends_it_and_deactivates_the_workload() -> None:
    wl = workload(
        evicted=("Preempted", "Preempted to accommodate a workload"), preempted="InClusterQueue"
    )
    killed = facts(pod(deleting=True), deleted=True)
    result = run(trainjob(suspend=True), pods=killed, js=jobset(), wl=wl)
    assert result.observed.phase is ObjectPhase.ENDED
    cause = result.observed.cause
    assert cause is not None
    assert cause.kind is CauseKind.PREEMPTED
    assert result.memory.evicted
    assert result.housekeeping == (Housekeeping.RECORD, Housekeeping.DEACTIVATE)
    inactive = workload(evicted=("Preempted", "m"), preempted="InClusterQueue", active=False)
    again = run(
        trainjob(suspend=True, annotations={ANNOTATION_OBSERVED: encode_observed(result.memory)}),
        wl=inactive,
    )
    assert again.housekeeping == ()


def test_jobset_restarts_are_recorded_executions() -> None:
    failed0 = facts(pod(phase="Failed", terminated={"exitCode": 3, "reason": "Error"}, restart=0))
    running1 = facts(pod("p1", uid="pod-1", restart=1))
    js = jobset(
        restarts=1,
        conditions=[
            cond("RestartingJobSet", reason="DefaultFailurePolicy", message="jobset is restarting")
        ],
    )
    waiting = run(trainjob(), pods=failed0 + running1, js=js, caught_up=False)
    assert (waiting.observed.phase, waiting.observed.restarts) == (ObjectPhase.STOPPING, 0)
    result = run(trainjob(), pods=failed0 + running1, js=js, jobs=[job(restart=1)])
    obs = result.observed
    assert (obs.phase, obs.restarts) == (ObjectPhase.RUNNING, 1)
    (execution,) = obs.executions
    assert execution.restart == 0
    assert (execution.cause.kind, execution.cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 3)
    assert "RestartingJobSet (DefaultFailurePolicy): jobset is restarting" in execution.cause.detail
    assert execution.nodes == ("node-a",)
    assert result.housekeeping == (Housekeeping.RECORD,)


def test_deleting_is_stopping_and_finished_pods_without_a_condition_are_stopping() -> None:
    assert run(trainjob(deleting=True), pods=facts(pod())).observed.phase is ObjectPhase.STOPPING
    done = facts(pod(phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed"}))
    assert run(trainjob(), pods=done, js=jobset()).observed.phase is ObjectPhase.STOPPING


def test_a_foreign_trainjob_has_no_submission_or_attempt() -> None:
    obs = run(trainjob("dj-j1", submission=None, attempt="x")).observed
    assert obs.foreign
    assert (obs.name, obs.submission, obs.attempt) == ("dj-j1", None, None)


def test_memory_merge_keeps_the_first_record() -> None:
    a = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="a")
    b = Cause(kind=CauseKind.UNKNOWN, provenance=Provenance.SCHEDULER, detail="b")
    persisted = Observed(ended=a, executions=(Execution(restart=0, cause=a),))
    memory = Observed(
        ended=b, executions=(Execution(restart=0, cause=b), Execution(restart=1, cause=b))
    )
    merged = merge_observed(persisted, memory)
    assert merged.ended == a
    assert [(e.restart, e.cause.detail) for e in merged.executions] == [(0, "a"), (1, "b")]
    assert merge_observed(None, None) == Observed()
    assert decode_observed(encode_observed(merged)) == merged
    assert decode_observed("{not json") is None

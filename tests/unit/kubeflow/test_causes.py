"""The cause mapping, from recorded-looking dicts (no server): one test per row of the table
in ``dispatch_backends.kubeflow.causes``, plus the evidence rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dispatch_backends.kubeflow import causes
from dispatch_backends.kubeflow.causes import NodeFacts, PodFacts, lost_nodes, parse_time
from dispatch_backends.kubeflow.objects import Job, Node, Pod, TrainJob, Workload, decode
from dispatch_core.state import Cause, CauseKind, Provenance
from tests.unit.kubeflow.records import T0, T1, T2, cond, job, node, pod, trainjob, workload

# The functions under test take the typed objects the backend decodes from what the API sends;
# these decode the recorded-looking dicts the same way (objects.decode) and call them.


def pod_facts(previous: PodFacts | None, version: dict[str, Any], *, deleted: bool) -> PodFacts:
    return causes.pod_facts(previous, decode(Pod, version), deleted=deleted)


def node_facts(obj: dict[str, Any]) -> NodeFacts:
    return causes.node_facts(decode(Node, obj))


def kueue_eviction(wl: dict[str, Any] | None) -> Cause | None:
    return causes.kueue_eviction(None if wl is None else decode(Workload, wl))


def terminal_cause(
    tj: dict[str, Any],
    pods: Sequence[PodFacts],
    jobs: Sequence[dict[str, Any]],
    nodes: Mapping[str, NodeFacts],
    wl: dict[str, Any] | None = None,
    **kw: Any,
) -> Cause | None:
    typed_jobs = [decode(Job, j) for j in jobs]
    typed_wl = None if wl is None else decode(Workload, wl)
    return causes.terminal_cause(decode(TrainJob, tj), pods, typed_jobs, nodes, typed_wl, **kw)


def execution_cause(
    headline: Sequence[str],
    pods: Sequence[PodFacts],
    jobs: Sequence[dict[str, Any]],
    nodes: Mapping[str, NodeFacts],
    wl: dict[str, Any] | None = None,
    **kw: Any,
) -> Cause:
    typed_jobs = [decode(Job, j) for j in jobs]
    typed_wl = None if wl is None else decode(Workload, wl)
    return causes.execution_cause(headline, pods, typed_jobs, nodes, typed_wl, **kw)


READY = {"node-a": node_facts(node("node-a")), "node-b": node_facts(node("node-b"))}
FAILED_JOBS = cond(
    "Failed",
    reason="FailedJobs",
    message="jobset failed due to one or more job failures (first failed job: dj-j1-1-1-node-0)",
    at=T2,
)
BACKOFF = cond(
    "Failed", reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit"
)


def facts(*versions: dict[str, Any], deleted: bool = False) -> PodFacts:
    """Merge pod versions as the watch delivers them (the last one deleted if asked)."""
    merged: PodFacts | None = None
    for n, version in enumerate(versions):
        merged = pod_facts(merged, version, deleted=deleted and n == len(versions) - 1)
    assert merged is not None
    return merged


def failed(*pods: PodFacts, nodes: dict[str, NodeFacts] = READY, **kw: Any) -> Any:
    return terminal_cause(
        trainjob(conditions=[FAILED_JOBS]), list(pods), [job(conditions=[BACKOFF])], nodes, **kw
    )


# -- pod facts ----------------------------------------------------------------------------------


def test_pod_facts_keep_the_first_disruption_and_termination_and_see_deletion() -> None:
    preempting = cond(
        "DisruptionTarget",
        reason="PreemptionByScheduler",
        message="default-scheduler: preempting to accommodate a higher priority pod",
    )
    running = pod(conditions=[preempting])
    killed = pod(
        deleting=True,
        phase="Failed",
        conditions=[],  # a later version without the condition does not erase it
        terminated={"exitCode": 143, "reason": "Error"},
    )
    merged = facts(running, killed, deleted=True)
    assert merged.disruption is not None
    assert merged.disruption.reason == "PreemptionByScheduler"
    assert merged.disruption.at == parse_time(T1)
    assert merged.termination is not None
    assert merged.termination.deleting, "killed by its deletion: a consequence, not a cause"
    assert (merged.deleted, merged.finished, merged.node, merged.restart) == (
        True,
        True,
        "node-a",
        0,
    )


def test_a_successful_container_is_no_termination() -> None:
    done = facts(pod(phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed"}))
    assert done.termination is None
    assert done.finished


# -- the table ----------------------------------------------------------------------------------


def test_complete_is_none_with_the_jobset_words() -> None:
    tj = trainjob(
        conditions=[
            cond("Complete", reason="AllJobsCompleted", message="jobset completed successfully")
        ]
    )
    cause = terminal_cause(tj, [], [], READY)
    assert cause is not None
    assert cause.kind is CauseKind.NONE
    assert (
        cause.detail
        == "TrainJob dj-j1-1-1 Complete (AllJobsCompleted): jobset completed successfully"
    )


def test_not_finished_is_no_cause() -> None:
    assert terminal_cause(trainjob(), [], [], READY) is None
    assert (
        terminal_cause(trainjob(conditions=[cond("Failed", status="False")]), [], [], READY) is None
    )


@pytest.mark.parametrize(
    ("reason", "message", "kind"),
    [
        ("DeadlineExceeded", "TrainJob exceeded its active deadline", CauseKind.TIME_LIMIT),
        ("TrainingRuntimeNotSupported", "runtime is not supported", CauseKind.LAUNCH_FAILED),
    ],
)
def test_the_trainers_own_failed_reasons(reason: str, message: str, kind: CauseKind) -> None:
    cause = terminal_cause(
        trainjob(conditions=[cond("Failed", reason=reason, message=message)]), [], [], READY
    )
    assert cause is not None
    assert cause.kind is kind
    assert cause.detail == f"TrainJob dj-j1-1-1 Failed ({reason}): {message}"


def test_exit_code_of_the_pod_that_failed_on_its_own() -> None:
    own = facts(pod(phase="Failed", terminated={"exitCode": 1, "reason": "Error"}))
    killed = facts(
        pod("dj-j1-1-1-node-0-1-fghij", uid="pod-1", node="node-b"),
        pod(
            "dj-j1-1-1-node-0-1-fghij",
            uid="pod-1",
            node="node-b",
            deleting=True,
            phase="Failed",
            terminated={"exitCode": 143, "reason": "Error"},
        ),
    )
    cause = failed(killed, own)
    assert (cause.kind, cause.exit_code, cause.provenance) == (
        CauseKind.NON_ZERO_EXIT,
        1,
        Provenance.APPLICATION,
    )
    assert cause.detail == (
        "TrainJob dj-j1-1-1 Failed (FailedJobs): jobset failed due to one or more job failures "
        "(first failed job: dj-j1-1-1-node-0); Job dj-j1-1-1-node-0 Failed "
        "(BackoffLimitExceeded): Job has reached the specified backoff limit; pod "
        "dj-j1-1-1-node-0-0-abcde container node terminated (Error), exit code 1"
    )


def test_oom_killed_is_out_of_memory() -> None:
    oom = facts(pod(phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}))
    cause = failed(oom)
    assert (cause.kind, cause.exit_code, cause.provenance) == (
        CauseKind.OUT_OF_MEMORY,
        137,
        Provenance.SCHEDULER,
    )
    assert cause.detail.endswith("terminated (OOMKilled), exit code 137")


def test_sigkill_without_oom_is_only_an_exit_code() -> None:
    # facts B3: 137 with reason Error is a plain SIGKILL, not an OOM.
    killed = facts(pod(phase="Failed", terminated={"exitCode": 137, "reason": "Error"}))
    assert failed(killed).kind is CauseKind.NON_ZERO_EXIT


@pytest.mark.parametrize(
    ("reason", "message", "kind"),
    [
        (
            "PreemptionByScheduler",
            "default-scheduler: preempting to accommodate a higher priority pod",
            CauseKind.PREEMPTED,
        ),
        (
            "DeletionByTaintManager",
            "Taint manager: deleting due to NoExecute taint",
            CauseKind.NODE_LOST,
        ),
        ("DeletionByPodGC", "PodGC: node no longer exists", CauseKind.NODE_LOST),
        # Node-pressure eviction (kubernetes pkg/kubelet/eviction/helpers.go,
        # nodeLowMessageFmt) stays what it is: no cause the list has.
        (
            "TerminationByKubelet",
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51Mi. ",
            CauseKind.UNKNOWN,
        ),
        ("EvictionByEvictionAPI", "Eviction API: evicting", CauseKind.UNKNOWN),
    ],
)
def test_disruption_reasons(reason: str, message: str, kind: CauseKind) -> None:
    disrupted = facts(
        pod(conditions=[cond("DisruptionTarget", reason=reason, message=message)]),
        pod(
            deleting=True,
            phase="Failed",
            conditions=[cond("DisruptionTarget", reason=reason, message=message)],
            terminated={"exitCode": 143, "reason": "Error"},
        ),
        deleted=True,
    )
    cause = failed(disrupted)
    assert cause.kind is kind
    assert f"pod dj-j1-1-1-node-0-0-abcde DisruptionTarget ({reason}): {message}" in cause.detail
    assert "exit code 143" not in cause.detail


def test_a_pod_left_unfinished_on_a_lost_node_is_node_lost() -> None:
    nodes = {"node-a": node_facts(node("node-a", "Unknown", at=T0))}
    cause = failed(facts(pod()), nodes=nodes)
    assert cause.kind is CauseKind.NODE_LOST
    assert cause.at == parse_time(T0)
    assert (
        "pod dj-j1-1-1-node-0-0-abcde on node node-a Ready=Unknown (NodeStatusUnknown): "
        "Kubelet stopped posting node status."
    ) in cause.detail


def test_a_node_that_is_gone_is_lost() -> None:
    cause = failed(facts(pod(node="node-z")), nodes=READY)
    assert cause.kind is CauseKind.NODE_LOST
    assert "node node-z no longer exists" in cause.detail


def test_a_job_deadline_is_time_limit() -> None:
    deadline = cond(
        "Failed", reason="DeadlineExceeded", message="Job was active longer than specified deadline"
    )
    cause = terminal_cause(
        trainjob(conditions=[FAILED_JOBS]), [], [job(conditions=[deadline])], READY
    )
    assert cause is not None
    assert cause.kind is CauseKind.TIME_LIMIT
    assert "Job dj-j1-1-1-node-0 Failed (DeadlineExceeded)" in cause.detail


def test_unmapped_reason_without_evidence_is_unknown_with_every_word() -> None:
    tj = trainjob(
        conditions=[cond("Failed", reason="SomethingNew", message="a newer JobSet said so")]
    )
    cause = terminal_cause(tj, [], [], READY, missing="nothing seen")
    assert cause is not None
    assert (cause.kind, cause.provenance) == (CauseKind.UNKNOWN, Provenance.SCHEDULER)
    assert (
        cause.detail
        == "TrainJob dj-j1-1-1 Failed (SomethingNew): a newer JobSet said so; nothing seen"
    )


def test_the_earliest_evidence_wins() -> None:
    early = facts(
        pod(phase="Failed", terminated={"exitCode": 2, "reason": "Error", "finishedAt": T0})
    )
    late = facts(
        pod(
            "dj-j1-1-1-node-0-1-fghij",
            uid="pod-1",
            phase="Failed",
            terminated={"exitCode": 137, "reason": "OOMKilled", "finishedAt": T2},
        )
    )
    assert failed(late, early).kind is CauseKind.NON_ZERO_EXIT


def test_same_second_ties_follow_the_table() -> None:
    same = {"finishedAt": T1}
    oom = facts(pod(phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled", **same}))
    exit1 = facts(
        pod(
            "p1", uid="pod-1", phase="Failed", terminated={"exitCode": 1, "reason": "Error", **same}
        )
    )
    assert failed(exit1, oom).kind is CauseKind.OUT_OF_MEMORY
    preempted = facts(
        pod(
            "p2",
            uid="pod-2",
            conditions=[
                cond("DisruptionTarget", reason="PreemptionByScheduler", message="m", at=T1)
            ],
        )
    )
    assert failed(exit1, oom, preempted).kind is CauseKind.PREEMPTED


# -- Kueue --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "preempted", "kind"),
    [
        ("Preempted", "InClusterQueue", CauseKind.PREEMPTED),
        ("Preempted", "InCohortReclamation", CauseKind.PREEMPTED),
        ("NodeFailures", None, CauseKind.NODE_LOST),
        ("PodsReadyTimeout", None, CauseKind.UNKNOWN),
        ("ClusterQueueStopped", None, CauseKind.UNKNOWN),
    ],
)
def test_kueue_eviction_reasons(reason: str, preempted: str | None, kind: CauseKind) -> None:
    message = "Preempted to accommodate a workload (UID: 4c6f6a3e) due to prioritization"
    cause = kueue_eviction(workload(evicted=(reason, message), preempted=preempted))
    assert cause is not None
    assert cause.kind is kind
    assert cause.detail.startswith(
        f"Kueue Workload trainjob-dj-j1-1-1-3f2a1 Evicted ({reason}): {message}"
    )
    if preempted:
        assert f"Preempted ({preempted})" in cause.detail


def test_no_eviction_is_no_kueue_cause() -> None:
    assert kueue_eviction(workload()) is None
    assert kueue_eviction(None) is None


def test_a_kueue_eviction_without_pod_reasons_is_the_execution_cause() -> None:
    # facts B4: Kueue suspends the TrainJob; its pods go without a DisruptionTarget, and the
    # Job controller kills them (143 while deleting): Kueue's reason is the cause.
    killed = facts(
        pod(deleting=True, phase="Failed", terminated={"exitCode": 143, "reason": "Error"}),
        deleted=True,
    )
    wl = workload(
        evicted=("Preempted", "Preempted to accommodate a workload"), preempted="InClusterQueue"
    )
    cause = execution_cause([], [killed], [], READY, wl)
    assert cause.kind is CauseKind.PREEMPTED
    assert "Preempted (InClusterQueue)" in cause.detail


# -- node loss while running ----------------------------------------------------------------------


def test_lost_nodes_of_a_running_trainjob() -> None:
    nodes = {
        "node-a": node_facts(node("node-a", "Unknown", at=T0)),
        "node-b": node_facts(node("node-b")),
    }
    stuck = facts(
        pod(
            deleting=True,
            conditions=[
                cond(
                    "DisruptionTarget",
                    reason="DeletionByTaintManager",
                    message="Taint manager: deleting due to NoExecute taint",
                    at=T2,
                )
            ],
        )
    )
    fine = facts(pod("p1", uid="pod-1", node="node-b"))
    cause, lost = lost_nodes([stuck, fine], nodes)
    assert cause is not None
    assert lost == ("node-a",)
    assert cause.kind is CauseKind.NODE_LOST
    assert cause.at == parse_time(T0), "since the node stopped being Ready"
    assert "node node-a Ready=Unknown (NodeStatusUnknown)" in cause.detail
    assert "DisruptionTarget (DeletionByTaintManager)" in cause.detail


def test_finished_pods_on_a_lost_node_are_not_node_loss() -> None:
    nodes = {"node-a": node_facts(node("node-a", "False"))}
    done = facts(pod(phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed"}))
    assert lost_nodes([done], nodes) == (None, ())
    assert lost_nodes([facts(pod())], READY) == (None, ())


def test_node_facts_words() -> None:
    facts_a = node_facts(node("node-a", "Unknown", at=T1))
    assert not facts_a.is_ready
    assert facts_a.since == parse_time(T1)
    assert facts_a.words() == (
        "node node-a Ready=Unknown (NodeStatusUnknown): Kubelet stopped posting node status."
    )
    assert node_facts({"metadata": {"name": "x"}}).words() == "node x Ready=absent"


# -- graceful node shutdown (issue 15; kubeflow/trainer#1570) -------------------------------------

SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
"""kubernetes/kubernetes pkg/kubelet/nodeshutdown/nodeshutdown_manager.go,
``nodeShutdownMessage`` (with ``nodeShutdownReason`` = ``Terminated``)."""

SHAPES: dict[str, dict[str, Any]] = {
    # A kubelet with PodDisruptionConditions: the condition and the status reason.
    "disruption-target": {
        "reason": "Terminated",
        "message": SHUTDOWN_MESSAGE,
        "conditions": [
            cond("DisruptionTarget", reason="TerminationByKubelet", message=SHUTDOWN_MESSAGE)
        ],
    },
    # A kubelet without the condition: the status reason and message alone, exit 143.
    "status-terminated": {"reason": "Terminated", "message": SHUTDOWN_MESSAGE},
    # Kubernetes 1.20's words (yteraoka/terminated-pod-cleaner records both).
    "status-shutdown": {"reason": "Shutdown", "message": "Node is shutting, evicting pods"},
}

NODE_STATES = {
    # The kubelet's Ready condition while its shutdown manager runs (ShutdownStatus:
    # "node is shutting down", aggregated by the ReadyCondition setter).
    "shutting-down": (
        {
            "node-a": node_facts(
                node("node-a", "False", reason="KubeletNotReady", message="node is shutting down")
            )
        },
        CauseKind.PREEMPTED,
        "node node-a Ready=False (KubeletNotReady): node is shutting down",
    ),
    # Not yet marked: the pods were told before the node's status changed.
    "still-ready": (
        {"node-a": node_facts(node("node-a"))},
        CauseKind.PREEMPTED,
        "node node-a Ready=True (KubeletReady)",
    ),
    "gone": ({}, CauseKind.NODE_LOST, "node node-a no longer exists"),
    "not-ready": (
        {"node-a": node_facts(node("node-a", "Unknown"))},
        CauseKind.NODE_LOST,
        "node node-a Ready=Unknown (NodeStatusUnknown): Kubelet stopped posting node status.",
    ),
}


@pytest.mark.parametrize("state", sorted(NODE_STATES))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_graceful_node_shutdown_is_preempted_or_node_lost_by_the_node(
    shape: str, state: str
) -> None:
    """Both shapes of a pod the kubelet ended for its node's shutdown, with exit 143: never
    the job's own non-zero exit (kubeflow/trainer#1570), nor unknown; ``preempted`` while the
    node is being shut down, ``node-lost`` when it is gone or NotReady; every word kept."""
    nodes, kind, node_words = NODE_STATES[state]
    given = SHAPES[shape]
    shut = facts(
        pod(conditions=given.get("conditions")),
        pod(
            phase="Failed",
            terminated={"exitCode": 143, "reason": "Error"},
            **given,
        ),
    )
    cause = failed(shut, nodes=nodes)
    assert cause.kind is kind, cause
    assert cause.exit_code is None
    assert cause.provenance is Provenance.SCHEDULER
    assert given["message"] in cause.detail
    assert node_words in cause.detail
    assert "exit code 143" in cause.detail  # the container's words are kept, not its cause
    assert cause.detail.startswith("TrainJob dj-j1-1-1 Failed (FailedJobs)")


def test_the_shutdown_comes_before_the_other_pods_exits() -> None:
    """The pod on the node shut down ended first; the other pods' later exits (their peers
    gone) are its consequence."""
    nodes, _, _ = NODE_STATES["shutting-down"]
    nodes = {**nodes, "node-b": node_facts(node("node-b"))}
    shut = facts(
        pod(
            phase="Failed",
            terminated={"exitCode": 143, "reason": "Error"},
            **SHAPES["status-terminated"],
        )
    )
    peer = pod(
        "dj-j1-1-1-node-0-1-fghij",
        uid="pod-1",
        node="node-b",
        phase="Failed",
        terminated={"exitCode": 1, "reason": "Error", "finishedAt": T2},
    )
    cause = failed(shut, facts(peer), nodes=nodes)
    assert cause.kind is CauseKind.PREEMPTED


def test_a_pod_not_finished_on_a_node_being_shut_down_is_preempted() -> None:
    """The node says it is shutting down before its pods are marked: the shutdown of a
    spot node, not a lost one."""
    nodes, _, node_words = NODE_STATES["shutting-down"]
    cause = failed(facts(pod()), nodes=nodes)
    assert cause.kind is CauseKind.PREEMPTED
    assert node_words in cause.detail


def test_a_kubelet_disruption_with_other_words_is_not_a_shutdown() -> None:
    """Only the kubelet's shutdown words make it one: ``Terminated`` with another message,
    or ``TerminationByKubelet`` with an eviction's, is not."""
    other = facts(
        pod(
            phase="Failed",
            terminated={"exitCode": 143, "reason": "Error"},
            reason="Terminated",
            message="something else",
        )
    )
    assert other.node_shutdown() is None
    assert failed(other).kind is CauseKind.NON_ZERO_EXIT


def test_pod_facts_keep_the_first_status_reason() -> None:
    first = pod(phase="Failed", reason="Terminated", message=SHUTDOWN_MESSAGE)
    later = pod(phase="Failed", reason="Other", message="later words")
    merged = facts(first, later)
    assert (merged.reason, merged.message) == ("Terminated", SHUTDOWN_MESSAGE)

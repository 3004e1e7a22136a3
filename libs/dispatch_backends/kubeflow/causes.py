"""From Kubernetes objects to a cause (pure: the typed objects of :mod:`.objects` in,
:class:`Cause` out).

Pods are the evidence that vanishes: a preempted pod is deleted, and with it its
``DisruptionTarget`` condition. So what dispatch keeps of a pod is a :class:`PodFacts`,
merged from every version of the pod the watch delivered (:func:`pod_facts`): the first
disruption seen, the first failing container termination seen (and whether the pod was
already being deleted then), its node. Nodes are summarised as :class:`NodeFacts`.

**The cause table** (each row names its source in ``shared/labs/kubeflow-facts.md``). The
scheduler's words are kept verbatim in ``Cause.detail``: the TrainJob condition's type,
reason and message, the child Job's failed condition, then the evidence chosen.

=========================================================  ===============  ===============
Kubernetes says                                            kind             source
=========================================================  ===============  ===============
TrainJob ``Complete=True``                                 ``none``         B1
TrainJob ``Failed`` reason ``DeadlineExceeded``            ``time-limit``   B1
TrainJob ``Failed`` reason ``TrainingRuntimeNotSupported``  ``launch-failed``  B1
pod ``DisruptionTarget`` ``PreemptionByScheduler``         ``preempted``    B3
pod ``DisruptionTarget`` ``DeletionByTaintManager``        ``node-lost``    B3, B5
pod ``DisruptionTarget`` ``DeletionByPodGC`` (node gone)   ``node-lost``    B3
a graceful node shutdown (below) on a node being shut      ``preempted``    kubelet
down (still Ready, or NotReady saying "node is shutting
down")
a graceful node shutdown on a node gone or NotReady        ``node-lost``    kubelet
for another reason
a pod not finished on a node being shut down               ``preempted``    kubelet
a pod not finished on a node not Ready (or gone)           ``node-lost``    B5
Kueue Workload ``Evicted`` reason ``Preempted`` (with the  ``preempted``    B4
``Preempted`` condition's reason, e.g. ``InClusterQueue``)
Kueue Workload ``Evicted`` reason ``NodeFailures``         ``node-lost``    B4
child Job ``Failed``/``FailureTarget`` ``DeadlineExceeded``  ``time-limit``   B3
container terminated ``OOMKilled`` (exit code kept)        ``out-of-memory``  B3
container terminated with a non-zero exit code, the pod    ``non-zero-exit``  B3
not being deleted (provenance ``application``)
any other disruption reason (``TerminationByKubelet``     ``unknown``      seed 000
for a node-pressure eviction, ``EvictionByEvictionAPI``,
...), any other Kueue eviction reason, any other Failed
reason with no evidence
=========================================================  ===============  ===============

**Graceful node shutdown** (issue 15; kubeflow/trainer#1570 is the same mistake the other way:
the pod of a spot node's graceful shutdown taken for the job's own failure). The kubelet's
shutdown manager (kubernetes/kubernetes ``pkg/kubelet/nodeshutdown/nodeshutdown_manager.go``,
``podManager.killPods``) sets the pods it kills to phase ``Failed`` with ``status.reason``
``Terminated`` and ``status.message`` "Pod was terminated in response to imminent node
shutdown." and adds ``DisruptionTarget`` reason ``TerminationByKubelet`` with the same
message; a kubelet without that condition (before ``PodDisruptionConditions``) leaves only
the status reason and message, and 1.20's said reason ``Shutdown``, "Node is shutting, evicting
pods" (the two shapes ``yteraoka/terminated-pod-cleaner`` records). A pod refused on a node
shutting down gets ``NodeShutdown``, "Pod was rejected as the node is shutting down."
(``NodeShutdownNotAdmittedReason``). The container ends with 143 (SIGTERM), which is the
shutdown's consequence, never the job's exit. Whether it is ``preempted`` or ``node-lost``
depends on the node: being shut down (the kubelet's Ready condition says "node is shutting
down": ``ShutdownStatus`` in ``nodeshutdown_manager_linux.go``, or the node is still Ready) is
a graceful shutdown of a spot or preemptible node, ``preempted``; gone, or NotReady for
another reason, is ``node-lost``. The detail keeps the pod's and the node's words. A
``TerminationByKubelet`` with any other message (node-pressure eviction) stays ``unknown``.

Among several pieces of evidence the earliest wins (the first thing that went wrong; the
rest is usually its consequence: when one pod fails, the Job controller deletes the others
and their containers die with 143). A container terminated *while its pod was being
deleted* is a consequence, never the cause. Same-second ties are broken by the table's
order. Nothing found means ``unknown`` with the words and what was missing: never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

import msgspec

from dispatch_backends.kubeflow.names import (
    JOBSET_NAME_LABEL,
    JOBSET_RESTART_LABEL,
    JOBSET_UID_LABEL,
)
from dispatch_backends.kubeflow.objects import (
    Job,
    Node,
    Pod,
    TrainJob,
    Workload,
    parse_time,
    reason_words,
)
from dispatch_core.state import Cause, CauseKind, Provenance, UtcDatetime

__all__ = [
    "Disruption",
    "NodeFacts",
    "PodFacts",
    "Termination",
    "execution_cause",
    "job_words",
    "kueue_eviction",
    "lost_nodes",
    "node_facts",
    "parse_time",
    "pod_facts",
    "terminal_cause",
]

DISRUPTION_TARGET: Final = "DisruptionTarget"

_PREEMPTED_DISRUPTIONS: Final = frozenset({"PreemptionByScheduler"})
"""facts B3: ``core/v1/types.go:3792``."""
_NODE_LOST_DISRUPTIONS: Final = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})
"""facts B3: taint manager (NoExecute ``unreachable``) and PodGC (node object gone)."""
_NODE_SHUTDOWN_MESSAGES: Final = frozenset(
    {
        "Pod was terminated in response to imminent node shutdown.",
        "Pod was rejected as the node is shutting down.",
        "Node is shutting, evicting pods",
    }
)
"""The kubelet's words for a pod a graceful node shutdown ended (see the module docstring):
``nodeShutdownMessage`` and ``nodeShutdownNotAdmittedMessage`` of
``pkg/kubelet/nodeshutdown/nodeshutdown_manager.go``, and Kubernetes 1.20's message."""
_NODE_SHUTDOWN_REASONS: Final = frozenset({"Terminated", "Shutdown", "NodeShutdown"})
"""The pod ``status.reason`` the kubelet sets with those words (``nodeShutdownReason``,
1.20's ``Shutdown``, ``NodeShutdownNotAdmittedReason``)."""
_TERMINATION_BY_KUBELET: Final = "TerminationByKubelet"
"""facts B3: ``core/v1/types.go:3788``, node-pressure eviction or graceful node shutdown."""
_NODE_SHUTTING_DOWN: Final = "node is shutting down"
"""The kubelet's error in its node's Ready condition while it shuts down (``ShutdownStatus``
in ``pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go``)."""
_KUEUE_PREEMPTED: Final = "Preempted"
_KUEUE_NODE_FAILURES: Final = "NodeFailures"
"""facts B4, ``Evicted`` reasons."""

# Tie-break order for evidence of the same second (the table's order).
_RANK_DISRUPTION, _RANK_NODE, _RANK_OTHER_DISRUPTION, _RANK_KUEUE = 0, 1, 2, 3
_RANK_JOB_DEADLINE, _RANK_OOM, _RANK_EXIT = 4, 5, 6


class Disruption(msgspec.Struct, frozen=True, kw_only=True):
    """A pod's ``DisruptionTarget=True`` condition, as first seen."""

    reason: str
    message: str
    at: UtcDatetime | None


class Termination(msgspec.Struct, frozen=True, kw_only=True):
    """A container's first failing termination seen (non-zero exit code or a reason other
    than ``Completed``).

    Attributes:
        container: the container's name.
        exit_code: its exit code.
        reason: the runtime's reason (``Error``, ``OOMKilled``), verbatim.
        message: the runtime's message, if any.
        at: ``finishedAt``.
        deleting: whether the pod was already being deleted when the termination was first
            seen (then the termination is a consequence of the deletion, not a cause).
    """

    container: str
    exit_code: int | None
    reason: str
    message: str = ""
    at: UtcDatetime | None = None
    deleting: bool = False


class PodFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What dispatch keeps of one pod, merged over every version seen.

    Attributes:
        uid, name: the pod.
        trainjob: its TrainJob (= JobSet) name, from ``jobset.sigs.k8s.io/jobset-name``.
        jobset_uid: its JobSet's uid, from ``jobset.sigs.k8s.io/jobset-uid``, if labelled.
        restart: R, from ``jobset.sigs.k8s.io/restart-attempt``.
        node: the node it was bound to.
        phase: the last phase seen.
        deleting: whether the last version seen had a ``deletionTimestamp``.
        deleted: whether it is gone from the API server (a DELETED event, or missing from a
            relist).
        lost: gone without its final version being seen (a watch gap, 410).
        disruption: the first ``DisruptionTarget=True`` seen.
        termination: the first failing container termination seen.
        rv: the resourceVersion of the last version seen.
        reason, message: the first non-empty ``status.reason`` seen and its
            ``status.message`` (the kubelet's words for a pod it ended: ``Terminated``,
            ``Evicted``, ...).
    """

    uid: str
    name: str
    trainjob: str
    jobset_uid: str = ""
    restart: int | None = None
    node: str = ""
    phase: str = ""
    deleting: bool = False
    deleted: bool = False
    lost: bool = False
    disruption: Disruption | None = None
    termination: Termination | None = None
    rv: int = 0
    reason: str = ""
    message: str = ""

    @property
    def finished(self) -> bool:
        """Whether its containers are done (phase ``Succeeded``/``Failed``)."""
        return self.phase in ("Succeeded", "Failed")

    def node_shutdown(self) -> str | None:
        """The kubelet's words if a graceful shutdown of its node ended it (the
        ``DisruptionTarget`` ``TerminationByKubelet`` with the shutdown message, or the
        status reason and message alone), else ``None``."""
        d = self.disruption
        if d is not None and d.reason == _TERMINATION_BY_KUBELET:
            if d.message.strip() in _NODE_SHUTDOWN_MESSAGES:
                return f"pod {self.name} {DISRUPTION_TARGET} ({d.reason}): {d.message}"
            return None
        if self.reason in _NODE_SHUTDOWN_REASONS and self.message.strip() in (
            _NODE_SHUTDOWN_MESSAGES
        ):
            return f"pod {self.name} {self.phase or 'status'} ({self.reason}): {self.message}"
        return None


def _first_termination(pod: Pod, deleting: bool) -> Termination | None:
    status = pod.status
    for cs in (*(status.init_container_statuses or ()), *(status.container_statuses or ())):
        for state in (cs.state, cs.last_state):
            terminated = state.terminated if state is not None else None
            if terminated is None:
                continue
            code, reason = terminated.exit_code, terminated.reason or ""
            if code == 0 and reason in ("", "Completed"):
                continue
            return Termination(
                container=cs.name,
                exit_code=code,
                reason=reason,
                message=terminated.message or "",
                at=parse_time(terminated.finished_at),
                deleting=deleting,
            )
    return None


def pod_facts(previous: PodFacts | None, pod: Pod, *, deleted: bool) -> PodFacts:
    """Merge one version of a pod into what was known of it.

    Args:
        previous: the facts so far (``None`` for a pod not seen before).
        pod: the pod as the API server sent it (from a list or a watch event).
        deleted: whether this version came with a DELETED event.

    Returns:
        The merged facts: the first disruption and the first failing termination stick.
    """
    meta, status = pod.metadata, pod.status
    deleting = meta.deleting
    restart_label = meta.label(JOBSET_RESTART_LABEL)
    restart = int(restart_label) if restart_label.isdigit() else None
    disruption = previous.disruption if previous is not None else None
    if disruption is None:
        cond = status.true(DISRUPTION_TARGET)
        if cond is not None:
            disruption = Disruption(
                reason=cond.reason or "", message=cond.message or "", at=cond.at
            )
    termination = previous.termination if previous is not None else None
    if termination is None:
        termination = _first_termination(pod, deleting)
    reason, message = (previous.reason, previous.message) if previous is not None else ("", "")
    if not reason and status.reason:
        reason, message = status.reason, status.message or ""
    return PodFacts(
        uid=meta.uid or (previous.uid if previous else ""),
        name=meta.name,
        trainjob=meta.label(JOBSET_NAME_LABEL) or (previous.trainjob if previous else ""),
        jobset_uid=meta.label(JOBSET_UID_LABEL),
        restart=restart if restart is not None else (previous.restart if previous else None),
        node=pod.spec.node_name or (previous.node if previous else ""),
        phase=status.phase or "",
        deleting=deleting,
        deleted=deleted,
        disruption=disruption,
        termination=termination,
        rv=meta.rv,
        reason=reason,
        message=message,
    )


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    """A node's ``Ready`` condition, verbatim.

    Attributes:
        name: the node.
        ready: the condition's status (``True``, ``False``, ``Unknown``; ``""`` if absent).
        reason, message: its words.
        since: ``lastTransitionTime``: when it became what it is.
    """

    name: str
    ready: str
    reason: str = ""
    message: str = ""
    since: UtcDatetime | None = None

    @property
    def is_ready(self) -> bool:
        """Whether the node is Ready."""
        return self.ready == "True"

    @property
    def shutting_down(self) -> bool:
        """Whether its kubelet says it is being shut down (a NotReady condition whose message
        has the shutdown manager's error, ``node is shutting down``)."""
        return not self.is_ready and _NODE_SHUTTING_DOWN in self.message.lower()

    def words(self) -> str:
        """``node <name> Ready=<status> (<reason>): <message>``."""
        head = f"node {self.name} Ready={self.ready or 'absent'}"
        return reason_words(head, self.reason, self.message)


def node_facts(node: Node) -> NodeFacts:
    """Summarise a Node object."""
    cond = node.status.condition("Ready")
    if cond is None:
        return NodeFacts(name=node.metadata.name, ready="")
    return NodeFacts(
        name=node.metadata.name,
        ready=cond.status,
        reason=cond.reason or "",
        message=cond.message or "",
        since=cond.at,
    )


def _node_state(name: str, nodes: Mapping[str, NodeFacts]) -> tuple[bool, str, datetime | None]:
    """(lost, words, since) of a node: lost when not Ready or no longer in the API."""
    facts = nodes.get(name)
    if facts is None:
        return True, f"node {name} no longer exists", None
    if facts.is_ready:
        return False, facts.words(), facts.since
    return True, facts.words(), facts.since


def lost_nodes(
    pods: Iterable[PodFacts], nodes: Mapping[str, NodeFacts]
) -> tuple[Cause | None, tuple[str, ...]]:
    """``node-lost`` for a TrainJob still running with pods on a lost node (facts B5).

    A pod counts when it is not finished (phase not ``Succeeded``/``Failed``) and sits on a
    node that is not Ready or is gone, or when the taint manager is deleting it
    (``DeletionByTaintManager``).

    Returns:
        The cause (``at`` = when the earliest such node stopped being Ready, else the
        disruption's time) and the lost nodes; ``(None, ())`` when none.
    """
    words: list[str] = []
    lost: set[str] = set()
    times: list[datetime] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.finished or (pod.deleted and not pod.deleting):
            continue
        node_lost = False
        if pod.node:
            node_lost, node_words, since = _node_state(pod.node, nodes)
            if node_lost and pod.node not in lost:
                lost.add(pod.node)
                words.append(node_words)
                if since is not None:
                    times.append(since)
        disruption = pod.disruption
        if disruption is not None and disruption.reason == "DeletionByTaintManager":
            words.append(
                f"pod {pod.name} {DISRUPTION_TARGET} ({disruption.reason}): {disruption.message}"
            )
            if pod.node:
                lost.add(pod.node)
            if disruption.at is not None and not node_lost:
                times.append(disruption.at)
    if not lost:
        return None, ()
    cause = Cause(
        kind=CauseKind.NODE_LOST,
        provenance=Provenance.SCHEDULER,
        detail="; ".join(words),
        at=min(times) if times else None,
    )
    return cause, tuple(sorted(lost))


def kueue_eviction(workload: Workload | None) -> Cause | None:
    """The cause of a Kueue eviction (Workload ``Evicted=True``, facts B4), or ``None``.

    ``Preempted`` -> ``preempted`` (with the ``Preempted`` condition's reason, e.g.
    ``InClusterQueue``, in the words); ``NodeFailures`` -> ``node-lost``; any other reason
    -> ``unknown`` with Kueue's words.
    """
    evicted = workload.status.true("Evicted") if workload is not None else None
    if evicted is None or workload is None:
        return None
    what = f"Kueue Workload {workload.metadata.name}"
    words = [evicted.words(what)]
    preempted = workload.status.true("Preempted")
    if preempted is not None:
        words.append(preempted.words(what))
    if evicted.reason == _KUEUE_PREEMPTED:
        kind = CauseKind.PREEMPTED
    elif evicted.reason == _KUEUE_NODE_FAILURES:
        kind = CauseKind.NODE_LOST
    else:
        kind = CauseKind.UNKNOWN
    return Cause(kind=kind, provenance=Provenance.SCHEDULER, detail="; ".join(words), at=evicted.at)


def job_words(jobs: Iterable[Job]) -> list[str]:
    """The words of the child Jobs' failure conditions (``Failed``, else ``FailureTarget``)."""
    out = []
    for job in sorted(jobs, key=lambda j: j.metadata.name):
        cond = job.status.true("Failed") or job.status.true("FailureTarget")
        if cond is not None:
            out.append(cond.words(f"Job {job.metadata.name}"))
    return out


class _Candidate(msgspec.Struct, frozen=True, kw_only=True):
    at: UtcDatetime | None
    rank: int
    kind: CauseKind
    provenance: Provenance
    words: str
    exit_code: int | None = None


def _candidates(
    pods: Sequence[PodFacts],
    jobs: Sequence[Job],
    nodes: Mapping[str, NodeFacts],
    workload: Workload | None,
) -> list[_Candidate]:
    out: list[_Candidate] = []
    for pod in pods:
        shutdown = _node_shutdown(pod, nodes)
        if shutdown is not None:
            # The kubelet ended it for its node's shutdown: the disruption and the 143 the
            # container exited with are that shutdown, nothing of the job's own.
            out.append(shutdown)
            continue
        d = pod.disruption
        if d is not None:
            words = f"pod {pod.name} {DISRUPTION_TARGET} ({d.reason}): {d.message}"
            if d.reason in _PREEMPTED_DISRUPTIONS:
                kind, rank = CauseKind.PREEMPTED, _RANK_DISRUPTION
            elif d.reason in _NODE_LOST_DISRUPTIONS:
                kind, rank = CauseKind.NODE_LOST, _RANK_DISRUPTION
            else:
                kind, rank = CauseKind.UNKNOWN, _RANK_OTHER_DISRUPTION
            out.append(
                _Candidate(
                    at=d.at, rank=rank, kind=kind, provenance=Provenance.SCHEDULER, words=words
                )
            )
        # A pod the taint manager or PodGC did not mark, left unfinished on a lost node.
        if pod.node and not pod.finished and d is None:
            node_lost, node_words, since = _node_state(pod.node, nodes)
            if node_lost:
                shutting_down = pod.node in nodes and nodes[pod.node].shutting_down
                out.append(
                    _Candidate(
                        at=since,
                        rank=_RANK_NODE,
                        # A node its kubelet is shutting down: the graceful shutdown of a
                        # spot or preemptible node (module docstring).
                        kind=CauseKind.PREEMPTED if shutting_down else CauseKind.NODE_LOST,
                        provenance=Provenance.SCHEDULER,
                        words=f"pod {pod.name} on {node_words}",
                    )
                )
        terminated = _terminated(pod)
        if terminated is not None:
            out.append(terminated)
    evicted = kueue_eviction(workload)
    if evicted is not None:
        out.append(
            _Candidate(
                at=evicted.at,
                rank=_RANK_KUEUE,
                kind=evicted.kind,
                provenance=evicted.provenance,
                words=evicted.detail,
            )
        )
    for job in jobs:
        cond = job.status.true("Failed") or job.status.true("FailureTarget")
        if cond is not None and cond.reason == "DeadlineExceeded":
            out.append(
                _Candidate(
                    at=cond.at,
                    rank=_RANK_JOB_DEADLINE,
                    kind=CauseKind.TIME_LIMIT,
                    provenance=Provenance.SCHEDULER,
                    words=cond.words(f"Job {job.metadata.name}"),
                )
            )
    return out


def _terminated(pod: PodFacts) -> _Candidate | None:
    """The evidence of the pod's failing container: out of memory, else a non-zero exit."""
    t = pod.termination
    if t is None or t.deleting:
        return None
    words = f"pod {pod.name} container {t.container} terminated ({t.reason})"
    if t.exit_code is not None:
        words += f", exit code {t.exit_code}"
    if t.message:
        words += f": {t.message}"
    if t.reason == "OOMKilled":
        kind, rank, provenance = CauseKind.OUT_OF_MEMORY, _RANK_OOM, Provenance.SCHEDULER
    elif t.exit_code:
        kind, rank, provenance = CauseKind.NON_ZERO_EXIT, _RANK_EXIT, Provenance.APPLICATION
    else:
        return None
    return _Candidate(
        at=t.at, rank=rank, kind=kind, provenance=provenance, words=words, exit_code=t.exit_code
    )


def _node_shutdown(pod: PodFacts, nodes: Mapping[str, NodeFacts]) -> _Candidate | None:
    """The evidence of a graceful shutdown of the pod's node (module docstring, "Graceful
    node shutdown"): ``preempted`` while the node is being shut down (it says so, or is
    still Ready), ``node-lost`` once it is gone or NotReady for another reason."""
    words = pod.node_shutdown()
    if words is None:
        return None
    facts = nodes.get(pod.node) if pod.node else None
    if facts is None:
        kind = CauseKind.NODE_LOST
        node_words = f"node {pod.node or '(none)'} no longer exists"
    else:
        node_words = facts.words()
        kind = CauseKind.PREEMPTED if facts.is_ready or facts.shutting_down else CauseKind.NODE_LOST
    if kind is CauseKind.PREEMPTED:
        words += f"; a graceful shutdown of its node ({node_words})"
    else:
        words += f"; its node is lost ({node_words})"
    t = pod.termination
    if t is not None:
        words += f"; container {t.container} terminated ({t.reason})"
        if t.exit_code is not None:
            words += f", exit code {t.exit_code}"
    at = pod.disruption.at if pod.disruption is not None else None
    return _Candidate(
        at=at or (t.at if t is not None else None),
        rank=_RANK_DISRUPTION,
        kind=kind,
        provenance=Provenance.SCHEDULER,
        words=words,
    )


def _earliest(candidates: Sequence[_Candidate]) -> _Candidate | None:
    if not candidates:
        return None
    # Evidence without a time sorts after all timed evidence.
    far = datetime.max.replace(tzinfo=UTC)

    def key(c: _Candidate) -> tuple[datetime, int]:
        return c.at or far, c.rank

    return min(candidates, key=key)


def execution_cause(
    headline: Sequence[str],
    pods: Sequence[PodFacts],
    jobs: Sequence[Job],
    nodes: Mapping[str, NodeFacts],
    workload: Workload | None = None,
    *,
    at: datetime | None = None,
    missing: str = "no pod disruption, node loss or failing container termination was seen",
) -> Cause:
    """The cause that ended an execution, from its evidence (the table in the module
    docstring, minus the TrainJob's own conditions).

    Args:
        headline: the scheduler's words that say it ended (a TrainJob ``Failed`` condition,
            a JobSet restart), verbatim; they start the detail.
        pods: the execution's pods (facts).
        jobs: the execution's child Jobs still known.
        nodes: the cluster's nodes.
        workload: the TrainJob's Kueue Workload, if any.
        at: when it ended, for a cause without timed evidence.
        missing: what to say when there is no evidence at all.

    Returns:
        A cause with every word kept; ``unknown`` when nothing maps.
    """
    words = [*headline, *job_words(jobs)]
    chosen = _earliest(_candidates(pods, jobs, nodes, workload))
    if chosen is None:
        return Cause(
            kind=CauseKind.UNKNOWN,
            provenance=Provenance.SCHEDULER,
            detail="; ".join([*words, missing]),
            at=at,
        )
    return Cause(
        kind=chosen.kind,
        provenance=chosen.provenance,
        detail="; ".join([*words, chosen.words]),
        exit_code=chosen.exit_code,
        at=chosen.at or at,
    )


def terminal_cause(
    trainjob: TrainJob,
    pods: Sequence[PodFacts],
    jobs: Sequence[Job],
    nodes: Mapping[str, NodeFacts],
    workload: Workload | None = None,
    *,
    missing: str = "no pod disruption, node loss or failing container termination was seen",
) -> Cause | None:
    """The cause of a finished TrainJob (``Complete=True`` or ``Failed=True``, facts B1), or
    ``None`` when it is not finished.

    ``Complete`` -> ``none``; ``Failed`` with the Trainer's own reasons ``DeadlineExceeded``
    -> ``time-limit`` and ``TrainingRuntimeNotSupported`` -> ``launch-failed``; any other
    ``Failed`` reason (the JobSet's: ``FailedJobs``, ``FailJobSetFailurePolicyAction``,
    ``ReachedMaxRestarts``, or one nobody mapped) -> :func:`execution_cause`.
    """
    what = f"TrainJob {trainjob.metadata.name}"
    complete = trainjob.status.true("Complete")
    if complete is not None:
        return Cause(
            kind=CauseKind.NONE,
            provenance=Provenance.SCHEDULER,
            detail=complete.words(what),
            at=complete.at,
        )
    failed = trainjob.status.true("Failed")
    if failed is None:
        return None
    headline, at = failed.words(what), failed.at
    if failed.reason == "DeadlineExceeded":
        return Cause(
            kind=CauseKind.TIME_LIMIT, provenance=Provenance.SCHEDULER, detail=headline, at=at
        )
    if failed.reason == "TrainingRuntimeNotSupported":
        return Cause(
            kind=CauseKind.LAUNCH_FAILED, provenance=Provenance.SCHEDULER, detail=headline, at=at
        )
    return execution_cause([headline], pods, jobs, nodes, workload, at=at, missing=missing)

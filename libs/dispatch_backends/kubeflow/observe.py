"""What one TrainJob is, for dispatch: phase, gate, cause, executions (pure).

:func:`observe` turns a TrainJob and what the watches hold of its JobSet, Jobs, pods,
nodes and Kueue Workload (each decoded once into the typed objects of :mod:`.objects`) into
an :class:`ObservedObject`, plus what discovery must remember and the housekeeping it must
do. It never calls the API server.

**Phase** (facts B1: the TrainJob has no ``Running`` condition, so it is inferred):

==========================================================  ==========  ====================
what the cluster shows                                      phase       cause
==========================================================  ==========  ====================
recorded ended before (see "Memory")                        ``ended``   the recorded one
``Complete``/``Failed`` True, evidence caught up            ``ended``   :mod:`.causes`
Kueue Workload ``Evicted`` and the TrainJob suspended       ``ended``   :mod:`.causes`
(dispatch's object ends: see "Kueue eviction")
an end above, evidence not caught up yet; a JobSet restart  ``stopping``  none
not yet recorded; ``deletionTimestamp`` set                             (node-lost if so)
gate ``closed`` / ``admin-held``                            ``pending`` none / ``held``
a pod of the current execution on a lost node               ``running`` ``node-lost``
a pod of the current execution ``Running``, not deleting    ``running`` none
pods of the current execution finishing or deleted          ``stopping``  none
otherwise (Kueue quota, JobSet or pods not there yet)       ``pending`` none
==========================================================  ==========  ====================

The rows without an end are :data:`ALIVE_RULES`, in that order (the first that applies
wins); an end is seen by the first of ``_END_RULES`` that answers (``Complete``/``Failed``,
then a Kueue eviction).

"Running" is never inferred from ``jobsStatus[].active > 0`` alone: after the taint
manager evicts, the Job's ``active`` excludes terminating pods and drops to 0 while the
TrainJob is neither finished nor suspended (facts B5; the simulator's note). A TrainJob on a
lost node stays ``running`` with ``node-lost`` (``at`` = when the node stopped being Ready)
until dispatch's fence stops it; it is never reported ended for that by the backend.

**Executions.** R is the JobSet's ``status.restarts`` (facts B2). Each earlier execution r
is reported once recorded, with the cause its pods (label
``jobset.sigs.k8s.io/restart-attempt=r``) show.

**Kueue eviction.** A TrainJob Kueue evicted would be re-admitted later and run again with
the same ``DISPATCH_ATTEMPT`` and ``DISPATCH_EPOCH`` (nothing a pod can see changes across a
suspension), so dispatch can't count it as a new execution of the same object. Its eviction
ends the object for dispatch (cause from the Workload, facts B4), and discovery deactivates
the Workload (``spec.active: false``, Kueue's documented way to keep it from being
admitted) so that "ended" stays true; the plan then resubmits (a new TrainJob, a higher
epoch).

**Memory** (facts B1: the Trainer up to v2.3.0 clears ``Failed`` when the JobSet goes and
re-creates the JobSet, #3779): the first end seen, and each execution's end, are kept in
memory by TrainJob uid and written back on the TrainJob as the annotation
``dispatch.dev/observed`` (JSON of :class:`Observed`), so a restarted observer reads the same
answer. Once recorded, the answer never changes; a TrainJob the Trainer revives after its
recorded end is suspended by discovery (it is dispatch's ended object).

**Consistency.** Pod evidence comes from a watch that may lag the fresh TrainJob list by a
moment; an end (or a restart) is only decided once the watches have caught up with the
resourceVersion of the objects that show it (resourceVersions are comparable integers:
KEP-5504). Until then the object is ``stopping``: at most ``evidence_wait_s`` while every
watch is healthy (on a quiet stream only a bookmark proves progress), for as long as a watch
is broken.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Final

import msgspec

from dispatch_backends.kubeflow.causes import (
    NodeFacts,
    PodFacts,
    execution_cause,
    kueue_eviction,
    lost_nodes,
    terminal_cause,
)
from dispatch_backends.kubeflow.gate import gate_state
from dispatch_backends.kubeflow.names import (
    ANNOTATION_OBSERVED,
    JOBSET_RESTART_LABEL,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SUBMISSION,
    read_number,
)
from dispatch_backends.kubeflow.objects import Job, JobSet, TrainJob, Workload
from dispatch_backends.kubeflow.settings import KubeflowSettings
from dispatch_backends.protocol import object_name
from dispatch_core.state import (
    Cause,
    CauseKind,
    Execution,
    GateState,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    UtcDatetime,
)

__all__ = [
    "ALIVE_RULES",
    "AliveRule",
    "Housekeeping",
    "Now",
    "Observation",
    "Observed",
    "alive_rule",
    "decode_observed",
    "encode_observed",
    "merge_observed",
    "observe",
]


class Observed(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What discovery decided about one TrainJob (annotation ``dispatch.dev/observed``).

    Attributes:
        ended: the cause of the first end seen (``None``: not ended).
        ended_restart: R of the execution that ended.
        ended_nodes: the nodes it ran on.
        ended_seen: when dispatch first saw the end (retention counts from here).
        evicted: whether the end was a Kueue eviction.
        executions: earlier executions (JobSet restarts) and why each ended.
    """

    ended: Cause | None = None
    ended_restart: int = 0
    ended_nodes: tuple[str, ...] = ()
    ended_seen: UtcDatetime | None = None
    evicted: bool = False
    executions: tuple[Execution, ...] = ()


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Observed)


def encode_observed(observed: Observed) -> str:
    """The annotation value for ``observed``."""
    return _ENCODER.encode(observed).decode()


def decode_observed(text: str | None) -> Observed | None:
    """Read the annotation; ``None`` when absent or unreadable (then it is rewritten)."""
    if not text:
        return None
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return None


def merge_observed(persisted: Observed | None, memory: Observed | None) -> Observed:
    """Combine what the TrainJob carries with what this process remembers: the first record
    of each end wins (the persisted one, made earlier, over this process's)."""
    if persisted is None:
        return memory or Observed()
    if memory is None:
        return persisted
    base = persisted if persisted.ended is not None or memory.ended is None else memory
    known = {e.restart: e for e in memory.executions}
    known.update({e.restart: e for e in persisted.executions})
    return msgspec.structs.replace(base, executions=tuple(known[r] for r in sorted(known)))


class Housekeeping(enum.StrEnum):
    """A write discovery makes so that what it reports stays true (``record_on_object``)."""

    RECORD = "record"
    """Write the ``dispatch.dev/observed`` annotation."""
    DEACTIVATE = "deactivate"
    """Set the evicted TrainJob's Workload ``spec.active: false``."""
    SUSPEND = "suspend"
    """Suspend a TrainJob the Trainer revived after its recorded end."""
    DELETE = "delete"
    """Delete an ended TrainJob past ``retain_ended_s``."""


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """The result of :func:`observe`.

    Attributes:
        job_id: the job the TrainJob is labelled for.
        observed: what dispatch is told.
        memory: what to remember of it (by uid).
        housekeeping: writes to make (only for dispatch's own, never a foreign one).
        waiting: whether a decision waits for the evidence to catch up.
    """

    job_id: str
    observed: ObservedObject
    memory: Observed
    housekeeping: tuple[Housekeeping, ...] = ()
    waiting: bool = False


class Now(msgspec.Struct, frozen=True, kw_only=True):
    """What the alive rules read of a TrainJob with no end recorded (its current execution).

    Attributes:
        deleting: ``deletionTimestamp`` set.
        gate: the start gate, and ``gate_words`` the scheduler's words for ``admin-held``.
        suspended: ``spec.suspend``.
        pods: the current execution's pods (facts).
        lost: ``node-lost`` when a pod of it sits on a lost node (:func:`.lost_nodes`), and
            ``lost_on`` those nodes.
        nodes: the nodes its pods not yet gone are on.
    """

    deleting: bool
    gate: GateState
    gate_words: str = ""
    suspended: bool
    pods: tuple[PodFacts, ...]
    lost: Cause | None = None
    lost_on: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()


class AliveRule(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the module docstring's phase table for a TrainJob not ended: when
    ``applies`` (the first row that does wins), the phase, the cause and the nodes shown."""

    when: str
    applies: Callable[[Now], bool]
    phase: ObjectPhase
    cause: Callable[[Now], Cause | None] = lambda now: None
    nodes: Callable[[Now], tuple[str, ...]] = lambda now: now.nodes


def _held(now: Now) -> Cause:
    return Cause(kind=CauseKind.HELD, provenance=Provenance.SCHEDULER, detail=now.gate_words)


def _running(now: Now) -> bool:
    return any(p.phase == "Running" and not p.deleting and not p.deleted for p in now.pods)


def _finishing(now: Now) -> bool:
    return not now.suspended and any(p.deleting or p.finished for p in now.pods if not p.deleted)


ALIVE_RULES: Final[tuple[AliveRule, ...]] = (
    AliveRule(
        when="deletionTimestamp set",
        applies=lambda now: now.deleting,
        phase=ObjectPhase.STOPPING,
        cause=lambda now: now.lost,
    ),
    AliveRule(
        when="gate admin-held",
        applies=lambda now: now.gate is GateState.ADMIN_HELD,
        phase=ObjectPhase.PENDING,
        cause=_held,
        nodes=lambda now: (),
    ),
    AliveRule(
        when="gate closed",
        applies=lambda now: now.gate is GateState.CLOSED,
        phase=ObjectPhase.PENDING,
        nodes=lambda now: (),
    ),
    AliveRule(
        when="a pod of the current execution on a lost node",
        applies=lambda now: now.lost is not None,
        phase=ObjectPhase.RUNNING,
        cause=lambda now: now.lost,
        nodes=lambda now: tuple(sorted({*now.nodes, *now.lost_on})),
    ),
    AliveRule(
        when="a pod of the current execution Running, not deleting",
        applies=_running,
        phase=ObjectPhase.RUNNING,
    ),
    AliveRule(
        when="pods of the current execution finishing or deleted",
        applies=_finishing,
        phase=ObjectPhase.STOPPING,
    ),
    AliveRule(
        when="otherwise (Kueue quota, JobSet or pods not there yet)",
        applies=lambda now: True,
        phase=ObjectPhase.PENDING,
    ),
)
"""The phase of a TrainJob with no end, in the module docstring's order."""


def alive_rule(now: Now) -> AliveRule:
    """The first of :data:`ALIVE_RULES` that applies to ``now`` (the last always does)."""
    return next(rule for rule in ALIVE_RULES if rule.applies(now))


class _End(msgspec.Struct, frozen=True, kw_only=True):
    cause: Cause
    target: int
    """The resourceVersion the watches must have caught up with before it is decided."""
    evicted: bool = False


def _finished_end(
    trainjob: TrainJob,
    pods: Sequence[PodFacts],
    jobs: Sequence[Job],
    nodes: Mapping[str, NodeFacts],
    workload: Workload | None,
    gate: GateState,
    missing: str,
) -> _End | None:
    """``Complete``/``Failed`` True: :func:`.terminal_cause` (facts B1)."""
    if not trainjob.finished:
        return None
    cause = terminal_cause(trainjob, pods, jobs, nodes, workload, missing=missing)
    return None if cause is None else _End(cause=cause, target=trainjob.metadata.rv)


def _evicted_end(
    trainjob: TrainJob,
    pods: Sequence[PodFacts],
    jobs: Sequence[Job],
    nodes: Mapping[str, NodeFacts],
    workload: Workload | None,
    gate: GateState,
    missing: str,
) -> _End | None:
    """Kueue Workload ``Evicted`` and the TrainJob suspended with dispatch's gate open (see
    "Kueue eviction"): the execution's cause, Kueue's words among the evidence."""
    if gate is not GateState.OPEN or not trainjob.suspended:
        return None
    eviction = kueue_eviction(workload)
    if eviction is None or workload is None:
        return None
    cause = execution_cause([], pods, jobs, nodes, workload, at=eviction.at, missing=missing)
    target = max(trainjob.metadata.rv, workload.metadata.rv)
    return _End(cause=cause, target=target, evicted=True)


_END_RULES: Final = (_finished_end, _evicted_end)
"""How a TrainJob's end is seen now, in order: the first that answers wins."""


def _chores(
    record: Observed,
    trainjob: TrainJob,
    workload: Workload | None,
    settings: KubeflowSettings,
    now: datetime,
) -> list[Housekeeping]:
    """The writes that keep a recorded end true (see "Kueue eviction" and "Memory")."""
    chores: list[Housekeeping] = []
    deleting = trainjob.metadata.deleting
    if record.evicted and workload is not None:
        if workload.spec.active is not False:
            chores.append(Housekeeping.DEACTIVATE)
    elif not record.evicted and not trainjob.finished and not trainjob.suspended and not deleting:
        chores.append(Housekeeping.SUSPEND)  # revived by the Trainer after its end (#3779)
    if (
        settings.retain_ended_s is not None
        and record.ended_seen is not None
        and not deleting
        and now >= record.ended_seen + timedelta(seconds=settings.retain_ended_s)
    ):
        chores.append(Housekeeping.DELETE)
    return chores


def _restart_of(job: Job) -> int | None:
    value = job.metadata.label(JOBSET_RESTART_LABEL)
    return int(value) if value.isdigit() else None


def _nodes(pods: Sequence[PodFacts]) -> tuple[str, ...]:
    return tuple(sorted({p.node for p in pods if p.node}))


def _restart_cause(
    r: int,
    restarts: int,
    name: str,
    jobset: JobSet | None,
    pods: Sequence[PodFacts],
    jobs: Sequence[Job],
    nodes: Mapping[str, NodeFacts],
    missing: str,
) -> Execution:
    """Execution ``r`` of a JobSet that restarted past it (``restarts`` times so far), and why
    it ended (facts B2)."""
    mine = [p for p in pods if p.restart == r]
    restarting = jobset.status.condition("RestartingJobSet") if jobset is not None else None
    headline = [f"JobSet {name} restarted: status.restarts is {restarts}"]
    if restarting is not None and restarting.true:
        headline.append(
            f"JobSet {name} RestartingJobSet ({restarting.reason or ''}): "
            f"{restarting.message or ''}"
        )
    ended = execution_cause(
        headline,
        mine,
        [j for j in jobs if _restart_of(j) == r],
        nodes,
        at=restarting.at if restarting is not None else None,
        missing=missing,
    )
    return Execution(restart=r, cause=ended, nodes=_nodes(mine))


def observe(
    trainjob: TrainJob,
    *,
    cluster: str,
    settings: KubeflowSettings,
    jobset: JobSet | None,
    jobs: Sequence[Job],
    pods: Sequence[PodFacts],
    nodes: Mapping[str, NodeFacts],
    workload: Workload | None,
    memory: Observed | None,
    caught_up: Callable[[int], bool],
    now: datetime,
    evidence_note: str = "",
) -> Observation:
    """Observe one TrainJob (see the module docstring for the rules).

    Args:
        trainjob: the TrainJob, fresh from this discovery's list.
        cluster: the backend's cluster (for the ref).
        settings: the backend's settings.
        jobset: its JobSet (same name, owned by it), if the watch holds one.
        jobs: its JobSet's child Jobs the watch holds.
        pods: the facts of its pods (deleted ones included).
        nodes: the cluster's nodes.
        workload: its Kueue Workload, if any.
        memory: what this process remembers of it (by uid).
        caught_up: whether every watch has seen everything up to a resourceVersion.
        now: when discovery asked.
        evidence_note: why pod evidence may be missing (a watch gap), for ``unknown``.

    Returns:
        The observation.
    """
    meta = trainjob.metadata
    labels = meta.labels or {}
    job_id = labels.get(LABEL_JOB) or ""
    ref = ObjectRef(cluster=cluster, id=f"{meta.namespace}/{meta.name}")
    gate, gate_words = gate_state(trainjob, settings.gate, settings.gate_name)
    persisted = decode_observed(meta.annotation(ANNOTATION_OBSERVED))
    record = merge_observed(persisted, memory)
    missing = "no pod disruption, node loss or failing container termination was seen"
    if evidence_note:
        missing += f" ({evidence_note})"
    if jobset is not None and jobset.metadata.uid:
        pods = [p for p in pods if p.jobset_uid in ("", jobset.metadata.uid)]
    if jobset is not None:
        restarts = jobset.restarts
    else:
        restarts = max([e.restart + 1 for e in record.executions], default=0)

    def shown(
        phase: ObjectPhase, restarts: int, cause: Cause | None = None, nodes: tuple[str, ...] = ()
    ) -> ObservedObject:
        return ObservedObject(
            ref=ref,
            name=object_name(job_id),
            submission=read_number(labels, LABEL_SUBMISSION),
            attempt=read_number(labels, LABEL_ATTEMPT),
            gate=gate,
            executions=record.executions,
            phase=phase,
            restarts=restarts,
            cause=cause,
            nodes=nodes,
        )

    # 1. Earlier executions (JobSet restarts), recorded in order once the evidence is in.
    if record.ended is None:
        recorded = {e.restart for e in record.executions}
        for r in (r for r in range(restarts) if r not in recorded):
            if not caught_up(jobset.metadata.rv if jobset is not None else 0):
                stopping = shown(ObjectPhase.STOPPING, r)
                return _result(job_id, stopping, record, persisted, True)
            execution = _restart_cause(r, restarts, meta.name, jobset, pods, jobs, nodes, missing)
            record = msgspec.structs.replace(record, executions=(*record.executions, execution))

    current = [p for p in pods if p.restart in (restarts, None)]
    current_jobs = [j for j in jobs if _restart_of(j) in (restarts, None)]

    # 2. The end: recorded, or seen now (decided once the watches caught up).
    if record.ended is None:
        for end_rule in _END_RULES:
            end = end_rule(trainjob, current, current_jobs, nodes, workload, gate, missing)
            if end is None:
                continue
            if not caught_up(end.target):
                stopping = shown(ObjectPhase.STOPPING, restarts)
                return _result(job_id, stopping, record, persisted, True)
            record = msgspec.structs.replace(
                record,
                ended=end.cause,
                ended_restart=restarts,
                ended_nodes=_nodes(current),
                ended_seen=now,
                evicted=end.evicted,
            )
            break
    if record.ended is not None:
        ended = shown(ObjectPhase.ENDED, record.ended_restart, record.ended, record.ended_nodes)
        chores = _chores(record, trainjob, workload, settings, now)
        return _result(job_id, ended, record, persisted, False, chores)

    # 3. Alive: the first of ALIVE_RULES that applies.
    lost, lost_on = lost_nodes(current, nodes)
    alive = Now(
        deleting=meta.deleting,
        gate=gate,
        gate_words=gate_words,
        suspended=trainjob.suspended,
        pods=tuple(current),
        lost=lost,
        lost_on=lost_on,
        nodes=_nodes([p for p in current if not p.deleted]),
    )
    rule = alive_rule(alive)
    observed = shown(rule.phase, restarts, rule.cause(alive), rule.nodes(alive))
    return _result(job_id, observed, record, persisted, False)


def _result(
    job_id: str,
    observed: ObservedObject,
    record: Observed,
    persisted: Observed | None,
    waiting: bool,
    chores: Sequence[Housekeeping] = (),
) -> Observation:
    todo = list(chores)
    if record != (persisted or Observed()) and (record.ended is not None or record.executions):
        todo.insert(0, Housekeeping.RECORD)
    return Observation(
        job_id=job_id,
        observed=observed,
        memory=record,
        housekeeping=tuple(todo),
        waiting=waiting,
    )

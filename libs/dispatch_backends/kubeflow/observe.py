"""What one TrainJob is, for dispatch: phase, gate, cause, executions (pure).

:func:`observe` turns a TrainJob and what the watches hold of its JobSet, Jobs, pods,
nodes and Kueue Workload into an :class:`ObservedObject`, plus what discovery must remember
and the housekeeping it must do. It never calls the API server.

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
from typing import Any, Final

import msgspec

from dispatch_backends.kubeflow.causes import (
    NodeFacts,
    PodFacts,
    condition,
    execution_cause,
    kueue_eviction,
    lost_nodes,
    parse_time,
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
    "Housekeeping",
    "Observation",
    "Observed",
    "decode_observed",
    "encode_observed",
    "merge_observed",
    "observe",
    "resource_version",
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


def resource_version(obj: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as an integer (0 when absent)."""
    text = str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def _restart_of(obj: Mapping[str, Any]) -> int | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(JOBSET_RESTART_LABEL)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _nodes(pods: Sequence[PodFacts]) -> tuple[str, ...]:
    return tuple(sorted({p.node for p in pods if p.node}))


def observe(
    trainjob: Mapping[str, Any],
    *,
    cluster: str,
    settings: KubeflowSettings,
    jobset: Mapping[str, Any] | None,
    jobs: Sequence[Mapping[str, Any]],
    pods: Sequence[PodFacts],
    nodes: Mapping[str, NodeFacts],
    workload: Mapping[str, Any] | None,
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
    meta = trainjob.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    job_id = str(labels.get(LABEL_JOB) or "")
    submission = read_number(labels, LABEL_SUBMISSION)
    attempt = read_number(labels, LABEL_ATTEMPT)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    ref = ObjectRef(cluster=cluster, id=f"{namespace}/{name}")
    gate, gate_words = gate_state(trainjob, settings.gate, settings.gate_name)
    persisted = decode_observed(annotations.get(ANNOTATION_OBSERVED))
    record = merge_observed(persisted, memory)
    missing = "no pod disruption, node loss or failing container termination was seen"
    if evidence_note:
        missing += f" ({evidence_note})"

    js_uid = str(((jobset or {}).get("metadata") or {}).get("uid") or "")
    if js_uid:
        pods = [p for p in pods if p.jobset_uid in ("", js_uid)]
    restarts = int(((jobset or {}).get("status") or {}).get("restarts") or 0)
    if jobset is None:
        restarts = max([e.restart + 1 for e in record.executions], default=0)

    def base(**fields: Any) -> ObservedObject:
        return ObservedObject(
            ref=ref,
            name=object_name(job_id),
            submission=submission,
            attempt=attempt,
            gate=gate,
            executions=record.executions,
            **fields,
        )

    # 1. Earlier executions (JobSet restarts), recorded in order once the evidence is in.
    waiting = False
    recorded = {e.restart for e in record.executions}
    for r in range(restarts):
        if r in recorded or record.ended is not None:
            continue
        if not caught_up(resource_version(jobset)):
            waiting = True
            break
        mine = [p for p in pods if p.restart == r]
        restarting = condition(jobset, "RestartingJobSet")
        headline = [f"JobSet {name} restarted: status.restarts is {restarts}"]
        if restarting is not None and restarting.get("status") == "True":
            headline.append(
                f"JobSet {name} RestartingJobSet ({restarting.get('reason') or ''}): "
                f"{restarting.get('message') or ''}"
            )
        ended = execution_cause(
            headline,
            mine,
            [j for j in jobs if _restart_of(j) == r],
            nodes,
            at=parse_time((restarting or {}).get("lastTransitionTime")),
            missing=missing,
        )
        record = msgspec.structs.replace(
            record,
            executions=(*record.executions, Execution(restart=r, cause=ended, nodes=_nodes(mine))),
        )
        recorded.add(r)
    if waiting:
        first = min(set(range(restarts)) - recorded)
        return _result(
            job_id, base(phase=ObjectPhase.STOPPING, restarts=first), record, persisted, True
        )

    current = [p for p in pods if p.restart in (restarts, None)]
    current_jobs = [j for j in jobs if _restart_of(j) in (restarts, None)]
    deleting = bool(meta.get("deletionTimestamp"))
    suspended = bool((trainjob.get("spec") or {}).get("suspend"))

    # 2. The end: recorded, or seen now.
    if record.ended is None:
        cause: Cause | None = None
        target = resource_version(trainjob)
        evicted = False
        if condition(trainjob, "Complete") is not None or condition(trainjob, "Failed") is not None:
            cause = terminal_cause(
                trainjob, current, current_jobs, nodes, workload, missing=missing
            )
        if cause is None and gate is GateState.OPEN and suspended:
            eviction = kueue_eviction(workload)
            if eviction is not None:
                evicted = True
                target = max(target, resource_version(workload))
                cause = execution_cause(
                    [], current, current_jobs, nodes, workload, at=eviction.at, missing=missing
                )
        if cause is not None:
            if not caught_up(target):
                return _result(
                    job_id,
                    base(phase=ObjectPhase.STOPPING, restarts=restarts),
                    record,
                    persisted,
                    True,
                )
            record = msgspec.structs.replace(
                record,
                ended=cause,
                ended_restart=restarts,
                ended_nodes=_nodes(current),
                ended_seen=now,
                evicted=evicted,
            )
    if record.ended is not None:
        chores: list[Housekeeping] = []
        finished = (
            condition(trainjob, "Complete") is not None or condition(trainjob, "Failed") is not None
        )
        if record.evicted and workload is not None:
            if (workload.get("spec") or {}).get("active") is not False:
                chores.append(Housekeeping.DEACTIVATE)
        elif not record.evicted and not finished and not suspended and not deleting:
            chores.append(Housekeeping.SUSPEND)  # revived by the Trainer after its end (#3779)
        if (
            settings.retain_ended_s is not None
            and record.ended_seen is not None
            and not deleting
            and now >= record.ended_seen + timedelta(seconds=settings.retain_ended_s)
        ):
            chores.append(Housekeeping.DELETE)
        observed = base(
            phase=ObjectPhase.ENDED,
            cause=record.ended,
            restarts=record.ended_restart,
            nodes=record.ended_nodes,
        )
        return _result(job_id, observed, record, persisted, False, chores)

    # 3. Alive.
    lost, lost_on = lost_nodes(current, nodes)
    nodes_now = _nodes([p for p in current if not p.deleted])
    if deleting:
        observed = base(phase=ObjectPhase.STOPPING, restarts=restarts, cause=lost, nodes=nodes_now)
    elif gate is GateState.ADMIN_HELD:
        held = Cause(kind=CauseKind.HELD, provenance=Provenance.SCHEDULER, detail=gate_words)
        observed = base(phase=ObjectPhase.PENDING, restarts=restarts, cause=held)
    elif gate is GateState.CLOSED:
        observed = base(phase=ObjectPhase.PENDING, restarts=restarts)
    elif lost is not None:
        observed = base(
            phase=ObjectPhase.RUNNING,
            restarts=restarts,
            cause=lost,
            nodes=tuple(sorted({*nodes_now, *lost_on})),
        )
    elif any(p.phase == "Running" and not p.deleting and not p.deleted for p in current):
        observed = base(phase=ObjectPhase.RUNNING, restarts=restarts, nodes=nodes_now)
    elif any(p.deleting or p.finished for p in current if not p.deleted) and not suspended:
        observed = base(phase=ObjectPhase.STOPPING, restarts=restarts, nodes=nodes_now)
    else:
        observed = base(phase=ObjectPhase.PENDING, restarts=restarts, nodes=nodes_now)
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

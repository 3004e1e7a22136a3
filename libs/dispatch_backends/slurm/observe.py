"""From what one poll printed to what dispatch sees of each object (pure, given a memory).

:func:`observe_all` takes the parsed ``squeue`` jobs, ``sacct`` rows and ``sinfo`` nodes of
one poll and returns the objects by dispatch job id. Only jobs named ``dj-<job id>`` are
dispatch's; one whose comment doesn't carry dispatch's tag for that same job is *foreign*
(seed 002: submission and attempt ``None``), and is shown but never touched.

**Executions.** A job Slurm requeued (restart count R > 0) lives on; its earlier runs are
``executions``, each with the nodes slurmctld showed it running on (else its sacct row's
NodeList) and the cause its own sacct row names ([D] ``deploy/slurm/README.md``:
with ``--duplicates`` every run is a row, the k-th row's State is the k-th run's end:
``REQUEUED``, ``NODE_FAIL``, ``PREEMPTED``, or ``FAILED 1:0`` for a failed job requeued by
``scontrol``). sacct lags slurmctld: a run whose row is missing or not final yet is not
reported (nor any later one, nor the job's own end: they are reported in order; an ended job
shows ``stopping`` meanwhile) until the row turns up, or until ``accounting_grace_s`` after
the backend first saw that restart count; then the run is reported ``unknown`` with words
saying accounting didn't say why. Without accounting it is
reported ``unknown`` at once ("Slurm requeued the job; without accounting nothing says why").

**An ended job** gets its cause from the table in :mod:`.causes`, with slurmctld's state,
exit status and reason, and sacct's State when sacct has the run (it names the uid of a
cancel). A ``CANCELLED`` job that sacct doesn't show yet is reported ``stopping`` until it
does (or for ``accounting_grace_s`` at most), so that its cause names the actor.

**A lost node** (sinfo: not responding, or down) under a running job: the
job is running with cause ``node-lost`` (``at`` = when the backend first saw it), the one
case where a running object carries a cause; the planner fences it after the declared
node-loss window (seed 000).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from dispatch_backends.protocol import object_name
from dispatch_backends.slurm.causes import (
    ADMIN_HOLD,
    actor_uid,
    cancel_actor,
    end_cause,
    gate_of,
    held_cause,
    phase_of,
    run_cause,
)
from dispatch_backends.slurm.parse import (
    AcctRow,
    NodeState,
    QueueJob,
    parse_comment,
    runs,
)
from dispatch_backends.slurm.settings import Accounting
from dispatch_core.state import (
    Cause,
    CauseKind,
    Execution,
    GateState,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    is_job_id,
)

__all__ = ["Memory", "dispatch_job_id", "observe", "observe_all"]

UserName = Callable[[int], str | None]
"""Resolves a uid to a user name (``None`` when unknown)."""


def _no_names(uid: int) -> str | None:
    del uid
    return None


@dataclasses.dataclass
class Memory:
    """What the backend remembers between polls: when it first saw something it waits on
    (a lost node, a requeue sacct hasn't named, a cancel sacct hasn't shown). Keys start with
    the job's raw id; :meth:`forget_except` drops jobs slurmctld no longer shows."""

    first_seen: dict[tuple[str, str], datetime] = dataclasses.field(default_factory=dict)
    run_nodes: dict[tuple[str, int], tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """The nodes slurmctld showed each run on while it ran (job raw id, restart count):
    sacct's NodeList of a run can hold only the batch host when its start reached slurmdbd
    late (measured on a 3-node job)."""

    def since(self, raw_id: str, what: str, now: datetime) -> datetime:
        """When ``what`` of job ``raw_id`` was first seen (``now`` the first time)."""
        return self.first_seen.setdefault((raw_id, what), now)

    def forget(self, raw_id: str, what: str) -> None:
        """Drop ``what`` of job ``raw_id``."""
        self.first_seen.pop((raw_id, what), None)

    def forget_except(self, raw_ids: Iterable[str]) -> None:
        """Drop everything about jobs not in ``raw_ids``."""
        keep = set(raw_ids)
        for key in [k for k in self.first_seen if k[0] not in keep]:
            del self.first_seen[key]
        for run in [k for k in self.run_nodes if k[0] not in keep]:
            del self.run_nodes[run]


def dispatch_job_id(name: str) -> str | None:
    """The dispatch job id of a Slurm job named ``dj-<job id>``, else ``None``."""
    if not name.startswith("dj-"):
        return None
    job = name[3:]
    return job if is_job_id(job) and object_name(job) == name else None


def _scheduler(kind: CauseKind, text: str, at: datetime | None = None) -> Cause:
    return Cause(kind=kind, provenance=Provenance.SCHEDULER, detail=text, at=at)


def _own_runs(job: QueueJob, rows: Sequence[AcctRow]) -> list[AcctRow]:
    """The job's runs in sacct: rows of its raw id whose name is the job's (or sacct's lag
    artifact ``allocation``), so a reused job id of another job is never read."""
    return [r for r in runs(rows, job.raw_id) if r.name in (job.name, "allocation", "")]


def _executions(
    job: QueueJob,
    own: Sequence[AcctRow] | None,
    *,
    accounting: Accounting,
    grace: timedelta,
    now: datetime,
    memory: Memory,
    user_name: UserName,
) -> tuple[Execution, ...]:
    out: list[Execution] = []
    for restart in range(job.restarts):
        row = own[restart] if own is not None and restart < len(own) else None
        cause: Cause | None = None
        nodes: tuple[str, ...] = ()
        if row is not None:
            uid = actor_uid(row.state)
            actor = cancel_actor(uid, user_name(uid)) if uid is not None else None
            cause = run_cause(
                row.state,
                row.exit,
                actor=actor,
                at=row.end,
                jobcomp=accounting is Accounting.JOBCOMP,
            )
            nodes = memory.run_nodes.get((job.raw_id, restart), row.nodes)
        if cause is None:
            if accounting is Accounting.NONE:
                cause = _scheduler(
                    CauseKind.UNKNOWN,
                    f"Slurm requeued the job (restart {restart + 1}); without accounting "
                    "nothing says why",
                )
            else:
                since = memory.since(job.raw_id, f"run{restart}", now)
                if now - since < grace:
                    break
                cause = _scheduler(
                    CauseKind.UNKNOWN,
                    f"Slurm requeued the job (restart {restart + 1}); accounting did not "
                    f"say why within {grace.total_seconds():g} s",
                )
        memory.forget(job.raw_id, f"run{restart}")
        nodes = memory.run_nodes.get((job.raw_id, restart), nodes)
        out.append(Execution(restart=restart, cause=cause, nodes=nodes))
    return tuple(out)


def _lost(job: QueueJob, nodes: Mapping[str, NodeState] | None) -> list[NodeState]:
    if not nodes:
        return []
    return [nodes[n] for n in job.nodes if n in nodes and nodes[n].lost]


def _node_words(lost: Sequence[NodeState]) -> str:
    parts = []
    for node in lost:
        text = f"node {node.name} {node.state}"
        if node.reason and node.reason != "none":
            text += f" ({node.reason})"
        parts.append(text)
    return "; ".join(parts)


def observe(
    job: QueueJob,
    rows: Sequence[AcctRow] | None,
    nodes: Mapping[str, NodeState] | None,
    *,
    cluster: str,
    now: datetime,
    memory: Memory,
    accounting: Accounting = Accounting.SLURMDBD,
    grace_s: float = 30.0,
    user_name: UserName = _no_names,
) -> ObservedObject | None:
    """What dispatch sees of Slurm job ``job``; ``None`` when it isn't named for a dispatch
    job (see the module docstring).

    Args:
        job: the job as squeue shows it.
        rows: this poll's sacct rows (of any jobs), or ``None`` when accounting was not
            asked or could not be read this poll.
        nodes: this poll's sinfo nodes, or ``None`` when not asked.
        cluster: the cluster (of the ref).
        now: the time of the poll.
        memory: what earlier polls saw (updated).
        accounting: where causes come from.
        grace_s: seconds to wait for sacct (``accounting_grace_s``).
        user_name: resolves the uid of ``CANCELLED by <uid>``.
    """
    job_id = dispatch_job_id(job.name)
    if job_id is None:
        return None
    tag = parse_comment(job.comment)
    own_tag = tag is not None and tag.job == job_id
    grace = timedelta(seconds=grace_s)
    own_runs = _own_runs(job, rows) if rows is not None else None
    phase = phase_of(job.state, job.flags)
    gate = gate_of(job.state, job.reason)
    if phase in (ObjectPhase.RUNNING, ObjectPhase.STOPPING) and job.nodes:
        memory.run_nodes[(job.raw_id, job.restarts)] = job.nodes
    executions = _executions(
        job,
        own_runs,
        accounting=accounting,
        grace=grace,
        now=now,
        memory=memory,
        user_name=user_name,
    )
    cause: Cause | None = None
    if phase is ObjectPhase.ENDED and len(executions) < job.restarts:
        phase = ObjectPhase.STOPPING  # its earlier runs are reported first, in order
    if phase is ObjectPhase.ENDED:
        current = (
            own_runs[job.restarts]
            if own_runs is not None and job.restarts < len(own_runs)
            else None
        )
        words = job.state
        if current is not None and current.base_state == job.state:
            words = current.state
        uid = actor_uid(words)
        if (
            job.state == "CANCELLED"
            and uid is None
            and accounting is Accounting.SLURMDBD
            and now - memory.since(job.raw_id, "cancel", now) < grace
        ):
            phase = ObjectPhase.STOPPING  # sacct will name who cancelled it
        else:
            memory.forget(job.raw_id, "cancel")
            cause = end_cause(
                job.state,
                words=words,
                exit=job.exit if job.exit is not None else (current.exit if current else None),
                reason=job.reason,
                ran=bool(job.nodes),
                actor=cancel_actor(uid, user_name(uid)) if uid is not None else None,
                at=job.end,
            )
    elif phase in (ObjectPhase.RUNNING, ObjectPhase.STOPPING):
        lost = _lost(job, nodes)
        key = f"node-lost/{job.restarts}"
        if lost:
            cause = _scheduler(
                CauseKind.NODE_LOST, _node_words(lost), memory.since(job.raw_id, key, now)
            )
        else:
            memory.forget(job.raw_id, key)
    elif gate is GateState.ADMIN_HELD:
        cause = held_cause(job.state, job.reason or ADMIN_HOLD)
    elif phase is ObjectPhase.UNKNOWN:
        cause = _scheduler(CauseKind.UNKNOWN, f"{job.state} ({job.reason})".strip())
    return ObservedObject(
        ref=ObjectRef(cluster=cluster, id=job.raw_id),
        name=job.name,
        submission=tag.submission if own_tag and tag is not None else None,
        attempt=tag.attempt if own_tag and tag is not None else None,
        phase=phase,
        cause=cause,
        gate=gate,
        restarts=job.restarts,
        executions=executions,
        nodes=job.nodes,
    )


def observe_all(
    jobs: Iterable[QueueJob],
    rows: Sequence[AcctRow] | None,
    nodes: Mapping[str, NodeState] | None,
    *,
    cluster: str,
    now: datetime,
    memory: Memory,
    accounting: Accounting = Accounting.SLURMDBD,
    grace_s: float = 30.0,
    user_name: UserName = _no_names,
) -> dict[str, tuple[ObservedObject, ...]]:
    """Every dispatch object of one poll, by dispatch job id (see :func:`observe`); the
    memory of jobs slurmctld no longer shows is dropped."""
    found: dict[str, list[ObservedObject]] = {}
    seen = []
    for job in jobs:
        seen.append(job.raw_id)
        observed = observe(
            job,
            rows,
            nodes,
            cluster=cluster,
            now=now,
            memory=memory,
            accounting=accounting,
            grace_s=grace_s,
            user_name=user_name,
        )
        if observed is not None:
            job_id = dispatch_job_id(job.name)
            assert job_id is not None
            found.setdefault(job_id, []).append(observed)
    memory.forget_except(seen)
    return {job_id: tuple(objects) for job_id, objects in found.items()}

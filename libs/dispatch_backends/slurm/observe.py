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

**Memory** ([R] ``causes.py``, "Steps corroborate memory"): a run whose job row says
``OUT_OF_MEMORY`` or ``FAILED`` is judged with its step rows (read in the same batched
sacct call); while slurmctld shows it ended by a signal, ``0:125`` or ``OUT_OF_MEMORY`` and
sacct has not the run's final batch step yet, it is reported ``stopping`` (at most
``accounting_grace_s``), so that the steps can say what happened.

**Gone is not ended** (:func:`observe_gone`): a job the backend (or its caller, through
``expected``) last saw alive that slurmctld no longer lists (it aged out after
``MinJobAge``, for example while the observer was cut off) is looked up in the same poll's
sacct rows: its last run's final row gives an ended object with the real cause (and its
earlier runs their executions); dispatch's tag comes from what the backend saw, else from
sacct's ``Comment`` or ``SubmitLine``. A job accounting has no final row for, once
``accounting_grace_s`` has passed since it was first missed, is *vanished* (the scheduler
has no word for it); without accounting at once. While accounting can't be read nothing is
decided.

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
    ENDED_STATES,
    actor_uid,
    cancel_actor,
    end_cause,
    gate_of,
    held_cause,
    pending_cause,
    phase_of,
    run_cause,
    step_verdict,
)
from dispatch_backends.slurm.parse import (
    AcctRow,
    NodeState,
    QueueJob,
    parse_comment,
    runs,
    steps_of,
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

__all__ = ["Alive", "Memory", "dispatch_job_id", "observe", "observe_all", "observe_gone"]

UserName = Callable[[int], str | None]
"""Resolves a uid to a user name (``None`` when unknown)."""


def _no_names(uid: int) -> str | None:
    del uid
    return None


@dataclasses.dataclass(frozen=True)
class Alive:
    """A job of dispatch's the backend last saw alive (not ended): what it needs to report
    the job once slurmctld has forgotten it."""

    job_id: str
    name: str
    submission: int | None
    attempt: int | None


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
    alive: dict[str, Alive] = dataclasses.field(default_factory=dict)
    """The jobs last seen alive, by raw id (see "Gone is not ended")."""

    def since(self, raw_id: str, what: str, now: datetime) -> datetime:
        """When ``what`` of job ``raw_id`` was first seen (``now`` the first time)."""
        return self.first_seen.setdefault((raw_id, what), now)

    def forget(self, raw_id: str, what: str) -> None:
        """Drop ``what`` of job ``raw_id``."""
        self.first_seen.pop((raw_id, what), None)

    def forget_except(self, raw_ids: Iterable[str]) -> None:
        """Drop everything about jobs not in ``raw_ids``."""
        keep = set(raw_ids) | set(self.alive)
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
    rows: Sequence[AcctRow] = (),
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
            if cause is not None:
                cause = _with_steps(cause, row, rows)
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


def _with_steps(cause: Cause, row: AcctRow, rows: Sequence[AcctRow]) -> Cause:
    """``cause`` of the run ``row``, or what its step rows say about memory instead."""
    verdict = step_verdict(
        cause.detail,
        row.base_state,
        row.exit,
        steps_of(rows, row),
        job_row=row,
        at=cause.at,
    )
    return verdict if verdict is not None else cause


def _memory_suspect(job: QueueJob) -> bool:
    """slurmctld shows an end the step rows may overturn: ``OUT_OF_MEMORY``, or ``FAILED``
    by a signal (``0:9``) or with ``0:125``."""
    if job.state == "OUT_OF_MEMORY":
        return True
    return job.state == "FAILED" and job.exit is not None and job.exit.code == 0


def _batch_final(run: AcctRow | None, rows: Sequence[AcctRow]) -> bool:
    if run is None or run.base_state not in ENDED_STATES:
        return False
    batch = [r for r in steps_of(rows, run) if r.step == "batch"]
    return bool(batch) and batch[0].base_state in ENDED_STATES


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
        rows=rows or (),
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
        elif (
            _memory_suspect(job)
            and accounting is Accounting.SLURMDBD
            and not _batch_final(current, rows or ())
            and now - memory.since(job.raw_id, "steps", now) < grace
        ):
            phase = ObjectPhase.STOPPING  # sacct's step rows will say whether memory ran out
        else:
            memory.forget(job.raw_id, "cancel")
            memory.forget(job.raw_id, "steps")
            cause = end_cause(
                job.state,
                words=words,
                exit=job.exit if job.exit is not None else (current.exit if current else None),
                reason=job.reason,
                ran=bool(job.nodes),
                actor=cancel_actor(uid, user_name(uid)) if uid is not None else None,
                at=job.end,
            )
            if current is not None and rows is not None:
                verdict = step_verdict(
                    cause.detail,
                    job.state,
                    job.exit if job.exit is not None else current.exit,
                    steps_of(rows, current),
                    job_row=current,
                    at=job.end,
                )
                cause = verdict if verdict is not None else cause
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
    elif phase is ObjectPhase.PENDING and gate is GateState.OPEN:
        cause = pending_cause(job.state, job.reason)
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
    memory of jobs slurmctld no longer shows is dropped, except of those last seen alive
    (:func:`observe_gone` looks them up)."""
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
            if observed.phase is ObjectPhase.ENDED:
                memory.alive.pop(job.raw_id, None)
            else:
                memory.alive[job.raw_id] = Alive(
                    job_id=job_id,
                    name=job.name,
                    submission=observed.submission,
                    attempt=observed.attempt,
                )
    memory.forget_except(seen)
    return {job_id: tuple(objects) for job_id, objects in found.items()}


def _gone_runs(raw_id: str, rows: Sequence[AcctRow], seen: Alive | None) -> list[AcctRow]:
    """The runs of a job slurmctld forgot: rows of its raw id named as the backend saw it
    (or, for a job only the caller expected, named for a dispatch job), plus sacct's lag
    artifact ``allocation``."""
    own = runs(rows, raw_id)
    if seen is not None:
        return [r for r in own if r.name in (seen.name, "allocation", "")]
    named = [r for r in own if dispatch_job_id(r.name) is not None]
    if not named:
        return []
    return [r for r in own if r.name in (named[0].name, "allocation", "")]


def observe_gone(
    refs: Iterable[ObjectRef],
    rows: Sequence[AcctRow] | None,
    *,
    now: datetime,
    memory: Memory,
    accounting: Accounting = Accounting.SLURMDBD,
    grace_s: float = 30.0,
    user_name: UserName = _no_names,
) -> tuple[dict[str, tuple[ObservedObject, ...]], tuple[ObjectRef, ...]]:
    """The jobs ``refs`` (last seen alive, no longer listed by slurmctld) as accounting
    ends them: the ended objects by dispatch job id, and the refs accounting has no word for
    (*vanished*); a ref in neither waits for a later poll (see "Gone is not ended").

    Args:
        refs: the gone jobs.
        rows: this poll's sacct rows (job and step rows of every job asked), or ``None``
            when accounting could not be read (then nothing is decided).
        now: the time of the poll.
        memory: what earlier polls saw (a job reported ended or vanished is forgotten).
        accounting: where ends are kept (``none``: nowhere, so every gone job is vanished).
        grace_s: seconds a missing or unfinished sacct row is waited for.
        user_name: resolves the uid of ``CANCELLED by <uid>``.
    """
    found: dict[str, list[ObservedObject]] = {}
    vanished: list[ObjectRef] = []
    grace = timedelta(seconds=grace_s)
    for ref in refs:
        seen = memory.alive.get(ref.id)
        if seen is not None and not seen.job_id:
            seen = None  # only the caller expected it: sacct's rows name it
        if accounting is not Accounting.NONE:
            if rows is None:
                continue
            own = _gone_runs(ref.id, rows, seen)
            last = own[-1] if own else None
            named = next((r for r in own if dispatch_job_id(r.name) is not None), None)
            if last is not None and last.base_state in ENDED_STATES and named is not None:
                job_id = seen.job_id if seen is not None else dispatch_job_id(named.name)
                assert job_id is not None
                found.setdefault(job_id, []).append(
                    _ended_from_accounting(
                        ref, own, rows, seen, named, accounting=accounting, user_name=user_name
                    )
                )
                _forget_gone(memory, ref.id)
                continue
            if now - memory.since(ref.id, "gone", now) < grace:
                if seen is None:
                    memory.alive[ref.id] = Alive(job_id="", name="", submission=None, attempt=None)
                continue
        vanished.append(ref)
        _forget_gone(memory, ref.id)
    return {job_id: tuple(objs) for job_id, objs in found.items()}, tuple(vanished)


def _forget_gone(memory: Memory, raw_id: str) -> None:
    memory.alive.pop(raw_id, None)
    memory.forget(raw_id, "gone")


def _ended_from_accounting(
    ref: ObjectRef,
    own: Sequence[AcctRow],
    rows: Sequence[AcctRow],
    seen: Alive | None,
    named: AcctRow,
    *,
    accounting: Accounting,
    user_name: UserName,
) -> ObservedObject:
    """A gone job's ended object, from its runs in sacct (the last one ended)."""
    submission: int | None = None
    attempt: int | None = None
    if seen is not None and seen.submission is not None:
        submission, attempt = seen.submission, seen.attempt
    else:
        job_id = dispatch_job_id(named.name)
        tag = next(
            (t for r in own if (t := r.tag) is not None and t.job == job_id),
            None,
        )
        submission = tag.submission if tag is not None else None
        attempt = tag.attempt if tag is not None else None
    executions: list[Execution] = []
    for restart, row in enumerate(own[:-1]):
        uid = actor_uid(row.state)
        cause = run_cause(
            row.state,
            row.exit,
            actor=cancel_actor(uid, user_name(uid)) if uid is not None else None,
            at=row.end,
            jobcomp=accounting is Accounting.JOBCOMP,
        ) or _scheduler(
            CauseKind.UNKNOWN, f"Slurm requeued the job (restart {restart + 1}): {row.state}"
        )
        executions.append(
            Execution(restart=restart, cause=_with_steps(cause, row, rows), nodes=row.nodes)
        )
    last = own[-1]
    uid = actor_uid(last.state)
    cause = end_cause(
        last.base_state,
        words=last.state,
        exit=last.exit,
        ran=last.start is not None,
        actor=cancel_actor(uid, user_name(uid)) if uid is not None else None,
        at=last.end,
    )
    return ObservedObject(
        ref=ref,
        name=seen.name if seen is not None and seen.name else named.name,
        submission=submission,
        attempt=attempt,
        phase=ObjectPhase.ENDED,
        cause=_with_steps(cause, last, rows),
        gate=GateState.OPEN,
        restarts=len(own) - 1,
        executions=tuple(executions),
        nodes=last.nodes,
    )

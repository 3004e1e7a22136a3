"""The cause table: from Slurm's words to a :class:`Cause` (pure; no I/O).

Slurm's own words are kept verbatim in ``Cause.detail``: the State (from sacct when it has
the job, which names the uid of a cancel: ``CANCELLED by 0``; else from slurmctld), the
exit status ``code:signal`` (slurmctld's, which keeps the signal that sacct's job row zeroes
for jobs Slurm ended), and slurmctld's state reason in brackets when it has one. For
example ``FAILED 3:0 (NonZeroExitCode)``, ``CANCELLED by 0 0:15``, ``TIMEOUT 0:15
(TimeLimit)``, ``FAILED 0:9 (JobLaunchFailure)``. sacct's own ``Reason`` is left out: it is
the job's last *pending* reason, never why it ended (deploy/slurm/README.md, "Other traps").

Sources: [D] ``deploy/slurm/README.md`` "Findings" (real Slurm 22.05 with accounting), [L]
``shared/slurm-lab/README.md`` "Observed strings per scenario", [S] Slurm's documented job
state codes (``squeue(1)`` "JOB STATE CODES"), [J] Slurm's documented pending reasons
("Job Reason Codes"), [0] seed 000 (never stretch the list:
``unknown`` with the words, never a guess).

=================================  ===============  ===========  ==========  =========
Slurm says (State, exit)           kind             provenance   exit_code   source
=================================  ===============  ===========  ==========  =========
``COMPLETED``                      ``none``         application  0           [L] exit 0
``FAILED`` ``N:0``, N > 0          non-zero-exit    application  N           [L] exit 1/3
``FAILED`` ``0:S`` (a signal)      ``unknown``      scheduler    ``None``    [L] OOM
                                                                             without cgroup
                                                                             is ``FAILED
                                                                             0:9
                                                                             JobLaunchFailure``:
                                                                             a SIGKILL,
                                                                             cause unsaid
``FAILED`` ``0:0`` or no code      ``unknown``      scheduler    ``None``    [0]
``TIMEOUT``                        time-limit       scheduler    ``None``    [L], [D] codes
                                                                             racy (``0:15``
                                                                             or ``143:0``):
                                                                             by State only
``PREEMPTED``                      preempted        scheduler    ``None``    [L] CANCEL mode;
                                                                             [D] sacct row of
                                                                             a REQUEUE-mode
                                                                             run
``NODE_FAIL``                      node-lost        scheduler    ``None``    [L], [D]
``OUT_OF_MEMORY``                  out-of-memory    scheduler    ``None``    [L] cgroup
                                                                             ``0:125``
``CANCELLED by <uid>``             cancelled        actor (uid)  ``None``    [D] sacct
``CANCELLED`` (no uid known)       cancelled        scheduler    ``None``    [L] squeue,
                                                                             jobcomp
``REQUEUED`` (an earlier run)      requeued         scheduler    ``None``    [D] ``scontrol
                                                                             requeue``
``PENDING`` (an earlier run, the   requeued         scheduler    ``None``    [L] jobcomp
jobcomp file)                                                                file
``BOOT_FAIL``                      launch-failed    scheduler    ``None``    [S] "terminated
                                                                             due to launch
                                                                             failure,
                                                                             typically
                                                                             hardware"
``DEADLINE``, after it ran         time-limit       scheduler    ``None``    [S] "terminated
                                                                             on deadline"
``DEADLINE``, never ran            ``unknown``      scheduler    ``None``    [0] why it never
                                                                             started is
                                                                             unsaid
``REVOKED`` and anything else      ``unknown``      scheduler    ``None``    [0]
=================================  ===============  ===========  ==========  =========

**Steps corroborate memory** (:func:`step_verdict`; sacct's job *and* step rows of the run,
read in the same batched call; [R] ``tests/data/slurm/<scenario>/end``, recorded by
``deploy/slurm/record-steps.sh``). Applied to a run whose job row (or slurmctld) says
``OUT_OF_MEMORY`` or ``FAILED``, in this order:

======================================================  ===============  =====================
job row; steps                                          kind             recorded
======================================================  ===============  =====================
``OUT_OF_MEMORY``; ``batch`` ``COMPLETED 0:0``           ``none`` (exit   ``oom-cgroup-child``:
                                                        0), both rows'   a child OOM-killed,
                                                        words kept       the script went on
                                                                         (galaxy#6832)
any step ``OUT_OF_MEMORY``                              out-of-memory    ``oom-cgroup-steps``
``FAILED 0:125``                                        out-of-memory    constructed
                                                                         (``sacct-oom.txt``)
a step killed by signal 9 whose ``MaxRSS`` reached its  out-of-memory,   ``oom-steps``
memory request (``AllocTRES`` ``mem=``, else            both figures in  (OverMemoryKill
``ReqMem``)                                             the detail       without cgroup:
                                                                         ``FAILED 0:9
                                                                         (JobLaunchFailure)``)
======================================================  ===============  =====================

Otherwise the table above stands (a signal 9 under the request stays ``unknown``). 22.05's
accounting has no oom-kill count (``sacct --helpformat`` lists none); the cgroup plugin's
count reaches accounting only as the step's ``OUT_OF_MEMORY`` state, which the second row
reads.

**Gates** ([L] holds): ``PENDING`` with reason ``JobHeldUser`` is dispatch's own closed gate
(``sbatch --hold``; also ``scontrol uhold`` and ``requeuehold``, which read the same);
``JobHeldAdmin`` is ``admin-held`` (cause ``held``, provenance scheduler, the words kept);
so are ``SPECIAL_EXIT`` and ``RESV_DEL_HOLD`` (held by Slurm itself, [S]). Anything else is
open.

**Waiting for capacity** ([J] Slurm's "Job Reason Codes", slurm.schedmd.com/job_reason_codes.html;
[L] the test cluster with every node set down: squeue's ``%r`` says ``Nodes required for job are
DOWN, DRAINED or reserved for jobs in higher priority partitions``). A pending job whose gate is
open and whose reason says the capacity it asks for is not there is shown with cause
``no-capacity`` (provenance scheduler, ``PENDING (<reason>)`` as Slurm said it); phase stays
``pending``. A rule covering ``no-capacity`` stops it after its ``wait_s`` and applies itself
(docs/core-semantics.md, "No capacity"). Matched on the reason's first comma-separated part
(``ReqNodeNotAvail, UnavailableNodes:node[1-3]`` is ``ReqNodeNotAvail``), or the whole:

=========================================================  ===============  =================
pending reason                                             cause            why
=========================================================  ===============  =================
``ReqNodeNotAvail`` (``, UnavailableNodes:...``)           no-capacity      [J] a required
                                                                            node is down,
                                                                            drained,
                                                                            reserved or not
                                                                            responding
``Nodes required for job are DOWN, DRAINED or reserved     no-capacity      [L], [J] (its
for jobs in higher priority partitions``                                    code name joins
                                                                            the words with
                                                                            ``_``)
``NodeDown``                                               no-capacity      [J] a required
                                                                            node is down
``PartitionDown``, ``PartitionInactive``                   no-capacity      [J] the partition
                                                                            can't start jobs
``PartitionNodeLimit``                                     no-capacity      [J] outside the
                                                                            partition's
                                                                            current node
                                                                            limits, or its
                                                                            nodes are down
``Resources``, ``Priority``                                none             ordinary queueing
                                                                            on a busy
                                                                            cluster: it will
                                                                            run (see below)
anything else (``Dependency``, ``BeginTime``,              none             the job's own
``AssocGrp*``, ``QOS*``, ``Reservation``, ...)                              limits or
                                                                            wishes, not the
                                                                            cluster's
                                                                            capacity
=========================================================  ===============  =================

``Resources`` is not ``no-capacity``: it is the job waiting its turn for nodes that exist and
are busy, and a long queue is not a cluster without capacity (failing over on it would move
every job of a busy cluster elsewhere after ``wait_s``). Slurm's backfill can briefly show
``ReqNodeNotAvail`` for a healthy cluster (reframe#1049); ``wait_s`` is what absorbs that.
With ``queue_format = "json"`` squeue's ``state_reason`` is the code alone (``Resources`` for
a job whose nodes are all down, the words in ``state_description``), so only the text format
reports the second row.

**Phases**: ``PENDING``, ``CONFIGURING`` (nodes booting), ``REQUEUE_HOLD``, ``REQUEUED``,
``REQUEUE_FED``, ``SPECIAL_EXIT``, ``RESV_DEL_HOLD`` are ``pending``; ``RUNNING``,
``SUSPENDED``, ``STOPPED``, ``RESIZING`` are ``running`` (the processes exist);
``COMPLETING``, ``SIGNALING``, ``STAGE_OUT`` are ``stopping``; the ending states above are
``ended``; anything else is ``unknown`` with the words.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

from dispatch_backends.slurm.parse import AcctRow, ExitStatus, parse_memory
from dispatch_core.state import (
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    GateState,
    ObjectPhase,
    Provenance,
)

__all__ = [
    "ADMIN_HOLD",
    "ENDED_STATES",
    "NO_CAPACITY_REASONS",
    "USER_HOLD",
    "USER_HOLDS",
    "actor_uid",
    "cancel_actor",
    "detail",
    "end_cause",
    "gate_of",
    "held_cause",
    "pending_cause",
    "phase_of",
    "run_cause",
    "step_verdict",
]

ENDED_STATES: Final = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "CANCELLED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)
"""States in which the job (this run of it) is over [S]."""

_PENDING_STATES: Final = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "REQUEUE_HOLD",
        "REQUEUED",
        "REQUEUE_FED",
        "SPECIAL_EXIT",
        "RESV_DEL_HOLD",
    }
)
_RUNNING_STATES: Final = frozenset({"RUNNING", "SUSPENDED", "STOPPED", "RESIZING"})
_STOPPING_STATES: Final = frozenset({"COMPLETING", "SIGNALING", "STAGE_OUT"})
_STOPPING_FLAGS: Final = frozenset({"COMPLETING", "SIGNALING", "STAGE_OUT"})

USER_HOLD: Final = "JobHeldUser"
"""The pending reason of dispatch's own gate, ``sbatch --hold`` [L]."""
USER_HOLDS: Final = frozenset({USER_HOLD, "job requeued in held state"})
"""Pending reasons of a user hold: ``sbatch --hold``, ``scontrol uhold``, and ``scontrol
requeuehold`` (squeue's ``%r`` spells that one ``job requeued in held state``, json
``JobHeldUser``) [L]. ``scontrol release`` lifts each."""
ADMIN_HOLD: Final = "JobHeldAdmin"
"""The pending reason of an administrator's hold, ``scontrol hold`` by root [L]."""
_SYSTEM_HOLD_STATES: Final = frozenset({"SPECIAL_EXIT", "RESV_DEL_HOLD"})


def phase_of(state: str, flags: frozenset[str] = frozenset()) -> ObjectPhase:
    """The phase of a job in ``state`` (with v0.0.40+ state ``flags``)."""
    if state in ENDED_STATES:
        return ObjectPhase.STOPPING if flags & _STOPPING_FLAGS else ObjectPhase.ENDED
    if state in _STOPPING_STATES or flags & _STOPPING_FLAGS:
        return ObjectPhase.STOPPING
    if state in _RUNNING_STATES:
        return ObjectPhase.RUNNING
    if state in _PENDING_STATES:
        return ObjectPhase.PENDING
    return ObjectPhase.UNKNOWN


def gate_of(state: str, reason: str) -> GateState:
    """The start gate of a job (see the module docstring, "Gates")."""
    if state in _SYSTEM_HOLD_STATES:
        return GateState.ADMIN_HELD
    if state not in _PENDING_STATES:
        return GateState.OPEN
    if reason == ADMIN_HOLD:
        return GateState.ADMIN_HELD
    if reason in USER_HOLDS:
        return GateState.CLOSED
    return GateState.OPEN


def detail(words: str, exit: ExitStatus | None = None, reason: str = "") -> str:
    """Slurm's words: ``<State> <code:signal> (<reason>)`` (parts that are missing are left
    out; a reason ``None`` is no reason)."""
    text = words
    if exit is not None:
        text += f" {exit.words}"
    if reason and reason != "None":
        text += f" ({reason})"
    return text


def held_cause(state: str, reason: str, at: datetime | None = None) -> Cause:
    """The cause of an admin-held gate: ``held``, provenance scheduler, Slurm's words."""
    return Cause(
        kind=CauseKind.HELD,
        provenance=Provenance.SCHEDULER,
        detail=detail(state, None, reason),
        at=at,
    )


NO_CAPACITY_REASONS: Final = frozenset(
    {
        "ReqNodeNotAvail",
        "Nodes required for job are DOWN",
        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
        "partitions",
        "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_"
        "partitions",
        "NodeDown",
        "PartitionDown",
        "PartitionInactive",
        "PartitionNodeLimit",
    }
)
"""Pending reasons that say the capacity a job asks for is not there (see the module
docstring, "Waiting for capacity"); matched on the whole reason or its first comma-separated
part."""


def pending_cause(state: str, reason: str, at: datetime | None = None) -> Cause | None:
    """The cause of a pending job whose gate is open: ``no-capacity`` (provenance scheduler,
    Slurm's words ``<State> (<reason>)``) when ``reason`` is one of ``NO_CAPACITY_REASONS``,
    else ``None`` (nothing to say: it waits its turn)."""
    words = reason.strip()
    if words not in NO_CAPACITY_REASONS and words.split(",", 1)[0].strip() not in (
        NO_CAPACITY_REASONS
    ):
        return None
    return _scheduler(CauseKind.NO_CAPACITY, detail(state, None, words), at)


def cancel_actor(uid: int, user: str | None = None) -> Actor:
    """The actor of ``CANCELLED by <uid>``: ``<user> (uid N)`` when the uid resolves, else
    ``uid N``. A Slurm user is taken for a person (dispatch recognises its own stops from the
    record, not from the uid)."""
    name = f"{user} (uid {uid})" if user else f"uid {uid}"
    return Actor(name=name, kind=ActorKind.HUMAN)


_SCHEDULER_KINDS: Final = {
    "TIMEOUT": CauseKind.TIME_LIMIT,
    "PREEMPTED": CauseKind.PREEMPTED,
    "NODE_FAIL": CauseKind.NODE_LOST,
    "OUT_OF_MEMORY": CauseKind.OUT_OF_MEMORY,
    "REQUEUED": CauseKind.REQUEUED,
    "BOOT_FAIL": CauseKind.LAUNCH_FAILED,
}
"""The end states the scheduler alone decides, and their cause (an unlisted one: unknown).
``FAILED``, ``CANCELLED`` and ``DEADLINE`` look further (:func:`end_cause`)."""


def _scheduler(kind: CauseKind, text: str, at: datetime | None) -> Cause:
    return Cause(kind=kind, provenance=Provenance.SCHEDULER, detail=text, at=at)


def end_cause(
    state: str,
    *,
    words: str | None = None,
    exit: ExitStatus | None = None,
    reason: str = "",
    ran: bool = True,
    actor: Actor | None = None,
    at: datetime | None = None,
) -> Cause:
    """The cause of a run that ended in ``state`` (the table in the module docstring).

    Args:
        state: the base state (``CANCELLED``, not ``CANCELLED by 0``).
        words: the State verbatim, when a source says more (sacct's ``CANCELLED by 0``);
            default ``state``.
        exit: the exit status, when known.
        reason: slurmctld's state reason (``NonZeroExitCode``, ``TimeLimit``, ...).
        ran: whether the run started (``DEADLINE`` is a time limit only then).
        actor: who cancelled it (from ``CANCELLED by <uid>``), for ``CANCELLED``.
        at: when it ended, when known.
    """
    text = detail(words or state, exit, reason)
    match state:
        case "COMPLETED":
            return Cause(
                kind=CauseKind.NONE,
                provenance=Provenance.APPLICATION,
                detail=text,
                exit_code=exit.code if exit is not None and exit.signal == 0 else 0,
                at=at,
            )
        case "FAILED":
            if exit is not None and exit.signal == 0 and exit.code > 0:
                return Cause(
                    kind=CauseKind.NON_ZERO_EXIT,
                    provenance=Provenance.APPLICATION,
                    detail=text,
                    exit_code=exit.code,
                    at=at,
                )
            return _scheduler(CauseKind.UNKNOWN, text, at)
        case "CANCELLED":
            if actor is not None:
                return Cause(
                    kind=CauseKind.CANCELLED,
                    provenance=Provenance.ACTOR,
                    actor=actor,
                    detail=text,
                    at=at,
                )
            return _scheduler(CauseKind.CANCELLED, text, at)
        case "DEADLINE":
            return _scheduler(CauseKind.TIME_LIMIT if ran else CauseKind.UNKNOWN, text, at)
        case _:
            return _scheduler(_SCHEDULER_KINDS.get(state, CauseKind.UNKNOWN), text, at)


def actor_uid(words: str) -> int | None:
    """The uid of ``CANCELLED by <uid>`` (trailing words, if any, ignored), else ``None``."""
    parts = words.split()
    if len(parts) >= 3 and parts[0] == "CANCELLED" and parts[1] == "by" and parts[2].isdigit():
        return int(parts[2])
    return None


def run_cause(
    words: str,
    exit: ExitStatus | None,
    *,
    actor: Actor | None = None,
    at: datetime | None = None,
    jobcomp: bool = False,
) -> Cause | None:
    """The cause of an earlier run of a job Slurm requeued, from its sacct row; ``None``
    while the row is not final yet (sacct lags: treat "not final" as "not yet", [D]).

    Args:
        words: the row's State verbatim (``PREEMPTED``, ``NODE_FAIL``, ``REQUEUED``,
            ``FAILED``: a job requeued after it failed keeps its ``FAILED 1:0`` row, [L]).
        exit: the row's exit status (``0:0`` for every run Slurm ended, [D]).
        actor: the canceller, for ``CANCELLED by <uid>``.
        at: the row's end.
        jobcomp: the row comes from the jobcomp file, which records a requeue by
            ``scontrol`` as ``PENDING`` [L].
    """
    state = words.split(" ", 1)[0]
    if jobcomp and state == "PENDING":
        return _scheduler(CauseKind.REQUEUED, detail(words, exit), at)
    if state not in ENDED_STATES and state != "REQUEUED":
        return None
    return end_cause(state, words=words, exit=exit, actor=actor, at=at)


_OOM_SIGNAL: Final = 9
_CGROUP_OOM_EXIT: Final = ExitStatus(0, 125)
"""``0:125``: slurmstepd's exit status of a step the cgroup OOM killer hit [L]."""


def _row_words(row: AcctRow) -> str:
    name = row.step or "job"
    return f"{name} {detail(row.state, row.exit)}"


def step_verdict(
    text: str,
    state: str,
    exit: ExitStatus | None,
    steps: Sequence[AcctRow],
    *,
    job_row: AcctRow | None = None,
    at: datetime | None = None,
) -> Cause | None:
    """What the run's step rows say about memory, or ``None`` when they change nothing (see
    the module docstring, "Steps corroborate memory").

    Args:
        text: the job's words so far (``detail(...)`` of its State and exit), kept first.
        state: the job's base state (``OUT_OF_MEMORY``, ``FAILED``, ...).
        exit: the job's exit status.
        steps: the run's step rows (``.batch``, ``.extern``, ``.0``, ...).
        job_row: the run's own sacct row, for its memory request (``ReqMem``/``AllocTRES``)
            when a step's row has none.
        at: when it ended.
    """
    if state not in ("OUT_OF_MEMORY", "FAILED"):
        return None
    batch = next((r for r in steps if r.step == "batch"), None)
    if (
        state == "OUT_OF_MEMORY"
        and batch is not None
        and batch.base_state == "COMPLETED"
        and batch.exit == ExitStatus(0, 0)
    ):
        return Cause(
            kind=CauseKind.NONE,
            provenance=Provenance.APPLICATION,
            detail=f"{text}; {_row_words(batch)}: the batch script completed with exit 0 "
            "(an oom-kill in the job, not the end of its work)",
            exit_code=0,
            at=at,
        )
    oom_steps = [r for r in steps if r.base_state == "OUT_OF_MEMORY"]
    if oom_steps:
        words = "; ".join(_row_words(r) for r in oom_steps)
        return _scheduler(CauseKind.OUT_OF_MEMORY, f"{text}; {words}", at)
    if state == "FAILED" and exit == _CGROUP_OOM_EXIT:
        return _scheduler(CauseKind.OUT_OF_MEMORY, text, at)
    for row in steps:
        if row.exit is None or row.exit.signal != _OOM_SIGNAL:
            continue
        request = row.memory_request or (job_row.memory_request if job_row else "")
        rss, limit = parse_memory(row.max_rss), parse_memory(request)
        if rss is not None and limit is not None and limit > 0 and rss >= limit:
            return _scheduler(
                CauseKind.OUT_OF_MEMORY,
                f"{text}; {_row_words(row)}: MaxRSS {row.max_rss} reached its memory "
                f"request {request}",
                at,
            )
    return None

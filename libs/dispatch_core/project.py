"""``project``: combine a folded Job with what the backend shows now into the Status a caller
reads (seed 000, "Where the state comes from", "Without a record", "The node-loss fence";
docs/core-semantics.md, "project" and "Settled").
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from msgspec.structs import replace

from dispatch_core.epoch import epoch
from dispatch_core.failover import current_cluster
from dispatch_core.job import STATUS_HISTORY_LIMIT, HoldView, Job, LaunchOutcome, Status
from dispatch_core.progress import latest_published
from dispatch_core.state import (
    Cause,
    CauseKind,
    Discovery,
    GateState,
    Level,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    State,
)

__all__ = ["current_object", "project", "settled"]

NO_CAUSE: Final = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
"""The cause of a job with nothing to say (pending, or running normally)."""

_RUNNING_PHASES: Final = frozenset({ObjectPhase.RUNNING, ObjectPhase.STOPPING})


def project(
    job: Job | None,
    discovery: Discovery | None,
    now: datetime,
    *,
    job_id: str | None = None,
) -> Status:
    """Project the Status of a job (seed 000, ``Project``).

    Args:
        job: the folded record, or ``None`` when there is no record store (the Status is
            then ``object-only``: pending or running, never terminal; seed 000, "Without a
            record").
        discovery: what the backend shows now of the job's objects, or ``None`` when
            nothing has been seen.
        now: the time of the projection; a hold is overdue when ``now >= deadline``.
        job_id: the job, needed only when both ``job`` and ``discovery`` are ``None``.

    Returns:
        The Status, carrying the last ``STATUS_HISTORY_LIMIT`` transitions of the job's
        history and how many it has (``history_total``), with the state and cause by the
        rules of docs/core-semantics.md, in order: a committed
        outcome; a hold in force; the current submission's live object (running, running
        with cause node-lost inside the fence, admin-held, unknown); recovering once the
        job has recovered; pending.

    Raises:
        ValueError: no job id can be known, or ``discovery`` is another job's.
    """
    if job is None:
        return _object_only(discovery, now, job_id)
    if discovery is not None and discovery.job_id != job.job_id:
        raise ValueError(
            f"project: discovery of job {discovery.job_id!r} given for job {job.job_id!r}"
        )
    current = current_object(job, discovery)
    state, cause = _state(job, current, discovery, now)
    hold = job.hold
    sub = job.submission
    published = latest_published(job)
    return Status(
        job_id=job.job_id,
        level=Level.FULL,
        state=state,
        cause=cause,
        at=now,
        seq=job.seq,
        hold=None
        if hold is None
        else HoldView(
            instance=hold.instance,
            kind=hold.kind,
            by=hold.by,
            reason=hold.reason,
            since=hold.placed_at,
            deadline=hold.deadline,
            overdue=now >= hold.deadline,
            cause=hold.cause,
            substituted_for=hold.substituted_for,
        ),
        history=job.history[-STATUS_HISTORY_LIMIT:],
        supersedes=job.supersedes,
        superseded_by=job.superseded_by,
        submission=None if sub is None else sub.number,
        epoch=None
        if current is None or sub is None
        else epoch(job.generation, sub.number, current.restarts),
        objects=_live_refs(discovery),
        settled=settled(job, discovery),
        history_total=len(job.history),
        published_step=None if published is None else published.step,
        published_at=None if published is None else (published.read_at or published.at),
        cluster=current_cluster(job),
    )


def _state(
    job: Job, current: ObservedObject | None, discovery: Discovery | None, now: datetime
) -> tuple[State, Cause]:
    """The state and cause, by the rules of core-semantics "project", in order."""
    if job.outcome is not None:
        return job.outcome, job.outcome_cause or NO_CAUSE
    hold = job.hold
    if hold is not None:
        return State.HELD, Cause(
            kind=CauseKind.HELD,
            provenance=Provenance.ACTOR,
            actor=hold.by,
            detail=hold.reason,
            at=hold.placed_at,
        )
    if current is not None:
        seen = current.cause
        if current.phase in _RUNNING_PHASES:
            if seen is not None and seen.kind is CauseKind.NODE_LOST:
                # Inside the node-loss window: running, with the cause (seed 000, "The
                # node-loss fence"); the one case where a running job carries a cause.
                return State.RUNNING, seen
            return State.RUNNING, NO_CAUSE
        if current.gate is GateState.ADMIN_HELD:
            return State.HELD, Cause(
                kind=CauseKind.HELD,
                provenance=Provenance.SCHEDULER,
                actor=None if seen is None else seen.actor,
                detail="" if seen is None else seen.detail,
                at=None if seen is None else seen.at,
            )
        if (
            current.phase is ObjectPhase.PENDING
            and current.gate is GateState.OPEN
            and seen is not None
            and seen.kind is CauseKind.NO_CAPACITY
        ):
            # Waiting for capacity the scheduler says it lacks (docs/core-semantics.md, "No
            # capacity"): the state it would have, with the scheduler's cause and words.
            sub = job.submission
            again = bool(job.recoveries) or (sub is not None and sub.number > 1)
            return (State.RECOVERING if again else State.PENDING), seen
        if current.phase is ObjectPhase.UNKNOWN:
            if seen is None:
                return State.UNKNOWN, Cause(kind=CauseKind.UNKNOWN, provenance=Provenance.SCHEDULER)
            return State.UNKNOWN, replace(seen, kind=CauseKind.UNKNOWN)
    elif _end_unrecorded(job, discovery):
        # The scheduler shows the current execution ended and no pass has recorded it yet:
        # what follows (recovering, held, an outcome) is the record's to commit, so the status
        # stays where the record left it rather than showing a transition nobody committed.
        return State.RUNNING, NO_CAUSE
    sub = job.submission
    if job.recoveries or (sub is not None and sub.number > 1):
        # recovering never returns to pending (seed 000).
        return State.RECOVERING, job.ended_cause or (sub.cause if sub else None) or NO_CAUSE
    return State.PENDING, NO_CAUSE


def _end_unrecorded(job: Job, discovery: Discovery | None) -> bool:
    """Whether the current submission's object, which ran, is shown ended by the scheduler
    while the record does not hold that execution ended yet."""
    sub = job.submission
    if discovery is None or sub is None:
        return False
    for obj in discovery.objects:
        if obj.foreign or obj.alive or obj.submission != sub.number:
            continue
        record = job.object(obj.ref)
        if (
            record is not None
            and not record.duplicate
            and record.gate_opened_at is not None
            and obj.restarts not in record.ended
        ):
            return True
    return False


def current_object(job: Job, discovery: Discovery | None) -> ObservedObject | None:
    """Return the current submission's live object in ``discovery``, or ``None``.

    It is an own (non-foreign) object of the current submission N that the record holds
    as launched (and not a duplicate), or whose attempt (N, a) is still unknown (found
    before the record says so), in a phase other than ``ended``, and whose current execution
    R the record does not already hold ended (a fenced execution is over for the job).
    A recorded object is preferred to a found one.
    """
    sub = job.submission
    if discovery is None or sub is None:
        return None
    found: ObservedObject | None = None
    for obj in discovery.objects:
        if obj.foreign or not obj.alive or obj.submission != sub.number:
            continue
        record = job.object(obj.ref)
        if record is not None:
            if not record.duplicate and obj.restarts not in record.ended:
                return obj
            continue
        if (
            found is None
            and obj.attempt is not None
            and 1 <= obj.attempt <= len(sub.attempts)
            and sub.attempts[obj.attempt - 1].outcome is LaunchOutcome.UNKNOWN
        ):
            found = obj
    return found


def settled(job: Job, discovery: Discovery | None) -> bool:
    """Whether the job has an outcome and nothing of it can still act (DESIGN.md section 3).

    Nothing can act when: no object of the job is alive in ``discovery`` (own, duplicate or
    foreign, unless the foreign one was abandoned), every object the record holds is shown
    by ``discovery``, listed vanished, or recorded ended by the scheduler's word (not only
    the fence's): an object merely missing from a discovery is not proven gone (issue 15),
    and no launch attempt's outcome is unknown. With no
    discovery, only a job whose record knows of no object can be settled: nobody has looked
    at the others.

    Args:
        job: the folded record.
        discovery: what the backend shows now, or ``None``.

    Returns:
        True when the job is settled.
    """
    if job.outcome is None:
        return False
    if job.unknown_submissions():
        return False
    if discovery is None:
        return not job.objects
    abandoned = {t.foreign for t in job.abandoned if t.foreign is not None}
    if any(obj.alive and not (obj.foreign and obj.ref in abandoned) for obj in discovery.objects):
        return False
    # Gone is not ended (issue 15): an object the record launched that this discovery
    # doesn't show is done only when the record holds its end as the scheduler reported it,
    # or the discovery lists it vanished (the planner then records its end). Absence proves
    # nothing: the discovery may predate the object, and an execution the fence ended may
    # still run until the scheduler says otherwise.
    shown = {obj.ref for obj in discovery.objects}
    return all(
        record.ref in shown
        or record.ref in discovery.vanished
        or (record.ended and not record.fenced)
        or not discovery.covers(record.ref.cluster)
        for record in job.objects
    )


def _live_refs(discovery: Discovery | None) -> tuple[ObjectRef, ...]:
    if discovery is None:
        return ()
    return tuple(obj.ref for obj in discovery.objects if obj.alive and not obj.foreign)


def _object_only(discovery: Discovery | None, now: datetime, job_id: str | None) -> Status:
    """A Status from the scheduler alone: pending or running, never terminal (seed 000,
    "Without a record")."""
    if discovery is not None:
        if job_id is not None and job_id != discovery.job_id:
            raise ValueError(f"project: discovery of job {discovery.job_id!r} given for {job_id!r}")
        job_id = discovery.job_id
    if job_id is None:
        raise ValueError("project: a job id is needed when there is no record and no discovery")
    running = discovery is not None and any(
        not obj.foreign and obj.phase in _RUNNING_PHASES for obj in discovery.objects
    )
    return Status(
        job_id=job_id,
        level=Level.OBJECT_ONLY,
        state=State.RUNNING if running else State.PENDING,
        cause=NO_CAUSE,
        at=now,
        objects=_live_refs(discovery),
    )

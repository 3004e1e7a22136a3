"""``decide``: the events an operator command commits, or why it is refused (seed 002, "Answer it
by its id"; docs/core-semantics.md, "decide").

``decide`` reads the folded record as it is now; the caller appends the events it returns
with the record's last sequence as the expected one, so a command decided against a stale
record is retried, never committed blind.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import assert_never

import msgspec

from dispatch_core.commands import (
    Abandon,
    Cancel,
    Command,
    EmergencyStop,
    GiveUp,
    HoldCommand,
    OperatorCommand,
    Release,
    Resubmit,
    Submit,
    Supersede,
)
from dispatch_core.constants import JOB_PLACEHOLDER, MAX_HOLD_FOR_S
from dispatch_core.epoch import MAX_GENERATION
from dispatch_core.errors import Refused
from dispatch_core.escalations import EscalationKind, escalation_id
from dispatch_core.events import (
    Abandoned,
    CancelRequested,
    EmergencyStopRequested,
    EscalationCommitted,
    GaveUp,
    HoldHow,
    HoldPlaced,
    HoldReleased,
    JobCreated,
    JobEvent,
    OutcomeCommitted,
    SubmissionOpened,
    SubmissionWhy,
    Superseded,
)
from dispatch_core.failover import staying_cluster
from dispatch_core.job import Hold, Job, LaunchOutcome
from dispatch_core.policy import make_plan, validate_spec
from dispatch_core.state import (
    ActorKind,
    Cause,
    CauseKind,
    HoldKind,
    JobSpec,
    Provenance,
    State,
    is_job_id,
)

__all__ = ["OptionRefused", "decide"]

_JOB_ID_RULE = (
    "a job id is 1 to 63 lower-case letters, digits and '-', starting and ending with a "
    "letter or digit"
)


class OptionRefused(msgspec.Struct, frozen=True, kw_only=True):
    """An option of the job's spec that its backend refuses now (the caller asks the
    backend's pure option check; the core can't): a ``Supersede`` is refused for it, since
    the new job keeps the spec and could only fail at launch.

    Attributes:
        key: the option's key in ``spec.options``.
        reason: why the backend refuses it.
    """

    key: str
    reason: str


def decide(
    job: Job | None,
    command: OperatorCommand,
    now: datetime,
    *,
    job_id: str | None = None,
    refused_option: OptionRefused | None = None,
) -> tuple[JobEvent, ...]:
    """Decide an operator command against the job's record (seed 002).

    Args:
        job: the folded record, or ``None`` when the job has none (only ``Submit`` is then
            accepted).
        command: the command.
        now: the time of the decision; every event returned carries it as ``at``, and hold
            deadlines run from it.
        job_id: the job the command was addressed to, for the refusal's message when
            ``job`` is ``None`` (``Submit`` carries its own).
        refused_option: for a ``Supersede``, the first option of the job's spec that its
            backend now refuses, if any (a job recorded before options were checked at
            submission); the supersede is then refused.

    Returns:
        The events to append, in order. For ``Submit``: the ``JobCreated``, whose spec has
        each ``{job}`` of ``checkpoint`` replaced by the job's id. For ``Supersede``: the new
        job's ``JobCreated`` (the old job's spec as recorded), then
        the old job's ``Superseded``; each carries its own ``job_id``. Append the old job's
        ``Superseded`` first, with optimistic concurrency on the old record, so that two racing
        supersedes can't both win; then create the new record (a retry after a crash between
        the two finds ``superseded_by`` set and creates the named new job).

    Raises:
        Refused: the record doesn't allow the command now; the reason is a sentence an
            operator can act on.
        InvalidPolicy: a ``Submit`` (or the re-made plan of a ``Supersede``) carries an
            illegal policy.
    """
    if isinstance(command, Submit):
        return _submit(job, command, now)
    if job is None:
        raise Refused(
            job_id or "",
            _tag(command),
            "the job has no record; submit it first, or check the job id",
        )
    match command:
        case HoldCommand():
            return _hold(job, command, now)
        case Release():
            return _release(job, command, now)
        case Resubmit():
            return _resubmit(job, command, now)
        case Cancel():
            return _cancel(job, command, now)
        case GiveUp():
            return _give_up(job, command, now)
        case Abandon():
            return _abandon(job, command, now)
        case Supersede():
            return _supersede(job, command, now, refused_option)
        case EmergencyStop():
            return _emergency_stop(job, command, now)
        case _:
            assert_never(command)


def _tag(command: Command) -> str:
    return str(type(command).__struct_config__.tag)


def _refuse(job: Job, command: Command, reason: str) -> Refused:
    return Refused(job.job_id, _tag(command), reason)


def _no_outcome(job: Job, command: Command, then: str) -> None:
    """Refuse ``command`` when the job's outcome is committed (seed 000: outcomes never
    change)."""
    if job.outcome is not None:
        raise _refuse(
            job, command, f"the job's outcome ({job.outcome}) is committed and final; {then}"
        )


def _concrete(spec: JobSpec, job_id: str) -> JobSpec:
    """The spec with each ``{job}`` of its checkpoint root replaced by the job's id; nothing
    else in it changes (other braces stay as they are)."""
    if spec.checkpoint is None or JOB_PLACEHOLDER not in spec.checkpoint:
        return spec
    return msgspec.structs.replace(
        spec, checkpoint=spec.checkpoint.replace(JOB_PLACEHOLDER, job_id)
    )


def _submit(job: Job | None, command: Submit, now: datetime) -> tuple[JobEvent, ...]:
    """Create a job: validate the policy, make the plan, open the record with the spec made
    concrete (``{job}`` in the checkpoint root becomes the job's id, once, here)."""
    if job is not None:
        raise Refused(
            command.job_id,
            "submit",
            f"job {command.job_id!r} already exists; to run it again, supersede it",
        )
    if not is_job_id(command.job_id):
        raise Refused(
            command.job_id, "submit", f"{command.job_id!r} is not a job id: {_JOB_ID_RULE}"
        )
    spec = _concrete(command.spec, command.job_id)
    validate_spec(spec)
    plan = make_plan(spec, command.policy, command.declarations)
    return (
        JobCreated(
            job_id=command.job_id,
            at=now,
            spec=spec,
            policy=command.policy,
            plan=plan,
            declarations=command.declarations,
            generation=0,
            by=command.by,
        ),
    )


def _hold(job: Job, command: HoldCommand, now: datetime) -> tuple[JobEvent, ...]:
    """Place an actor hold (seed 002: an actor hold can be released)."""
    _no_outcome(job, command, "a hold can't change it")
    current = job.hold
    if current is not None:
        raise _refuse(
            job,
            command,
            f"hold {current.instance} ({current.kind}, by {current.by.name}) is already in force",
        )
    if not (math.isfinite(command.for_s) and 0 < command.for_s <= MAX_HOLD_FOR_S):
        raise _refuse(
            job,
            command,
            f"for_s {command.for_s} is not a positive number of seconds of at most "
            f"{MAX_HOLD_FOR_S:.0f}",
        )
    return (
        HoldPlaced(
            job_id=job.job_id,
            at=now,
            instance=len(job.holds) + 1,
            kind=HoldKind.ACTOR,
            by=command.by,
            reason=command.reason,
            deadline=now + timedelta(seconds=command.for_s),
        ),
    )


def _hold_in_force(job: Job, command: Command, then: str) -> Hold:
    """The hold in force, or a refusal. A committed outcome refuses first, even with a hold
    still recorded in force: release, resubmit and give-up act on a live job only (seed 000:
    succeeded, failed and cancelled never change once committed)."""
    _no_outcome(job, command, then)
    hold = job.hold
    if hold is None:
        raise _refuse(job, command, f"no hold is in force; {then}")
    return hold


def _release(job: Job, command: Release, now: datetime) -> tuple[JobEvent, ...]:
    """Release an actor hold, noting an override (seed 002, ``overdue:<instance>``)."""
    hold = _hold_in_force(job, command, "there is nothing to release")
    if hold.kind is HoldKind.RECOVERY:
        raise _refuse(
            job,
            command,
            f"hold {hold.instance} is a recovery hold, placed by a hold rule after an "
            "execution ended, and can't be released: use resubmit to run a new "
            "submission, cancel, or give-up to fail the job with the cause that ended it",
        )
    return (
        HoldReleased(
            job_id=job.job_id,
            at=now,
            instance=hold.instance,
            by=command.by,
            how=HoldHow.RELEASE,
            override=command.by != hold.by,
            reason=command.reason,
        ),
    )


def _resubmit(job: Job, command: Resubmit, now: datetime) -> tuple[JobEvent, ...]:
    """Lift a recovery hold and open the next submission; no budget is spent."""
    hold = _hold_in_force(job, command, "resubmit answers a recovery hold")
    if hold.kind is not HoldKind.RECOVERY:
        raise _refuse(
            job,
            command,
            f"hold {hold.instance} is an actor hold (by {hold.by.name}): release it instead",
        )
    number = len(job.submissions) + 1
    return (
        HoldReleased(
            job_id=job.job_id,
            at=now,
            instance=hold.instance,
            by=command.by,
            how=HoldHow.RESUBMIT,
            reason=command.reason,
        ),
        SubmissionOpened(
            job_id=job.job_id,
            at=now,
            submission=number,
            why=SubmissionWhy.RESUBMIT,
            cause=hold.cause,
            by=command.by,
            cluster=staying_cluster(job),
        ),
    )


def _release_for(job: Job, command: Command, now: datetime, how: HoldHow) -> tuple[JobEvent, ...]:
    """The release of the hold in force (if any) by a cancel or a give-up."""
    hold = job.hold
    if hold is None:
        return ()
    return (
        HoldReleased(
            job_id=job.job_id,
            at=now,
            instance=hold.instance,
            by=command.by,
            how=how,
            override=hold.kind is HoldKind.ACTOR and command.by != hold.by,
            reason=command.reason,
        ),
    )


def _cancelled(job: Job, command: Command, now: datetime) -> tuple[JobEvent, ...]:
    """A cancel's events: the request, the hold's release, the ``cancelled`` outcome."""
    cause = Cause(
        kind=CauseKind.CANCELLED,
        provenance=Provenance.ACTOR,
        actor=command.by,
        detail=command.reason,
        at=now,
    )
    return (
        CancelRequested(job_id=job.job_id, at=now, by=command.by, reason=command.reason),
        *_release_for(job, command, now, HoldHow.CANCEL),
        OutcomeCommitted(job_id=job.job_id, at=now, state=State.CANCELLED, cause=cause),
    )


def _cancel(job: Job, command: Cancel, now: datetime) -> tuple[JobEvent, ...]:
    """Cancel the job: outcome ``cancelled``; the planner stops its live objects."""
    _no_outcome(job, command, "there is nothing to cancel (supersede runs it again)")
    return _cancelled(job, command, now)


def _give_up(job: Job, command: GiveUp, now: datetime) -> tuple[JobEvent, ...]:
    """Fail a held job with the cause that ended it (seed 002, ``give-up``)."""
    hold = _hold_in_force(job, command, "only a held job can be given up")
    cause = hold.cause or Cause(
        kind=CauseKind.HELD,
        provenance=Provenance.ACTOR,
        actor=hold.by,
        detail=hold.reason,
        at=hold.placed_at,
    )
    reason = f": {command.reason}" if command.reason else ""
    return (
        GaveUp(job_id=job.job_id, at=now, by=command.by, reason=command.reason),
        *_release_for(job, command, now, HoldHow.GIVE_UP),
        OutcomeCommitted(job_id=job.job_id, at=now, state=State.FAILED, cause=cause),
        EscalationCommitted(
            job_id=job.job_id,
            at=now,
            id=escalation_id(EscalationKind.GIVE_UP),
            detail=f"{command.by.name} gave up on hold {hold.instance} ({cause.kind}){reason}",
        ),
    )


def _abandon(job: Job, command: Abandon, now: datetime) -> tuple[JobEvent, ...]:
    """Close an unknown launch or dispose of a foreign object; a human only (seed 002)."""
    if command.by.kind is not ActorKind.HUMAN:
        raise _refuse(
            job,
            command,
            f"only a human may abandon; {command.by.name} is a {command.by.kind} actor",
        )
    target = command.target
    if target.foreign is not None:
        if target.submission is not None or target.attempt is not None:
            raise _refuse(
                job, command, "a target is a foreign object or a launch, not both; send one"
            )
        own = job.object(target.foreign)
        if own is not None:
            raise _refuse(
                job,
                command,
                f"object {target.foreign} is dispatch's own (attempt "
                f"{own.submission}/{own.attempt}), not foreign; cancel the job to stop it",
            )
        if target in job.abandoned:
            raise _refuse(job, command, f"foreign object {target.foreign} is already abandoned")
    elif target.submission is None:
        raise _refuse(
            job, command, "the target names nothing: give a submission, an attempt or a foreign ref"
        )
    else:
        number = target.submission
        if not 1 <= number <= len(job.submissions):
            raise _refuse(
                job,
                command,
                f"submission {number} was never opened (the job has {len(job.submissions)})",
            )
        sub = job.submissions[number - 1]
        if target.attempt is not None:
            if not 1 <= target.attempt <= len(sub.attempts):
                raise _refuse(
                    job,
                    command,
                    f"attempt {number}/{target.attempt} was never made (submission {number} "
                    f"has {len(sub.attempts)} attempts)",
                )
            outcome = sub.attempts[target.attempt - 1].outcome
            if outcome is not LaunchOutcome.UNKNOWN:
                raise _refuse(
                    job,
                    command,
                    f"attempt {number}/{target.attempt} is {outcome}, not unknown; only a "
                    "launch whose outcome nobody knows can be abandoned",
                )
        elif not sub.attempts or any(a.outcome is not LaunchOutcome.UNKNOWN for a in sub.attempts):
            raise _refuse(
                job,
                command,
                f"submission {number} is not all-unknown (its attempts: "
                f"{', '.join(str(a.outcome) for a in sub.attempts) or 'none'}); abandon a "
                "single unknown attempt as submission/attempt",
            )
    return (
        Abandoned(job_id=job.job_id, at=now, target=target, by=command.by, reason=command.reason),
    )


def _supersede(
    job: Job, command: Supersede, now: datetime, refused_option: OptionRefused | None
) -> tuple[JobEvent, ...]:
    """Create a new job from one with an outcome: same spec, generation + 1 (seed 002);
    refused when the backend now refuses an option of the spec (``refused_option``).

    The spec is the old job's as recorded, its checkpoint root already concrete (``{job}``
    became the old job's id at its creation), so the new job resumes from the old one's
    publications, and its saves outrank them (a higher generation).
    """
    if job.outcome is None:
        raise _refuse(
            job,
            command,
            "the job has no outcome yet; only a finished job can be superseded: cancel it first",
        )
    if job.superseded_by is not None:
        raise _refuse(job, command, f"the job is already superseded by {job.superseded_by!r}")
    if refused_option is not None:
        raise _refuse(
            job,
            command,
            f"the job's spec.options.{refused_option.key} is invalid: {refused_option.reason}; "
            "a superseding job keeps the spec, so submit a new job with the option fixed",
        )
    new = command.new_job_id
    if not is_job_id(new):
        raise _refuse(job, command, f"{new!r} is not a job id: {_JOB_ID_RULE}")
    if new == job.job_id:
        raise _refuse(job, command, "the new job needs an id of its own")
    if job.generation >= MAX_GENERATION:
        raise _refuse(job, command, f"generation {job.generation} is the last one an epoch holds")
    plan = make_plan(job.spec, job.policy, job.declarations)
    return (
        JobCreated(
            job_id=new,
            at=now,
            spec=job.spec,
            policy=job.policy,
            plan=plan,
            declarations=job.declarations,
            generation=job.generation + 1,
            supersedes=job.job_id,
            by=command.by,
        ),
        Superseded(job_id=job.job_id, at=now, new_job=new, by=command.by, reason=command.reason),
    )


def _emergency_stop(job: Job, command: EmergencyStop, now: datetime) -> tuple[JobEvent, ...]:
    """Kill every live object at once; a job without an outcome is cancelled (seed 002)."""
    stop = EmergencyStopRequested(job_id=job.job_id, at=now, by=command.by, reason=command.reason)
    if job.outcome is not None:
        return (stop,)
    return (stop, *_cancelled(job, command, now))

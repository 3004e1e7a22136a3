"""Progress-aware recovery: the budget arithmetic of ``free_if_progress`` and
``max_without_progress`` (issue 14, part 1).

A job's progress is what it published (seed 004: "The latest checkpoint is the entry with the
greatest epoch, then step, found by listing pub/"); dispatch reads the listing, never the
checkpoint. When an execution ends, the planner records a ``progress.observed`` fact
(:func:`observe`): the latest published epoch and step the Discovery carried, whether the
execution advanced the published step past the last one a fact recorded, and how many
executions in a row the same rule covered without advancing. :func:`verdict` then says what
the rule does with the ending:

* ``free``: the rule says ``free_if_progress`` and the execution advanced: it recovers, and
  spends nothing of the budget (a long job preempted ten times, each after real progress, is
  never failed for it);
* ``no-progress``: the rule says ``max_without_progress = N`` and this is the N-th execution in
  a row it covered that didn't advance: the job is held under a recovery hold, escalation
  ``no-progress:<N>``; counting starts again after that hold;
* ``spent``: the budget is spent: the job fails (seed 000);
* ``spend``: it recovers, spending one.

Hence, over a job's life, a rule makes at most ``budget`` recoveries plus one per execution
that advanced, and a no-progress hold fires exactly at the N-th execution without progress.

Pure: no I/O, no clock (``now`` comes in).
"""

from __future__ import annotations

import enum
from datetime import datetime

from dispatch_core.events import ProgressObserved
from dispatch_core.job import Job
from dispatch_core.state import ObjectRef, PlannedRule, Publications

__all__ = ["Verdict", "fact_for", "last_step", "latest_published", "observe", "verdict"]


class Verdict(enum.StrEnum):
    """What a recovering rule (resubmit, restart, requeue) does with an ending."""

    FREE = "free"
    """Recover, spending nothing: ``free_if_progress`` and the execution advanced."""
    SPEND = "spend"
    """Recover, spending one of the budget."""
    SPENT = "spent"
    """The budget is spent: the job fails (seed 000)."""
    NO_PROGRESS = "no-progress"
    """Hold under a recovery hold, escalation ``no-progress:<N>``."""


def last_step(job: Job) -> int | None:
    """The last published step a ``progress.observed`` fact of ``job`` recorded, or ``None``."""
    for fact in reversed(job.progress):
        if fact.step is not None:
            return fact.step
    return None


def latest_published(job: Job) -> ProgressObserved | None:
    """The last ``progress.observed`` fact of ``job`` that recorded a step, or ``None``."""
    for fact in reversed(job.progress):
        if fact.step is not None:
            return fact
    return None


def fact_for(job: Job, ref: ObjectRef, restart: int) -> ProgressObserved | None:
    """The fact recorded for execution ``restart`` of ``ref``, or ``None``."""
    for fact in reversed(job.progress):
        if fact.ref == ref and fact.restart == restart:
            return fact
    return None


def observe(
    job: Job,
    *,
    ref: ObjectRef,
    restart: int,
    submission: int,
    rule: PlannedRule | None,
    publications: Publications | None,
    now: datetime,
) -> ProgressObserved:
    """The progress fact for an execution of ``job`` that ended.

    Args:
        job: the job as the record holds it before the fact.
        ref, restart, submission: the execution that ended.
        rule: the plan's rule covering the ending's cause, or ``None``.
        publications: what the Discovery that showed the end read of ``pub/``, or ``None``
            when it read nothing (nothing is then taken to have advanced).
        now: the time of the pass.

    Returns:
        The fact: ``advanced`` when the listing's step is greater than :func:`last_step`
        (any step, when none was recorded); ``without_progress`` 0 when it advanced or no
        rule covers the cause, else one more than the previous fact's when that fact was the
        same rule's and hadn't reached the rule's ``max_without_progress``, else 1.
    """
    epoch = step = None
    read_at = None
    if publications is not None:
        epoch, step, read_at = publications.epoch, publications.step, publications.read_at
    before = last_step(job)
    advanced = step is not None and (before is None or step > before)
    without = 0
    if rule is not None and not advanced:
        prev = job.progress[-1] if job.progress else None
        limit = rule.max_without_progress
        carried = (
            prev.without_progress
            if prev is not None
            and prev.rule == rule.rule
            and (limit is None or prev.without_progress < limit)
            else 0
        )
        without = carried + 1
    return ProgressObserved(
        job_id=job.job_id,
        at=now,
        ref=ref,
        restart=restart,
        submission=submission,
        epoch=epoch,
        step=step,
        read_at=read_at,
        advanced=advanced,
        rule=None if rule is None else rule.rule,
        without_progress=without,
    )


def verdict(rule: PlannedRule, spent: int, fact: ProgressObserved | None) -> Verdict:
    """What a recovering rule does with an ending (see the module's docstring).

    Args:
        rule: the rule covering the ending's cause (resubmit, restart or requeue).
        spent: how much of its budget the job spent so far (:meth:`Job.spent`).
        fact: the ending's progress fact, or ``None`` when none was recorded (the rule has no
            progress setting and the Discovery read no listing): the rule then spends as
            before issue 14.
    """
    if fact is not None and rule.free_if_progress and fact.advanced:
        return Verdict.FREE
    limit = rule.max_without_progress
    if fact is not None and limit is not None and fact.without_progress >= limit:
        return Verdict.NO_PROGRESS
    if spent >= rule.budget:
        return Verdict.SPENT
    return Verdict.SPEND

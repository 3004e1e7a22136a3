"""A start of a launch whose earlier ``sbatch`` was cut off (issue 15, "Launches survive the
launcher"; pure: no command is run here).

A supervisor killed while its ``sbatch`` runs leaves that sbatch running (it has a session of
its own) and the launch's outcome unknown. When the planner asks for the same launch again
(``Launch.resume``), a second ``sbatch`` would be a second job, so the backend first looks
for the one the cut-off sbatch may have made, by dispatch's tag in the job's comment
(``dj:job=<job> sub=<N> att=<a>``), once that sbatch can no longer be running:

=================================================  =====================================
age of the launch's intent                         what the start does
=================================================  =====================================
below ``sbatch_settle_s``                          nothing: the outcome stays unknown
                                                   (an earlier sbatch may still submit)
from ``sbatch_settle_s``, below ``min_job_age_s``  ``squeue -t all``: the tagged job if
                                                   listed, else a new ``sbatch`` (a job
                                                   made then would still be listed)
from ``min_job_age_s`` on                          the tagged job if listed, else
                                                   unknown: a job it made may have ended
                                                   and been forgotten (MinJobAge), so
                                                   only a person can tell (all-unknown)
=================================================  =====================================

``min_job_age_s`` is the cluster's ``MinJobAge`` (Slurm's default 300 s): how long slurmctld
keeps listing an ended job.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from dispatch_backends.slurm.observe import dispatch_job_id
from dispatch_backends.slurm.parse import QueueJob, parse_comment

__all__ = ["ResumeStep", "find_launch", "resume_step"]


class ResumeStep(enum.StrEnum):
    """What a repeated start of a launch does, by the age of its intent (module docstring)."""

    WAIT = "wait"
    """An earlier sbatch of it may still be running: do nothing, the outcome stays unknown."""
    LOOK_THEN_SUBMIT = "look-then-submit"
    """Return the tagged job squeue lists, else submit: any job made would be listed."""
    LOOK_ONLY = "look-only"
    """Return the tagged job squeue lists, else the outcome stays unknown."""


def resume_step(age_s: float, *, sbatch_settle_s: float, min_job_age_s: float) -> ResumeStep:
    """The step for a launch whose intent is ``age_s`` seconds old (module docstring)."""
    if age_s < sbatch_settle_s:
        return ResumeStep.WAIT
    if age_s < min_job_age_s:
        return ResumeStep.LOOK_THEN_SUBMIT
    return ResumeStep.LOOK_ONLY


def find_launch(jobs: Iterable[QueueJob], job_id: str, submission: int, attempt: int) -> str | None:
    """The id of the Slurm job named for ``job_id`` whose comment carries dispatch's tag
    for launch (``submission``, ``attempt``), or ``None``. The lowest id wins should there
    be several (never expected: one sbatch per launch)."""
    found = []
    for job in jobs:
        if dispatch_job_id(job.name) != job_id:
            continue
        tag = parse_comment(job.comment)
        if tag is not None and (tag.job, tag.submission, tag.attempt) == (
            job_id,
            submission,
            attempt,
        ):
            found.append(job.raw_id)
    return min(found, key=lambda i: (len(i), i)) if found else None

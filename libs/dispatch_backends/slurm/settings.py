"""The slurm backend's settings: one frozen struct, read from the clusters file.

Every duration is in seconds (``_s``). Defaults suit a production site; the test cluster's
values are in ``deploy/slurm/README.md`` ("Settings").
"""

from __future__ import annotations

import enum
import re
from typing import Final

import msgspec

__all__ = ["DEFAULT_RUN_AS", "OWNED_OPTIONS", "Accounting", "QueueFormat", "SlurmSettings"]


class Accounting(enum.StrEnum):
    """Where the backend reads why an execution ended (deploy/slurm/README.md, "What
    accounting changes").

    ``slurmdbd``: ``sacct --duplicates`` from the accounting database (a real site's setup):
    one row per run of a job, so the cause of every native requeue (``REQUEUED``,
    ``NODE_FAIL``, ``PREEMPTED``) and the uid of a cancel (``CANCELLED by 0``).
    ``jobcomp``: ``sacct -c``, the job-completion file, readable only on the controller's
    host: one record per end and per requeue (a requeue by ``scontrol`` is recorded as
    ``PENDING``), no actor. ``none``: squeue alone; the cause of a native requeue is then
    ``unknown`` (nobody says why), never a guess.
    """

    SLURMDBD = "slurmdbd"
    JOBCOMP = "jobcomp"
    NONE = "none"


class QueueFormat(enum.StrEnum):
    """How ``squeue`` is asked (deploy/slurm/README.md, "What works").

    ``text``: ``squeue -h -t all -u USER -O ...`` with ``|`` after every field; works on
    every Slurm since 17.11 and honours ``-u``. ``json``: ``squeue --json``, which ignores
    ``-j``/``-t`` (lab trap) and returns every job slurmctld holds, of every user; parsed
    for openapi v0.0.38 (22.05) to v0.0.41 (24.05+).
    """

    TEXT = "text"
    JSON = "json"


OWNED_OPTIONS: Final = frozenset(
    {"job_name", "comment", "hold", "parsable", "wrap", "array", "no_requeue", "export"}
)
"""``JobSpec.options`` names dispatch sets itself, or refuses (``array``: one launch is one
job); a spec naming one is refused at start. ``requeue`` (``yes``/``no``) is read, not passed
through (see :mod:`dispatch_backends.slurm.script`)."""

_UNIT: Final = re.compile(r"^[A-Za-z0-9_.-]+$")

DEFAULT_RUN_AS: Final = ("sudo", "-n", "-u", "{user}", "--")
"""How a Slurm command is run as a job's owner: ``sudo -n -u <owner> -- sbatch ...``
(non-interactive: a missing sudoers rule fails at once with sudo's words). The sudoers rule
and why sudo rather than slurmrestd: ``deploy/slurm/README.md``, "Jobs run as their
owners"."""


class SlurmSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings of one Slurm cluster.

    Attributes:
        node_loss_window_s: the declared node-loss window (seed 000): how long a job may
            run on a node that stopped responding (sinfo ``*``, ``DOWN``) before dispatch
            fences it, counted while it stays so (the node answering again ends it). Keep
            it above ``SlurmdTimeout`` (Slurm's default 300 s), so that
            Slurm usually ends the job first (``NODE_FAIL``).
        user: the user whose jobs are discovered (``squeue -u``); empty: the user the
            backend runs as.
        queue_format: see :class:`QueueFormat`.
        accounting: see :class:`Accounting`.
        accounting_grace_s: how long an answer sacct owes (the cause of a native requeue,
            the uid of a cancel) is waited for after slurmctld shows the change, before the
            backend reports what it has (``unknown`` for a requeue, ``cancelled`` without
            an actor). sacct lags slurmctld by 1 to 2 s (deploy/slurm/README.md).
        command_timeout_s: seconds any one Slurm command may take before it is killed (a
            client that can't reach slurmctld retries for about 9 s with the default
            ``MessageTimeout``).
        max_concurrency: Slurm commands in flight at once.
        bin_dir: directory of the Slurm commands (empty: ``PATH``).
        slurm_conf: ``SLURM_CONF`` for the commands (empty: the environment's, else
            ``/etc/slurm/slurm.conf``).
        exclude_lost_nodes: whether a launch adds the nodes earlier executions lost to
            ``--exclude`` (a lost node is worth retrying elsewhere).
        workdir: ``--chdir`` when the spec sets none (empty: sbatch's default, the
            backend's own working directory).
        output_dir: when set, ``--output=<output_dir>/%x-%j.out`` unless the spec (options
            or ``#SBATCH``) names an output.
        open_mode: ``--open-mode`` (``append`` or ``truncate``) unless the spec names one;
            empty: Slurm's default.
        export: ``--export`` of every submission (``ALL``: the backend's environment, as
            sbatch does by default; ``NONE``; or a list).
        extra_args: more ``sbatch`` arguments for every submission (e.g. ``--account=ml``).
        cessation_command: the site's cessation signal (seed 004): a program and its
            arguments, run with ``{job_id}`` and ``{nodes}`` (comma-separated) substituted;
            exit 0 means the object's processes are gone, any other exit means not (yet).
            Empty: the backend has no cessation signal.
        cessation_timeout_s: seconds the cessation command may take (then: not ceased).
        sbatch_settle_s: seconds after a launch's intent by which an ``sbatch`` of it that
            its supervisor's death cut off has surely finished (it runs on in its own
            session; a client that can't reach slurmctld gives up after about 9 s with the
            default ``MessageTimeout``, and a few retries): only then does a repeated start
            of the launch look for the job it made (:mod:`.resume`).
        min_job_age_s: the cluster's ``MinJobAge`` (Slurm's default 300 s): how long
            slurmctld keeps listing an ended job. Past it, a repeated start that finds no job
            of the launch can't tell that none was made, and leaves the outcome unknown.
        users: the Unix users dispatch may run jobs as on this cluster (issue 16): a job
            whose ``spec.owner`` is one of them is submitted, released and cancelled as
            that user (``run_as``), and discovery lists their jobs too (``squeue -u``).
            A job owned by anyone else is refused (by the API at submission, by the
            backend at launch). Empty: every job runs as the backend's own user, and a job
            with an owner is refused.
        run_as: the command prefix that runs a Slurm command as a job's owner, with
            ``{user}`` replaced (:data:`DEFAULT_RUN_AS`: ``sudo -n -u {user} --``;
            ``runuser -u {user} --`` where the backend runs as root).
    """

    node_loss_window_s: float = 600.0
    user: str = ""
    queue_format: QueueFormat = QueueFormat.TEXT
    accounting: Accounting = Accounting.SLURMDBD
    accounting_grace_s: float = 30.0
    command_timeout_s: float = 30.0
    max_concurrency: int = 4
    bin_dir: str = ""
    slurm_conf: str = ""
    exclude_lost_nodes: bool = True
    workdir: str = ""
    output_dir: str = ""
    open_mode: str = ""
    export: str = "ALL"
    extra_args: tuple[str, ...] = ()
    cessation_command: tuple[str, ...] = ()
    cessation_timeout_s: float = 60.0
    sbatch_settle_s: float = 120.0
    min_job_age_s: float = 300.0
    users: tuple[str, ...] = ()
    run_as: tuple[str, ...] = DEFAULT_RUN_AS

    def __post_init__(self) -> None:
        for name in (
            "node_loss_window_s",
            "accounting_grace_s",
            "command_timeout_s",
            "cessation_timeout_s",
            "sbatch_settle_s",
            "min_job_age_s",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.open_mode not in ("", "append", "truncate"):
            raise ValueError(f"open_mode must be append or truncate, got {self.open_mode!r}")
        if self.user and not _UNIT.match(self.user):
            raise ValueError(f"user {self.user!r} is not a user name")
        for name in self.users:
            if not _UNIT.match(name) or name.startswith("-"):
                raise ValueError(f"users: {name!r} is not a user name")
        if self.users and not any("{user}" in arg for arg in self.run_as):
            raise ValueError(f"run_as must contain {{user}}, got {list(self.run_as)}")

    def refuse_owner(self, owner: str) -> str | None:
        """Why a job owned by ``owner`` can't run on this cluster, or ``None`` when it can
        (no owner, or one of ``users``)."""
        if not owner or owner in self.users:
            return None
        if not self.users:
            return (
                f"this cluster runs every job as dispatch's own user (no `users` in its "
                f"clusters file entry): it may not act for Unix user {owner!r}"
            )
        return (
            f"dispatch may not act for Unix user {owner!r} on this cluster "
            f"(its users: {', '.join(self.users)})"
        )

"""The ``slurm`` backend: each of dispatch's objects is one Slurm batch job (issue 6).

Every rule cites what it rests on: ``deploy/slurm/README.md`` "Findings" (real Slurm 22.05.8
with slurmdbd accounting, recorded in ``tests/data/slurm/``) and ``shared/slurm-lab/README.md``
(the lab's strings table and traps). Modules:

* :mod:`.settings`: :class:`SlurmSettings` (node-loss window, accounting, grace, timeouts,
  submission defaults, the cessation command).
* :mod:`.parse`: pure parsers of ``squeue`` (text and JSON, openapi v0.0.38 to v0.0.41),
  ``sacct``, ``sinfo`` and ``scontrol`` output, and of dispatch's comment tag.
* :mod:`.resume`: a repeated start of a launch whose sbatch was cut off finds the job it made
  by its tag (idempotent per attempt, issue 15).
* :mod:`.causes`: the cause table (Slurm's words kept verbatim in the detail).
* :mod:`.observe`: one poll's outputs -> the objects dispatch sees (executions of native
  requeues, node loss, admin holds, foreign jobs).
* :mod:`.script`: the batch script (the per-execution prologue) and ``sbatch`` arguments.
* :mod:`.commands`: running Slurm's commands off the event loop, with timeouts; unreachable
  controllers recognised from Slurm's words.
* :mod:`.backend`: :class:`SlurmBackend`, the I/O.

**Objects.** ``sbatch --hold --job-name=dj-<job> --comment='dj:job=<job> sub=<N> att=<a>
gen=<G>'``: the user hold is dispatch's closed gate, ``scontrol release`` opens it (never an
administrator's hold), ``scancel`` stops, ``scancel --signal=KILL --full`` is the emergency
stop. A ``dj-<job>`` job whose comment doesn't carry dispatch's tag is foreign. The object id
is the job's own id (``JobIDRaw``).

**Recovery.** The supervisor resubmits and holds; a resubmission after a node loss excludes
the lost nodes (``exclude_lost_nodes``). ``requeue`` is enforced natively: a job submitted
requeueable (``options.requeue = "yes"``, or ``#SBATCH --requeue``) is requeued by Slurm on
preemption (PreemptMode=REQUEUE) and node failure, and the backend reports each earlier run
as an execution with the cause sacct names. Every other job is submitted ``--no-requeue``,
so Slurm ends it and dispatch's rules decide.
"""

from dispatch_backends.slurm.backend import (
    AdminHeldError,
    ObjectNotFound,
    SlurmBackend,
    SlurmBackendWithCessation,
    make_slurm_backend,
)
from dispatch_backends.slurm.settings import Accounting, QueueFormat, SlurmSettings

__all__ = [
    "Accounting",
    "AdminHeldError",
    "ObjectNotFound",
    "QueueFormat",
    "SlurmBackend",
    "SlurmBackendWithCessation",
    "SlurmSettings",
    "make_slurm_backend",
]

"""Loading the recorded real Slurm outputs (``tests/data/slurm/``) and the constructed ones
(``tests/data/slurm-constructed/``) for the parser and cause tests."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import msgspec

from dispatch_backends.slurm.observe import Memory, observe
from dispatch_backends.slurm.parse import (
    AcctRow,
    QueueJob,
    parse_sacct,
    parse_squeue_json,
    parse_squeue_text,
)
from dispatch_backends.slurm.settings import Accounting
from dispatch_core.state import ObservedObject

__all__ = [
    "CONSTRUCTED",
    "RECORDED",
    "RECORDED_ACCT_FIELDS",
    "RECORDED_QUEUE_FIELDS",
    "Phase",
    "adopt",
    "load",
    "observe_adopted",
]

_REPO: Final = Path(__file__).resolve().parents[3]
RECORDED: Final = _REPO / "tests" / "data" / "slurm"
CONSTRUCTED: Final = _REPO / "tests" / "data" / "slurm-constructed"

RECORDED_QUEUE_FIELDS: Final = (
    "JobID",
    "JobArrayID",
    "ArrayJobID",
    "ArrayTaskID",
    "Name",
    "State",
    "StateCompact",
    "Reason",
    "RestartCnt",
    "Requeue",
    "DerivedEC",
    "PreemptTime",
    "Partition",
    "NodeList",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "Comment",
)
"""The ``-O`` fields of ``squeue-O.txt`` (tests/data/slurm/README.md)."""

RECORDED_ACCT_FIELDS: Final = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "Partition",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "Reason",
    "Comment",
    "NodeList",
    "NNodes",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "Elapsed",
    "Timelimit",
    "Flags",
    "DBIndex",
    "SubmitLine",
)
"""The ``-o`` fields of ``sacct.txt`` (tests/data/slurm/README.md)."""

NOW: Final = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded snapshot of a scenario."""

    json_jobs: list[QueueJob]
    text_jobs: list[QueueJob]
    rows: list[AcctRow]

    def job(self, name: str, *, source: str = "json") -> QueueJob:
        jobs = self.json_jobs if source == "json" else self.text_jobs
        found = [j for j in jobs if j.name == name]
        assert len(found) == 1, f"{name}: {found}"
        return found[0]


def load(scenario: str, phase: str, *, root: Path = RECORDED) -> Phase:
    """Parse ``squeue.json``, ``squeue-O.txt`` and ``sacct.txt`` of a recorded phase."""
    folder = root / scenario / phase
    text = folder / "squeue-O.txt"
    acct = folder / "sacct.txt"
    return Phase(
        json_jobs=parse_squeue_json((folder / "squeue.json").read_bytes()),
        text_jobs=parse_squeue_text(text.read_text(), RECORDED_QUEUE_FIELDS)
        if text.exists()
        else [],
        rows=parse_sacct(acct.read_text(), RECORDED_ACCT_FIELDS) if acct.exists() else [],
    )


def adopt(
    job: QueueJob,
    rows: Sequence[AcctRow],
    *,
    job_id: str = "x",
    submission: int = 1,
    attempt: int = 1,
) -> tuple[QueueJob, list[AcctRow]]:
    """Rename a recorded job (and its sacct rows) as dispatch names its objects:
    ``dj-<job_id>`` with dispatch's comment tag; everything else stays as Slurm printed it."""
    name = f"dj-{job_id}"
    comment = f"dj:job={job_id} sub={submission} att={attempt} gen=0"
    renamed = [
        msgspec.structs.replace(r, name=name)
        if r.raw_id == job.raw_id and r.name == job.name
        else r
        for r in rows
    ]
    return msgspec.structs.replace(job, name=name, comment=comment), renamed


def observe_adopted(
    job: QueueJob,
    rows: Sequence[AcctRow] | None,
    *,
    accounting: Accounting = Accounting.SLURMDBD,
    now: datetime = NOW,
    memory: Memory | None = None,
    grace_s: float = 30.0,
) -> ObservedObject:
    """Adopt ``job`` and observe it as one poll would."""
    adopted, renamed = adopt(job, rows or [])
    observed = observe(
        adopted,
        renamed if rows is not None else None,
        None,
        cluster="lab",
        now=now,
        memory=memory or Memory(),
        accounting=accounting,
        grace_s=grace_s,
        user_name=lambda uid: "root" if uid == 0 else None,
    )
    assert observed is not None
    return observed

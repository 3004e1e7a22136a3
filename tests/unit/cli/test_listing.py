"""The jobs table's new columns (issue 16): age, latest checkpoint (read from a root this
machine sees), cluster; the JOB/STATE/CAUSE columns stay first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from dispatch_ckpt import Checkpoints
from dispatch_cli.client import ApiClient, JobList, JobSummary, RecordResponse
from dispatch_cli.errors import ApiError
from dispatch_cli.listing import JobRow, age_text, jobs_page, latest_checkpoint, rows_table
from dispatch_core import Cause, CauseKind, Provenance, State

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (86400 * 3 + 5, "3d")],
)
def test_age_is_rounded_down_to_its_largest_unit(seconds: int, text: str) -> None:
    assert age_text(T0, T0 + timedelta(seconds=seconds)) == text


def test_age_unknown_and_clock_skew() -> None:
    assert age_text(None, T0) == "-"
    assert age_text(T0 + timedelta(seconds=5), T0) == "0s"


def test_latest_checkpoint_reads_a_root_this_machine_sees(tmp_path: Path) -> None:
    root = tmp_path / "job"
    assert latest_checkpoint(None) is None
    assert latest_checkpoint(str(root)) is None  # not there (yet)
    assert latest_checkpoint("s3://bucket/job") == "s3"  # not read: a request per job
    ckpt = Checkpoints.open(str(root), attempt="1", epoch=10**6)
    save = Path(ckpt.exec_dir()) / "checkpoint-20"
    save.mkdir(parents=True)
    assert latest_checkpoint(str(root)) == "none"
    ckpt.publish(20, str(save))
    assert latest_checkpoint(str(root)) == "step 20"
    (root / "pub" / "not-a-publication").touch()
    assert latest_checkpoint(str(root)) == "?"


def test_the_table_keeps_job_state_cause_first_and_adds_cluster_age_checkpoint() -> None:
    job = JobSummary(
        job_id="digits-k3x9ab2c",
        state=State.RUNNING,
        cause=Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="x"),
        at=T0,
        seq=4,
        settled=False,
        submission=2,
    )
    row = JobRow(job=job, cluster="slurm", created=T0, latest_checkpoint="step 500")
    none = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
    bare = JobRow(
        job=JobSummary(job_id="new-1", state=State.PENDING, cause=none, at=T0, seq=1, settled=False)
    )
    lines = rows_table([row, bare], T0 + timedelta(minutes=90)).splitlines()
    assert lines[0].split() == [
        "JOB", "STATE", "CAUSE", "CLUSTER", "AGE", "CHECKPOINT", "SUB", "HOLD", "SETTLED",
    ]  # fmt: skip
    assert lines[1].split() == [
        "digits-k3x9ab2c", "running", "preempted", "slurm", "1h", "step", "500", "2", "-", "no",
    ]  # fmt: skip
    assert lines[2].split() == ["new-1", "pending", "none", "-", "-", "-", "-", "-", "no"]


class _OneUnreadable(ApiClient):
    """An API whose listing holds two jobs and one of whose records can't be read (422
    record-unreadable, issue 10 item 4); no HTTP is made."""

    def __init__(self, jobs: tuple[JobSummary, ...], unreadable: str) -> None:
        self._jobs, self._unreadable = jobs, unreadable

    def jobs(self, states: list[str] | None = None) -> JobList:
        return JobList(jobs=self._jobs)

    def record(self, job_id: str, after: int = 0) -> RecordResponse:
        if job_id == self._unreadable:
            raise ApiError(422, "record-unreadable", f"record of job {job_id!r}, event seq 4")
        return msgspec.convert({"job_id": job_id, "events": []}, RecordResponse)


def test_one_unreadable_record_leaves_the_listing_of_the_others_whole() -> None:
    """A job whose record the API can't read is listed with its Status head alone; the
    listing never fails for the other jobs (issue 10: that job's problem, never another's)."""
    none = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
    heads = tuple(
        JobSummary(job_id=j, state=State.RUNNING, cause=none, at=T0, seq=4, settled=False)
        for j in ("bad-1", "good-1")
    )
    page = jobs_page(_OneUnreadable(heads, "bad-1"), checkpoints=False)
    assert [row.job.job_id for row in page.jobs] == ["bad-1", "good-1"]
    assert page.jobs[0] == JobRow(job=heads[0])


def test_an_api_failure_other_than_an_unreadable_record_still_fails_the_listing() -> None:
    none = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
    head = JobSummary(job_id="x-1", state=State.RUNNING, cause=none, at=T0, seq=1, settled=False)

    class _Failing(_OneUnreadable):
        def record(self, job_id: str, after: int = 0) -> RecordResponse:
            raise ApiError(500, "internal", "boom")

    with pytest.raises(ApiError, match="boom"):
        jobs_page(_Failing((head,), ""), checkpoints=False)

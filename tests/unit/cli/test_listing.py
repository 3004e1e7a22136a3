"""The jobs table's new columns (issue 16): age, latest checkpoint (read from a root this
machine sees), cluster; the JOB/STATE/CAUSE columns stay first."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from dispatch_ckpt import Checkpoints
from dispatch_cli.client import ApiClient, JobList, JobSummary, RecordResponse, UnreadableJob
from dispatch_cli.listing import JobRow, age_text, jobs_page, latest_checkpoint, rows_table
from dispatch_core import Cause, CauseKind, Provenance, State

T = TypeVar("T")
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
        "SUPERSEDED",
    ]  # fmt: skip
    assert lines[1].split() == [
        "digits-k3x9ab2c", "running", "preempted", "slurm", "1h", "step", "500", "2", "-", "no",
        "-",
    ]  # fmt: skip
    assert lines[2].split() == ["new-1", "pending", "none", "-", "-", "-", "-", "-", "no", "-"]


def test_a_superseded_job_names_its_successor_under_a_header_of_its_own() -> None:
    old = JobSummary(
        job_id="old-1",
        state=State.FAILED,
        cause=Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER),
        at=T0,
        seq=9,
        settled=True,
        superseded_by="new-2",
    )
    lines = rows_table([JobRow(job=old)], T0).splitlines()
    headers, row = lines[0].split(), lines[1].split()
    assert len(headers) == len(row), lines
    assert dict(zip(headers, row, strict=True))["SUPERSEDED"] == "new-2"
    assert dict(zip(headers, row, strict=True))["SETTLED"] == "yes"


class _Listing(ApiClient):
    """An API whose listing is given; it records each ``GET`` and refuses any record read
    (the listing is one request whatever the number of jobs). No HTTP is made."""

    def __init__(self, listing: JobList) -> None:
        super().__init__("http://api.invalid", None)
        self.listing = listing
        self.asked: list[tuple[str, Mapping[str, str | list[str]] | None]] = []

    def get(
        self, path: str, type_: type[T], query: Mapping[str, str | list[str]] | None = None
    ) -> T:
        self.asked.append((path, query))
        assert type_ is JobList, path
        return cast(T, self.listing)

    def record(self, job_id: str, after: int = 0) -> RecordResponse:
        raise AssertionError(f"the listing read the record of {job_id}")


NONE = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)


def _head(job_id: str, **facts: Any) -> JobSummary:
    return JobSummary(job_id=job_id, state=State.RUNNING, cause=NONE, at=T0, seq=4, settled=False,
        **facts)  # fmt: skip


def test_filters_and_paging_are_asked_of_the_api_in_one_request(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    heads = (
        _head("a-1", cluster="slurm", created_at=T0, checkpoint=str(root)),
        _head("a-2", cluster="slurm", created_at=T0, checkpoint="s3://b/a-2"),
    )
    unreadable = (UnreadableJob(job_id="bad-1", seq=4, message="does not decode"),)
    api = _Listing(JobList(jobs=heads, unreadable=unreadable, total=7, next_after="a-2"))
    page = jobs_page(
        api, states=[State.RUNNING, State.HELD], clusters=["slurm"], after="a-0", limit=2
    )
    assert api.asked == [
        (
            "/v1/jobs",
            {"state": ["running", "held"], "cluster": ["slurm"], "after": "a-0", "limit": "2"},
        )
    ]
    assert [(r.job.job_id, r.cluster, r.created) for r in page.jobs] == [
        ("a-1", "slurm", T0),
        ("a-2", "slurm", T0),
    ]
    assert [r.latest_checkpoint for r in page.jobs] == [None, "s3"]  # root not there; s3
    assert (page.next_after, page.total) == ("a-2", 7)
    assert page.unreadable == ()  # named on the first page only

    first = jobs_page(api, limit=50, checkpoints=False)
    assert api.asked[-1] == ("/v1/jobs", {"limit": "50"})
    assert first.unreadable == unreadable


def test_an_api_without_the_facts_lists_rows_with_unknown_cluster_and_age() -> None:
    """An API older than the jobs index answers every job and no facts: rows say ``-``."""
    page = jobs_page(_Listing(JobList(jobs=(_head("old-1"),))), checkpoints=False)
    assert page.jobs == (JobRow(job=_head("old-1")),)
    assert page.next_after is None


def test_the_step_the_observer_read_is_shown_for_any_root_s3_too() -> None:
    """The cluster's observer reads ``pub/`` where the storage is (issue 14): its step is
    shown even for an S3 root or a path this machine doesn't see."""
    heads = (
        _head("p-1", checkpoint="s3://b/p-1", published_step=900, published_at=T0),
        _head("p-2", checkpoint="/not/here/p-2", published_step=20, published_at=T0),
        _head("p-3", checkpoint="s3://b/p-3"),
    )
    page = jobs_page(_Listing(JobList(jobs=heads)), checkpoints=True)
    assert [r.latest_checkpoint for r in page.jobs] == ["step 900", "step 20", "s3"]


def test_the_client_sends_offset_only_when_asked() -> None:
    api = _Listing(JobList(jobs=()))
    api.jobs(offset=100, limit=10)
    api.jobs(offset=0)
    assert api.asked == [("/v1/jobs", {"offset": "100", "limit": "10"}), ("/v1/jobs", None)]


def test_a_job_a_failover_moved_shows_both_clusters() -> None:
    """``spec.cluster`` alone read as if a failed-over job still ran where it started."""
    heads = (
        _head("f-1", cluster="lab2", current_cluster="local"),
        _head("f-2", cluster="lab2", current_cluster="lab2"),
        _head("f-3", cluster="lab2"),
    )
    page = jobs_page(_Listing(JobList(jobs=heads)), checkpoints=False)
    assert [r.cluster for r in page.jobs] == ["lab2->local", "lab2", "lab2"]

"""The parsers and the cause table on constructed outputs (``tests/data/slurm-constructed/``):
what the 22.05 test cluster can't produce (other versions' JSON, BOOT_FAIL, DEADLINE,
REVOKED, a cancel by another uid, throttled arrays, hetjobs). See that folder's README for
how each file was written."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dispatch_backends.slurm.observe import Memory, observe, observe_all
from dispatch_backends.slurm.parse import (
    AcctRow,
    QueueJob,
    parse_sacct,
    parse_squeue_json,
    parse_squeue_text,
    runs,
)
from dispatch_backends.slurm.settings import Accounting
from dispatch_core.state import CauseKind, GateState, ObjectPhase, Provenance
from tests.unit.slurm.recorded import CONSTRUCTED, NOW

_V1_FIELDS = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "Partition",
    "State",
    "ExitCode",
    "Reason",
    "NodeList",
    "Submit",
    "Start",
    "End",
    "DBIndex",
    "Comment",
)
"""The fields of the constructed sacct files (the backend's before it read memory)."""


def _rows(name: str) -> list[AcctRow]:
    return parse_sacct((CONSTRUCTED / name).read_text(), _V1_FIELDS)


def _json(version: str) -> list[QueueJob]:
    return parse_squeue_json((CONSTRUCTED / f"squeue-v{version}.json").read_bytes())


@pytest.mark.parametrize("version", ["0.0.40", "0.0.41"])
def test_later_versions_json_is_read(version: str) -> None:
    jobs = {j.raw_id: j for j in _json(version)}
    assert jobs["101"].state == "RUNNING"
    assert jobs["101"].nodes == ("node1", "node2")
    assert jobs["102"].exit is not None
    assert jobs["102"].exit.words == "2:0"
    assert jobs["103"].exit is not None
    assert jobs["103"].exit.words == "0:15"
    assert (jobs["104"].state, jobs["104"].flags) == ("CANCELLED", frozenset({"COMPLETING"}))
    assert (jobs["105"].state, jobs["105"].flags, jobs["105"].restarts) == (
        "PENDING",
        frozenset({"REQUEUED"}),
        1,
    )
    assert jobs["109"].exit is not None
    assert jobs["109"].exit.words == "0:125"
    assert (jobs["110"].display_id, jobs["110"].array_job_id) == ("200_2", "200")
    assert (jobs["200"].display_id, jobs["200"].array_task) == ("200_[3-8%2]", "3-8%2")
    assert jobs["101"].start is not None
    assert jobs["101"].start.tzinfo is not None
    assert jobs["106"].end is None  # an unset time struct


@pytest.mark.parametrize("version", ["0.0.40", "0.0.41"])
def test_later_versions_json_is_classified(version: str) -> None:
    jobs = [j for j in _json(version) if j.user == "root"]
    memory = Memory()
    objects = observe_all(
        jobs,
        [],
        None,
        cluster="lab",
        now=NOW,
        memory=memory,
        grace_s=30.0,
    )
    # an out-of-memory end sacct doesn't show yet waits for its step rows, then stands
    (waiting,) = objects["oom"]
    assert waiting.phase is ObjectPhase.STOPPING
    later = observe_all(
        jobs, [], None, cluster="lab", now=NOW + timedelta(seconds=31), memory=memory
    )
    objects = {**objects, "oom": later["oom"]}
    assert "other-user" not in objects

    def one(job: str):  # type: ignore[no-untyped-def]
        (observed,) = objects[job]
        return observed

    fail = one("fail").cause
    assert fail is not None
    assert (fail.kind, fail.exit_code, fail.detail) == (
        CauseKind.NON_ZERO_EXIT,
        2,
        "FAILED 2:0 (NonZeroExitCode)",
    )
    assert one("stopping").phase is ObjectPhase.STOPPING
    assert one("requeued").phase is ObjectPhase.PENDING
    assert one("held").gate is GateState.CLOSED
    assert one("held").submission == 2
    assert one("admin").gate is GateState.ADMIN_HELD
    boot = one("boot").cause
    assert boot is not None
    assert (boot.kind, boot.provenance, boot.detail) == (
        CauseKind.LAUNCH_FAILED,
        Provenance.SCHEDULER,
        "BOOT_FAIL 0:0 (BootFail)",
    )
    oom = one("oom").cause
    assert oom is not None
    assert oom.kind is CauseKind.OUT_OF_MEMORY
    assert oom.detail == "OUT_OF_MEMORY 0:125 (OutOfMemory)"
    deadline = one("deadline").cause
    assert deadline is not None
    assert deadline.kind is CauseKind.TIME_LIMIT
    foreign = one("foreign")
    assert foreign.foreign
    assert foreign.phase is ObjectPhase.RUNNING
    array = sorted(objects["arr"], key=lambda o: o.ref.id)
    assert [o.ref.id for o in array] == ["110", "200"]
    assert array[0].cause is not None
    assert array[0].cause.exit_code == 1
    # a cancel sacct doesn't show yet waits for the actor
    assert one("cancel").phase is ObjectPhase.STOPPING


def test_the_endings_slurm_2205_cant_produce() -> None:
    rows = _rows("sacct-endings.txt")

    def ended(raw_id: str, name: str, state: str, nodes: str = "node1") -> QueueJob:
        return QueueJob(
            raw_id=raw_id,
            display_id=raw_id,
            name=name,
            state=state,
            comment=f"dj:job={name[3:]} sub=1 att=1 gen=0",
            nodes=tuple(n for n in nodes.split(",") if n),
        )

    cases = [
        (ended("108", "dj-boot", "BOOT_FAIL"), CauseKind.LAUNCH_FAILED, Provenance.SCHEDULER,
         "BOOT_FAIL 0:0", None),
        (ended("103", "dj-cancel", "CANCELLED"), CauseKind.CANCELLED, Provenance.ACTOR,
         "CANCELLED by 1234 0:0", "uid 1234"),
        (ended("121", "dj-cancel-trailing", "CANCELLED"), CauseKind.CANCELLED,
         Provenance.ACTOR, "CANCELLED by 1234 0:0", "uid 1234"),
        (ended("122", "dj-cancel-words", "CANCELLED"), CauseKind.CANCELLED, Provenance.ACTOR,
         "CANCELLED by 1234 via slurmrestd 0:0", "uid 1234"),
        (ended("112", "dj-deadline", "DEADLINE", "node2"), CauseKind.TIME_LIMIT,
         Provenance.SCHEDULER, "DEADLINE 0:0", None),
        (ended("123", "dj-deadline-never", "DEADLINE", ""), CauseKind.UNKNOWN,
         Provenance.SCHEDULER, "DEADLINE 0:0", None),
        (ended("124", "dj-revoked", "REVOKED", ""), CauseKind.UNKNOWN, Provenance.SCHEDULER,
         "REVOKED 0:0", None),
    ]  # fmt: skip
    for job, kind, provenance, words, actor in cases:
        observed = observe(job, rows, None, cluster="lab", now=NOW, memory=Memory())
        assert observed is not None
        cause = observed.cause
        assert cause is not None, job.name
        assert (cause.kind, cause.provenance, cause.detail) == (kind, provenance, words), job
        assert cause.exit_code is None
        assert (cause.actor.name if cause.actor else None) == actor, job.name


def test_array_hetjob_and_step_ids() -> None:
    rows = _rows("sacct-endings.txt") + _rows("sacct-steps.txt")
    by_id = {r.job_id.job + (f".{r.step}" if r.step else ""): r for r in rows}
    task = by_id["200_2"]
    assert (task.raw_id, task.job_id.base, task.job_id.array_task) == ("110", "200", "2")
    assert by_id["200_[3-8%2]"].job_id.array_task == "[3-8%2]"
    assert by_id["200_2.batch"].step == "batch"
    assert by_id["200_2.batch"].raw_id == "110"
    assert by_id["200_2.0"].step == "0"
    assert by_id["300+1"].job_id.het_offset == "1"
    assert by_id["300+1"].raw_id == "301"
    assert by_id["300+1.0"].nodes == ("node2", "node3")
    # the runs of a job are its own rows, never its steps
    assert [r.state for r in runs(_rows("sacct-steps.txt"), "110")] == ["FAILED"]


def test_jobcomp_records_a_requeue_by_scontrol_as_pending() -> None:
    jobs = parse_squeue_text((CONSTRUCTED / "squeue-O-requeued.txt").read_text())
    rows = _rows("sacct-jobcomp-requeue.txt")
    objects = observe_all(
        jobs,
        rows,
        None,
        cluster="lab",
        now=NOW,
        memory=Memory(),
        accounting=Accounting.JOBCOMP,
    )
    (requeued,) = objects["requeued"]
    assert [e.cause.kind for e in requeued.executions] == [CauseKind.REQUEUED]
    assert requeued.executions[0].cause.detail == "PENDING 0:0"
    (preempted,) = objects["preempted-rq"]
    assert [e.cause.kind for e in preempted.executions] == [CauseKind.PREEMPTED]
    assert preempted.executions[0].nodes == ("node2", "node3")
    (pipe,) = objects["pipe"]
    assert (pipe.submission, pipe.attempt, pipe.phase) == (2, 1, ObjectPhase.RUNNING)
    assert jobs[-1].comment == "dj:job=pipe sub=2 att=1 gen=0 note=a|b"

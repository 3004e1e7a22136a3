"""Memory endings judged with sacct's step rows, and jobs slurmctld forgot looked up in
accounting (issue 15), on real Slurm 22.05 outputs recorded with the backend's own
commands (``deploy/slurm/record-steps.sh``: ``tests/data/slurm/{oom-steps, sigkill-self,
gone-completed, oom-cgroup-steps, oom-cgroup-child, oom-cgroup-srun}``) and on two
constructed rows 22.05 can't produce (``tests/data/slurm-constructed/sacct-oom.txt``).

Each rule of ``causes.py``'s "Steps corroborate memory" table is shown both ways: a case
it makes out-of-memory, and one it leaves as it was.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Final

import msgspec

from dispatch_backends.slurm.causes import step_verdict
from dispatch_backends.slurm.observe import Alive, Memory, observe, observe_gone
from dispatch_backends.slurm.parse import (
    ACCT_FIELDS,
    QUEUE_FIELDS,
    AcctRow,
    QueueJob,
    parse_memory,
    parse_sacct,
    parse_squeue_text,
)
from dispatch_backends.slurm.settings import Accounting
from dispatch_core.state import CauseKind, ObjectPhase, ObjectRef, ObservedObject, Provenance
from tests.unit.slurm.recorded import CONSTRUCTED, NOW, RECORDED, RECORDED_ACCT_FIELDS

_SCRIPT: Final = Path(__file__).resolve().parents[3] / "deploy" / "slurm" / "record-steps.sh"


def _recorded(scenario: str, phase: str = "end") -> tuple[list[QueueJob], list[AcctRow]]:
    folder = RECORDED / scenario / phase
    return (
        parse_squeue_text((folder / "squeue-O.txt").read_text()),
        parse_sacct((folder / "sacct.txt").read_text()),
    )


def _adopt(
    jobs: list[QueueJob], rows: list[AcctRow], job_id: str = "mem"
) -> tuple[QueueJob, list[AcctRow]]:
    """The recorded job as dispatch names its objects (nothing else changed)."""
    (job,) = jobs
    name = f"dj-{job_id}"
    adopted = msgspec.structs.replace(job, name=name, comment=f"dj:job={job_id} sub=1 att=1 gen=0")
    renamed = [
        msgspec.structs.replace(r, name=name) if r.step is None and r.raw_id == job.raw_id else r
        for r in rows
    ]
    return adopted, renamed


def _observe(scenario: str) -> ObservedObject:
    job, rows = _adopt(*_recorded(scenario))
    observed = observe(job, rows, None, cluster="lab", now=NOW, memory=Memory(), grace_s=30.0)
    assert observed is not None
    assert observed.phase is ObjectPhase.ENDED, observed
    return observed


def test_the_recordings_use_the_backends_own_formats() -> None:
    text = _SCRIPT.read_text()
    sacct = re.search(r"^SA_FIELDS='([^']*)'", text, re.MULTILINE)
    squeue = re.search(r"^SQ_OFMT='([^']*)'", text, re.MULTILINE)
    assert sacct is not None
    assert squeue is not None
    assert tuple(sacct.group(1).split(",")) == ACCT_FIELDS
    assert tuple(f.removesuffix(":|") for f in squeue.group(1).split(",")) == QUEUE_FIELDS


def test_over_memory_kill_with_maxrss_over_the_request_is_out_of_memory() -> None:
    """OverMemoryKill without cgroup: ``FAILED 0:9 (JobLaunchFailure)``, and the batch
    step's MaxRSS (sampled by jobacct_gather) over its ``mem=100M``."""
    cause = _observe("oom-steps").cause
    assert cause is not None
    assert (cause.kind, cause.provenance) == (CauseKind.OUT_OF_MEMORY, Provenance.SCHEDULER)
    assert re.fullmatch(
        r"FAILED 0:9 \(JobLaunchFailure\); batch CANCELLED by 0 0:9: MaxRSS \d+K reached its "
        r"memory request 100M",
        cause.detail,
    ), cause.detail


def test_a_signal_9_under_the_memory_request_stays_unknown() -> None:
    """The other direction: the script SIGKILLed itself at 3 MB of its 100 MB."""
    cause = _observe("sigkill-self").cause
    assert cause is not None
    assert cause.kind is CauseKind.UNKNOWN
    assert cause.detail.startswith("FAILED 0:9"), cause.detail


def test_a_cgroup_oom_with_its_batch_step_out_of_memory() -> None:
    cause = _observe("oom-cgroup-steps").cause
    assert cause is not None
    assert cause.kind is CauseKind.OUT_OF_MEMORY
    assert cause.detail == "OUT_OF_MEMORY 0:125 (OutOfMemory); batch OUT_OF_MEMORY 0:125"


def test_an_oom_killed_child_makes_22_05s_batch_step_out_of_memory_though_the_script_went_on() -> (
    None
):
    """22.05 with cgroup v1 marks the batch step itself ``OUT_OF_MEMORY 0:125`` when any
    process of it was OOM-killed, even when the script then exits 0: the steps say
    out-of-memory, and so does dispatch."""
    output = next((RECORDED / "oom-cgroup-child" / "end").glob("output-*")).read_text()
    assert "the script goes on after its child" in output
    cause = _observe("oom-cgroup-child").cause
    assert cause is not None
    assert cause.kind is CauseKind.OUT_OF_MEMORY
    assert cause.detail.endswith("; batch OUT_OF_MEMORY 0:125"), cause.detail


def test_an_srun_step_out_of_memory_makes_a_non_zero_exit_out_of_memory() -> None:
    """The job row says ``FAILED 1:0`` (the script's own exit after srun failed); its step
    ``.0`` says ``OUT_OF_MEMORY``: any OUT_OF_MEMORY step is out-of-memory."""
    cause = _observe("oom-cgroup-srun").cause
    assert cause is not None
    assert cause.kind is CauseKind.OUT_OF_MEMORY
    assert cause.detail.startswith("FAILED 1:0"), cause.detail
    assert cause.detail.endswith("; 0 OUT_OF_MEMORY 0:125"), cause.detail


def test_a_plain_non_zero_exit_stays_one() -> None:
    """The other direction of the step rule: ``FAILED 1:0`` with a ``FAILED 1:0`` batch
    step and no other (recorded ``exit1``)."""
    rows = parse_sacct((RECORDED / "exit1" / "end" / "sacct.txt").read_text(), RECORDED_ACCT_FIELDS)
    job = next(r for r in rows if r.step is None)
    steps = [r for r in rows if r.step is not None]
    assert step_verdict("FAILED 1:0", "FAILED", job.exit, steps, job_row=job) is None


def _constructed(job_id: str) -> tuple[AcctRow, list[AcctRow]]:
    text = (CONSTRUCTED / "sacct-oom.txt").read_text()
    rows = [r for r in parse_sacct(text) if r.raw_id == job_id]
    job = next(r for r in rows if r.step is None)
    return job, [r for r in rows if r.step is not None]


def test_out_of_memory_whose_batch_step_completed_with_exit_0_is_not_out_of_memory() -> None:
    """galaxy#6832's shape (constructed): the job row ``OUT_OF_MEMORY 0:125``, its batch
    step ``COMPLETED 0:0``: the work finished; both rows' words are kept."""
    job, steps = _constructed("501")
    cause = step_verdict("OUT_OF_MEMORY 0:125", "OUT_OF_MEMORY", job.exit, steps, job_row=job)
    assert cause is not None
    assert (cause.kind, cause.provenance, cause.exit_code) == (
        CauseKind.NONE,
        Provenance.APPLICATION,
        0,
    )
    assert cause.detail.startswith("OUT_OF_MEMORY 0:125; batch COMPLETED 0:0"), cause.detail


def test_failed_0_125_is_out_of_memory() -> None:
    job, steps = _constructed("502")
    cause = step_verdict("FAILED 0:125", "FAILED", job.exit, steps, job_row=job)
    assert cause is not None
    assert cause.kind is CauseKind.OUT_OF_MEMORY
    assert cause.detail == "FAILED 0:125"


def test_memory_figures() -> None:
    assert parse_memory("426204K") == 426204 * 1024
    assert parse_memory("100M") == 100 * 1024**2
    assert parse_memory("100Mn") == 100 * 1024**2
    assert parse_memory("1.5G") == int(1.5 * 1024**3)
    assert parse_memory("0") == 0
    assert parse_memory("") is None
    assert parse_memory("16?") is None


def test_an_out_of_memory_end_waits_for_sacct_to_show_its_steps() -> None:
    """slurmctld shows ``FAILED 0:9`` before sacct has the batch step: ``stopping`` until
    it does (within the grace), then the steps decide."""
    job, rows = _adopt(*_recorded("oom-steps"))
    memory = Memory()
    early = observe(job, [], None, cluster="lab", now=NOW, memory=memory, grace_s=30.0)
    assert early is not None
    assert early.phase is ObjectPhase.STOPPING
    done = observe(job, rows, None, cluster="lab", now=NOW + timedelta(seconds=2), memory=memory)
    assert done is not None
    assert done.cause is not None
    assert done.cause.kind is CauseKind.OUT_OF_MEMORY
    never = Memory()  # sacct never shows the steps: after the grace, the table's answer
    first = observe(job, [], None, cluster="lab", now=NOW, memory=never)
    assert first is not None
    assert first.phase is ObjectPhase.STOPPING
    after = observe(job, [], None, cluster="lab", now=NOW + timedelta(seconds=31), memory=never)
    assert after is not None
    assert after.cause is not None
    assert after.cause.kind is CauseKind.UNKNOWN


# -- gone is not ended -------------------------------------------------------------------------

REF: Final = ObjectRef(cluster="lab", id="10")


def _gone_rows() -> tuple[list[AcctRow], str]:
    jobs, rows = _recorded("gone-completed", "gone")
    assert jobs == []  # slurmctld forgot it (MinJobAge)
    (job_row,) = [r for r in rows if r.step is None]
    return [
        msgspec.structs.replace(r, name="dj-gone") if r.step is None else r for r in rows
    ], job_row.raw_id


def _memory_of(raw_id: str) -> Memory:
    memory = Memory()
    memory.alive[raw_id] = Alive(job_id="gone", name="dj-gone", submission=3, attempt=1)
    return memory


def test_a_job_slurmctld_forgot_ends_with_accountings_cause() -> None:
    rows, raw_id = _gone_rows()
    ref = ObjectRef(cluster="lab", id=raw_id)
    memory = _memory_of(raw_id)
    ended, vanished = observe_gone([ref], rows, now=NOW, memory=memory)
    assert vanished == ()
    (obj,) = ended["gone"]
    assert (obj.ref, obj.phase, obj.submission, obj.attempt) == (ref, ObjectPhase.ENDED, 3, 1)
    assert obj.cause is not None
    assert (obj.cause.kind, obj.cause.provenance, obj.cause.exit_code, obj.cause.detail) == (
        CauseKind.NONE,
        Provenance.APPLICATION,
        0,
        "COMPLETED 0:0",
    )
    assert raw_id not in memory.alive  # reported once


def test_a_job_accounting_has_no_end_for_is_vanished_after_the_grace() -> None:
    ref = ObjectRef(cluster="lab", id="999")
    memory = _memory_of("999")
    assert observe_gone([ref], [], now=NOW, memory=memory) == ({}, ())
    later = NOW + timedelta(seconds=31)
    assert observe_gone([ref], [], now=later, memory=memory) == ({}, (ref,))
    assert "999" not in memory.alive


def test_nothing_is_decided_while_accounting_cant_be_read() -> None:
    memory = _memory_of("999")
    later = NOW + timedelta(hours=1)
    ref = ObjectRef(cluster="lab", id="999")
    assert observe_gone([ref], None, now=NOW, memory=memory) == ({}, ())
    assert observe_gone([ref], None, now=later, memory=memory) == ({}, ())
    assert "999" in memory.alive


def test_without_accounting_a_forgotten_job_is_vanished_at_once() -> None:
    ref = ObjectRef(cluster="lab", id="999")
    assert observe_gone(
        [ref], None, now=NOW, memory=_memory_of("999"), accounting=Accounting.NONE
    ) == ({}, (ref,))


def test_a_job_only_the_caller_expected_is_named_by_sacct_and_its_submit_line() -> None:
    """After an observer restart the backend never saw the job: its name comes from sacct's
    JobName, dispatch's tag from ``SubmitLine`` (sacct keeps ``--comment`` only with
    ``job_comment``; the recorded ``dj-comment`` job)."""
    rows = parse_sacct(
        (RECORDED / "dj-comment" / "end" / "sacct.txt").read_text(), RECORDED_ACCT_FIELDS
    )
    ref = ObjectRef(cluster="lab", id="10")
    ended, vanished = observe_gone([ref], rows, now=NOW, memory=Memory())
    assert vanished == ()
    (obj,) = ended["abc"]
    assert (obj.name, obj.submission, obj.attempt) == ("dj-abc", 1, 1)
    assert obj.cause is not None
    assert obj.cause.kind is CauseKind.NONE


def test_a_requeued_job_slurmctld_forgot_keeps_each_runs_cause() -> None:
    """``requeue-twice``: preempted, then its node failed, then completed; each earlier run
    is an execution with sacct's cause."""
    rows = [
        r
        for r in parse_sacct(
            (RECORDED / "requeue-twice" / "end" / "sacct.txt").read_text(), RECORDED_ACCT_FIELDS
        )
        if r.raw_id == "20"
    ]
    rows = [msgspec.structs.replace(r, name="dj-twice") if r.step is None else r for r in rows]
    ref = ObjectRef(cluster="lab", id="20")
    memory = Memory()
    memory.alive["20"] = Alive(job_id="twice", name="dj-twice", submission=1, attempt=1)
    ended, _ = observe_gone([ref], rows, now=NOW, memory=memory)
    (obj,) = ended["twice"]
    assert obj.restarts == 2
    assert [e.cause.kind for e in obj.executions] == [CauseKind.PREEMPTED, CauseKind.NODE_LOST]
    assert obj.cause is not None
    assert obj.cause.kind is CauseKind.NONE

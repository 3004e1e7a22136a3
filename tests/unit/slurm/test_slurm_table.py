"""The cause table row by row, the small parsers, and how commands that can't reach
slurmctld are recognised."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_backends.protocol import Unreachable
from dispatch_backends.slurm.causes import (
    actor_uid,
    cancel_actor,
    end_cause,
    gate_of,
    pending_cause,
    phase_of,
    run_cause,
)
from dispatch_backends.slurm.commands import CommandTimeout, Runner
from dispatch_backends.slurm.observe import Memory, observe
from dispatch_backends.slurm.parse import (
    ExitStatus,
    ParseError,
    QueueJob,
    expand_hostlist,
    parse_comment,
    parse_exit,
    parse_job_id,
    parse_sinfo,
    wait_status,
)
from dispatch_core.state import CauseKind, GateState, ObjectPhase, Provenance
from tests.unit.slurm.recorded import NOW

E = ExitStatus

TABLE = [
    # state, words, exit, reason, ran, kind, provenance, exit_code, detail
    ("COMPLETED", None, E(0, 0), "None", True, CauseKind.NONE, Provenance.APPLICATION, 0,
     "COMPLETED 0:0"),
    ("FAILED", None, E(1, 0), "NonZeroExitCode", True, CauseKind.NON_ZERO_EXIT,
     Provenance.APPLICATION, 1, "FAILED 1:0 (NonZeroExitCode)"),
    ("FAILED", None, E(0, 9), "JobLaunchFailure", True, CauseKind.UNKNOWN,
     Provenance.SCHEDULER, None, "FAILED 0:9 (JobLaunchFailure)"),
    ("FAILED", None, E(0, 15), "", True, CauseKind.UNKNOWN, Provenance.SCHEDULER, None,
     "FAILED 0:15"),
    ("FAILED", None, None, "", True, CauseKind.UNKNOWN, Provenance.SCHEDULER, None, "FAILED"),
    ("TIMEOUT", None, E(143, 0), "TimeLimit", True, CauseKind.TIME_LIMIT, Provenance.SCHEDULER,
     None, "TIMEOUT 143:0 (TimeLimit)"),
    ("TIMEOUT", None, E(0, 15), "TimeLimit", True, CauseKind.TIME_LIMIT, Provenance.SCHEDULER,
     None, "TIMEOUT 0:15 (TimeLimit)"),
    ("PREEMPTED", None, E(0, 15), "None", True, CauseKind.PREEMPTED, Provenance.SCHEDULER,
     None, "PREEMPTED 0:15"),
    ("NODE_FAIL", None, E(0, 0), "NodeDown", True, CauseKind.NODE_LOST, Provenance.SCHEDULER,
     None, "NODE_FAIL 0:0 (NodeDown)"),
    ("OUT_OF_MEMORY", None, E(0, 125), "OutOfMemory", True, CauseKind.OUT_OF_MEMORY,
     Provenance.SCHEDULER, None, "OUT_OF_MEMORY 0:125 (OutOfMemory)"),
    ("CANCELLED", "CANCELLED by 0", E(0, 15), "None", True, CauseKind.CANCELLED,
     Provenance.ACTOR, None, "CANCELLED by 0 0:15"),
    ("CANCELLED", None, E(0, 15), "None", True, CauseKind.CANCELLED, Provenance.SCHEDULER,
     None, "CANCELLED 0:15"),
    ("BOOT_FAIL", None, E(0, 0), "BootFail", False, CauseKind.LAUNCH_FAILED,
     Provenance.SCHEDULER, None, "BOOT_FAIL 0:0 (BootFail)"),
    ("DEADLINE", None, None, "DeadLine", True, CauseKind.TIME_LIMIT, Provenance.SCHEDULER,
     None, "DEADLINE (DeadLine)"),
    ("DEADLINE", None, None, "DeadLine", False, CauseKind.UNKNOWN, Provenance.SCHEDULER, None,
     "DEADLINE (DeadLine)"),
    ("REVOKED", None, None, "", False, CauseKind.UNKNOWN, Provenance.SCHEDULER, None,
     "REVOKED"),
    ("SOMETHING_NEW", None, E(0, 0), "Odd", True, CauseKind.UNKNOWN, Provenance.SCHEDULER,
     None, "SOMETHING_NEW 0:0 (Odd)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "words", "exit", "reason", "ran", "kind", "provenance", "exit_code", "detail"),
    TABLE,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(TABLE)],
)
def test_the_cause_table(
    state: str,
    words: str | None,
    exit: ExitStatus | None,
    reason: str,
    ran: bool,
    kind: CauseKind,
    provenance: Provenance,
    exit_code: int | None,
    detail: str,
) -> None:
    uid = actor_uid(words or state)
    actor = cancel_actor(uid, "root") if uid is not None else None
    cause = end_cause(state, words=words, exit=exit, reason=reason, ran=ran, actor=actor)
    assert (cause.kind, cause.provenance, cause.exit_code, cause.detail) == (
        kind,
        provenance,
        exit_code,
        detail,
    )
    assert (cause.actor is not None) == (provenance is Provenance.ACTOR)


def test_earlier_runs() -> None:
    assert run_cause("RUNNING", E(0, 0)) is None  # not final yet: wait
    assert run_cause("PENDING", E(0, 0)) is None
    requeued = run_cause("REQUEUED", E(0, 0))
    assert requeued is not None
    assert requeued.kind is CauseKind.REQUEUED
    jobcomp = run_cause("PENDING", E(0, 0), jobcomp=True)
    assert jobcomp is not None
    assert jobcomp.kind is CauseKind.REQUEUED
    failed = run_cause("FAILED", E(1, 0))
    assert failed is not None
    assert (failed.kind, failed.exit_code) == (CauseKind.NON_ZERO_EXIT, 1)


def test_phases_and_gates() -> None:
    assert phase_of("PENDING") is ObjectPhase.PENDING
    assert phase_of("CONFIGURING") is ObjectPhase.PENDING
    assert phase_of("RUNNING") is ObjectPhase.RUNNING
    assert phase_of("SUSPENDED") is ObjectPhase.RUNNING
    assert phase_of("COMPLETING") is ObjectPhase.STOPPING
    assert phase_of("CANCELLED", frozenset({"COMPLETING"})) is ObjectPhase.STOPPING
    assert phase_of("NODE_FAIL") is ObjectPhase.ENDED
    assert phase_of("WHATEVER") is ObjectPhase.UNKNOWN
    assert gate_of("PENDING", "JobHeldUser") is GateState.CLOSED
    assert gate_of("PENDING", "JobHeldAdmin") is GateState.ADMIN_HELD
    assert gate_of("SPECIAL_EXIT", "None") is GateState.ADMIN_HELD
    assert gate_of("PENDING", "Resources") is GateState.OPEN
    assert gate_of("RUNNING", "JobHeldUser") is GateState.OPEN


def test_small_parsers() -> None:
    assert wait_status(256) == E(1, 0)
    assert wait_status(768) == E(3, 0)
    assert wait_status(15) == E(0, 15)
    assert wait_status(253) == E(0, 125)
    assert wait_status(36608) == E(143, 0)
    assert parse_exit("0:15") == E(0, 15)
    assert parse_exit("") is None
    with pytest.raises(ParseError):
        parse_exit("x")
    assert expand_hostlist("node[1-3],gpu[01-02,05]") == (
        "node1",
        "node2",
        "node3",
        "gpu01",
        "gpu02",
        "gpu05",
    )
    assert expand_hostlist("rack[1-2]-n[1-2]") == ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")
    assert expand_hostlist("None assigned") == ()
    with pytest.raises(ParseError):
        expand_hostlist("node[1-")
    assert parse_job_id("123_4.batch").step == "batch"
    assert parse_job_id("123_4.batch").job == "123_4"
    assert parse_job_id("123+0.0").het_offset == "0"
    with pytest.raises(ParseError):
        parse_job_id("abc")
    assert parse_comment("dj:job=abc sub=1 att=1") is not None
    foreigns = (
        "",
        "(null)",
        "dj:job=abc sub=0 att=1",
        "dj:job=abc sub=1",
        "x dj:job=a sub=1 att=1",
        "dj:job=abc sub=1 sub=2 att=1",
    )
    for foreign in foreigns:
        assert parse_comment(foreign) is None, foreign
    nodes = parse_sinfo(
        "node1|allocated*|none\nnode1|allocated*|none\nnode2|down|lost\nnode3|failing|x\n"
        "node4|mixed+not_responding|none|\nnode5|mixed+fail|x|\nnode6|down+fail|x|\n"
        "node7|idle+drain|x|\n"
    )
    assert nodes["node4"].lost
    assert not nodes["node5"].lost
    assert nodes["node6"].lost
    assert not nodes["node7"].lost
    assert nodes["node5"].reason == "x"
    assert nodes["node1"].lost
    assert nodes["node2"].lost
    assert not nodes["node3"].lost


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


async def test_a_command_that_cant_reach_slurmctld_is_unreachable(tmp_path: Path) -> None:
    _fake(
        tmp_path,
        "squeue",
        'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2\n'
        "exit 1\n",
    )
    _fake(tmp_path, "sinfo", "sleep 5\n")
    _fake(tmp_path, "scancel", 'echo "$SLURM_TIME_FORMAT $SQUEUE_FORMAT"\n')
    runner = Runner("lab", bin_dir=str(tmp_path), timeout_s=0.5, base_env={"SQUEUE_FORMAT": "x"})
    with pytest.raises(Unreachable, match="Unable to contact slurm controller"):
        await runner.run("squeue")
    with pytest.raises(CommandTimeout):
        await runner.run("sinfo")
    with pytest.raises(Unreachable, match="cannot run"):
        await runner.run("sacct")
    result = await runner.run("scancel")
    assert result.stdout == "standard \n"  # SLURM_TIME_FORMAT set, SQUEUE_FORMAT dropped
    assert runner.calls == 4


# -- waiting for capacity (causes.py, "Waiting for capacity") ---------------------------------

_ALL_DOWN = (
    "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"
)


@pytest.mark.parametrize(
    "reason",
    [
        "ReqNodeNotAvail",
        "ReqNodeNotAvail, UnavailableNodes:node[1-3]",
        _ALL_DOWN,  # the test cluster's words with every node down (squeue %r)
        _ALL_DOWN.replace(" ", "_"),  # the same reason's code name
        "NodeDown",
        "PartitionDown",
        "PartitionInactive",
        "PartitionNodeLimit",
    ],
)
def test_pending_reasons_that_say_no_capacity(reason: str) -> None:
    cause = pending_cause("PENDING", reason)
    assert cause is not None
    assert (cause.kind, cause.provenance) == (CauseKind.NO_CAPACITY, Provenance.SCHEDULER)
    assert cause.detail == f"PENDING ({reason})"  # Slurm's words, verbatim


@pytest.mark.parametrize(
    "reason",
    ["Resources", "Priority", "Dependency", "BeginTime", "AssocGrpCpuLimit", "None", ""],
)
def test_ordinary_queueing_is_not_no_capacity(reason: str) -> None:
    assert pending_cause("PENDING", reason) is None


def _queued(reason: str, *, state: str = "PENDING") -> QueueJob:
    return QueueJob(
        raw_id="77",
        display_id="77",
        name="dj-j1",
        state=state,
        reason=reason,
        comment="dj:job=j1 sub=1 att=1",
    )


def test_observe_reports_a_gate_open_no_capacity_wait_as_pending_no_capacity() -> None:
    seen = observe(_queued(_ALL_DOWN), None, None, cluster="lab", now=NOW, memory=Memory())
    assert seen is not None
    assert (seen.phase, seen.gate) == (ObjectPhase.PENDING, GateState.OPEN)
    assert seen.cause is not None
    assert seen.cause.kind is CauseKind.NO_CAPACITY
    assert seen.cause.detail == f"PENDING ({_ALL_DOWN})"


@pytest.mark.parametrize("reason", ["JobHeldUser", "Resources", "Priority"])
def test_observe_says_nothing_of_dispatchs_own_gate_or_a_queue(reason: str) -> None:
    # dispatch's own closed gate (sbatch --hold) is never no-capacity, whatever else holds it
    seen = observe(_queued(reason), None, None, cluster="lab", now=NOW, memory=Memory())
    assert seen is not None
    assert seen.phase is ObjectPhase.PENDING
    assert seen.cause is None

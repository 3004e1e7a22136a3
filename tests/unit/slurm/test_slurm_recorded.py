"""The parsers and the cause table on real Slurm 22.05 outputs (``tests/data/slurm/``).

Each scenario's recorded ``squeue --json`` (raw wait statuses), ``squeue -O`` and
``sacct --duplicates`` are parsed, the recorded job is renamed as dispatch names its objects
(``dj-<job>`` with dispatch's comment tag; nothing else is changed) and observed as one poll
would. The expected words are Slurm's, verbatim (deploy/slurm/README.md, "Findings").
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from dispatch_backends.slurm.observe import Memory, observe
from dispatch_backends.slurm.parse import parse_sacct, parse_scontrol
from dispatch_backends.slurm.settings import Accounting
from dispatch_core.state import (
    CauseKind,
    GateState,
    ObjectPhase,
    Provenance,
)
from tests.unit.slurm.recorded import (
    NOW,
    RECORDED,
    RECORDED_ACCT_FIELDS,
    load,
    observe_adopted,
)

# (scenario, phase, job name, kind, provenance, exit_code, detail from json, detail from -O)
ENDINGS = [
    ("exit0", "end", "exit0", CauseKind.NONE, Provenance.APPLICATION, 0, "COMPLETED 0:0", None),
    (
        "exit1",
        "end",
        "exit1",
        CauseKind.NON_ZERO_EXIT,
        Provenance.APPLICATION,
        1,
        "FAILED 1:0 (NonZeroExitCode)",
        None,
    ),
    (
        "exit3",
        "end",
        "exit3",
        CauseKind.NON_ZERO_EXIT,
        Provenance.APPLICATION,
        3,
        "FAILED 3:0 (NonZeroExitCode)",
        None,
    ),
    (
        "scancel-running",
        "end",
        "scancel-running",
        CauseKind.CANCELLED,
        Provenance.ACTOR,
        None,
        "CANCELLED by 0 0:15",
        "CANCELLED by 0 0:0",
    ),
    (
        "timelimit",
        "end",
        "timelimit",
        CauseKind.TIME_LIMIT,
        Provenance.SCHEDULER,
        None,
        "TIMEOUT 143:0 (TimeLimit)",
        "TIMEOUT 0:0 (TimeLimit)",
    ),
    (
        # recorded without MaxRSS/ReqMem (the old sacct fields): a SIGKILL nothing
        # corroborates stays unknown; oom-steps (test_slurm_memory.py) has the figures
        "oom",
        "end",
        "oom",
        CauseKind.UNKNOWN,
        Provenance.SCHEDULER,
        None,
        "FAILED 0:9 (JobLaunchFailure)",
        None,
    ),
    (
        "oom-cgroup",
        "end",
        "oom-cgroup",
        CauseKind.OUT_OF_MEMORY,
        Provenance.SCHEDULER,
        None,
        "OUT_OF_MEMORY 0:125 (OutOfMemory); batch OUT_OF_MEMORY 0:125",
        None,
    ),
    (
        "node-down-norequeue",
        "end",
        "node-down-norequeue",
        CauseKind.NODE_LOST,
        Provenance.SCHEDULER,
        None,
        "NODE_FAIL 0:0 (NodeDown)",
        None,
    ),
    (
        "preempt-cancel",
        "end",
        "victim-lowcancel",
        CauseKind.PREEMPTED,
        Provenance.SCHEDULER,
        None,
        "PREEMPTED 0:15",
        "PREEMPTED 0:0",
    ),
    (
        "admin-hold",
        "cancelled",
        "admin-hold",
        CauseKind.CANCELLED,
        Provenance.ACTOR,
        None,
        "CANCELLED by 0 0:0 (JobHeldAdmin)",
        None,
    ),
]


@pytest.mark.parametrize(
    ("scenario", "phase", "name", "kind", "provenance", "exit_code", "words", "text_words"),
    ENDINGS,
    ids=[f"{e[0]}/{e[1]}" for e in ENDINGS],
)
@pytest.mark.parametrize("source", ["json", "text"])
def test_an_ended_job_is_classified_with_slurms_words(
    scenario: str,
    phase: str,
    name: str,
    kind: CauseKind,
    provenance: Provenance,
    exit_code: int | None,
    words: str,
    text_words: str | None,
    source: str,
) -> None:
    recorded = load(scenario, phase)
    job = recorded.job(name, source=source)
    observed = observe_adopted(job, recorded.rows)
    assert observed.phase is ObjectPhase.ENDED
    cause = observed.cause
    assert cause is not None
    assert (cause.kind, cause.provenance, cause.exit_code) == (kind, provenance, exit_code)
    expected = words if source == "json" else (text_words or words)
    if source == "text" and text_words is None:
        # squeue -O has no exit status in the recording: sacct's job row gives it, and
        # its reason is slurmctld's
        assert cause.detail.split(" (")[0] == words.split(" (")[0]
    else:
        assert cause.detail == expected
    if kind is CauseKind.CANCELLED:
        assert cause.actor is not None
        assert cause.actor.name == "root (uid 0)"
    assert cause.at == job.end


def test_a_native_requeue_by_scontrol_is_a_requeued_execution() -> None:
    recorded = load("requeue", "requeued")
    observed = observe_adopted(recorded.job("requeue"), recorded.rows)
    assert (observed.phase, observed.restarts, observed.gate) == (
        ObjectPhase.PENDING,
        1,
        GateState.OPEN,
    )
    (execution,) = observed.executions
    assert execution.restart == 0
    assert execution.cause.kind is CauseKind.REQUEUED
    assert execution.cause.detail == "REQUEUED 0:0"
    assert execution.nodes == ("node3",)


def test_a_job_requeued_twice_has_each_cause_in_order() -> None:
    recorded = load("requeue-twice", "end")
    observed = observe_adopted(recorded.job("requeue-twice"), recorded.rows)
    assert [e.cause.kind for e in observed.executions] == [
        CauseKind.PREEMPTED,
        CauseKind.NODE_LOST,
    ]
    assert [e.cause.detail for e in observed.executions] == ["PREEMPTED 0:0", "NODE_FAIL 0:0"]
    assert [e.nodes for e in observed.executions] == [("node1",), ("node1",)]
    assert observed.phase is ObjectPhase.ENDED
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.NONE


@pytest.mark.parametrize(
    ("scenario", "phase", "name", "kind", "nodes"),
    [
        ("preempt-requeue", "preempted", "victim-low", CauseKind.PREEMPTED, ("node2", "node3")),
        ("node-down-requeue", "requeued", "node-down-requeue", CauseKind.NODE_LOST, ("node2",)),
    ],
)
def test_the_cause_of_a_native_requeue_comes_from_accounting(
    scenario: str, phase: str, name: str, kind: CauseKind, nodes: tuple[str, ...]
) -> None:
    recorded = load(scenario, phase)
    job = recorded.job(name)
    # squeue, scontrol and squeue --json look the same for every requeue cause ...
    assert (job.state, job.reason, job.restarts) == ("PENDING", "BeginTime", 1)
    observed = observe_adopted(job, recorded.rows)
    # ... sacct --duplicates tells them apart
    (execution,) = observed.executions
    assert execution.cause.kind is kind
    assert execution.cause.provenance is Provenance.SCHEDULER
    assert execution.nodes == nodes
    assert observed.phase is ObjectPhase.PENDING


def test_sacct_lagging_behind_a_requeue_is_not_yet_then_unknown_after_the_grace() -> None:
    recorded = load("requeue-twice", "node-down")
    job = recorded.job("requeue-twice")
    rows = [r for r in recorded.rows if r.state != "NODE_FAIL"]  # sacct not caught up
    memory = Memory()
    first = observe_adopted(job, rows, memory=memory)
    assert [e.cause.kind for e in first.executions] == [CauseKind.PREEMPTED]
    later = observe_adopted(job, rows, memory=memory, now=NOW + timedelta(seconds=31))
    assert [e.cause.kind for e in later.executions] == [CauseKind.PREEMPTED, CauseKind.UNKNOWN]
    assert "accounting did not say why within 30 s" in later.executions[1].cause.detail


def test_without_accounting_a_native_requeue_is_unknown_at_once() -> None:
    recorded = load("preempt-requeue", "preempted")
    observed = observe_adopted(recorded.job("victim-low"), None, accounting=Accounting.NONE)
    (execution,) = observed.executions
    assert execution.cause.kind is CauseKind.UNKNOWN
    assert "without accounting" in execution.cause.detail


def test_a_cancel_sacct_does_not_show_yet_is_stopping_until_it_names_the_actor() -> None:
    recorded = load("scancel-running", "end")
    job = recorded.job("scancel-running")
    memory = Memory()
    waiting = observe_adopted(job, [], memory=memory)
    assert waiting.phase is ObjectPhase.STOPPING
    assert waiting.cause is None
    named = observe_adopted(job, recorded.rows, memory=memory, now=NOW + timedelta(seconds=2))
    assert named.phase is ObjectPhase.ENDED
    assert named.cause is not None
    assert named.cause.provenance is Provenance.ACTOR
    expired = observe_adopted(job, [], memory=Memory(), grace_s=0.001)
    assert expired.phase is ObjectPhase.STOPPING  # first sight starts the grace
    memory = Memory()
    observe_adopted(job, [], memory=memory)
    late = observe_adopted(job, [], memory=memory, now=NOW + timedelta(seconds=31))
    assert late.phase is ObjectPhase.ENDED
    assert late.cause is not None
    assert (late.cause.kind, late.cause.provenance, late.cause.actor) == (
        CauseKind.CANCELLED,
        Provenance.SCHEDULER,
        None,
    )


def test_holds_are_gates() -> None:
    held = load("hold-release", "held")
    observed = observe_adopted(held.job("hold-release"), held.rows)
    assert (observed.phase, observed.gate, observed.cause) == (
        ObjectPhase.PENDING,
        GateState.CLOSED,
        None,
    )
    admin = load("admin-hold", "held")
    observed = observe_adopted(admin.job("admin-hold"), admin.rows)
    assert (observed.phase, observed.gate) == (ObjectPhase.PENDING, GateState.ADMIN_HELD)
    assert observed.cause is not None
    assert (observed.cause.kind, observed.cause.provenance, observed.cause.detail) == (
        CauseKind.HELD,
        Provenance.SCHEDULER,
        "PENDING (JobHeldAdmin)",
    )


def test_dispatchs_own_comment_is_read_and_sacct_without_it_changes_nothing() -> None:
    recorded = load("dj-comment", "running")
    job = recorded.job("dj-abc")
    observed = observe(job, recorded.rows, None, cluster="lab", now=NOW, memory=Memory())
    assert observed is not None
    assert (observed.name, observed.submission, observed.attempt) == ("dj-abc", 1, 1)
    assert observed.phase is ObjectPhase.RUNNING
    assert observed.nodes == ("node2",)
    # sacct doesn't store comments by default: the tag comes from slurmctld
    assert all(r.comment == "" for r in recorded.rows)


def test_array_tasks_are_their_own_jobs() -> None:
    recorded = load("array", "end")
    by_display = {j.display_id: j for j in recorded.json_jobs}
    assert sorted(by_display) == ["9_1", "9_2", "9_3"]
    assert [by_display[t].raw_id for t in ("9_1", "9_2", "9_3")] == ["12", "13", "9"]
    assert {j.array_job_id for j in recorded.json_jobs} == {"9"}
    failed = observe_adopted(by_display["9_2"], recorded.rows)
    assert failed.cause is not None
    assert (failed.cause.kind, failed.cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 1)
    last = observe_adopted(by_display["9_3"], recorded.rows)
    assert last.ref.id == "9"
    assert last.cause is not None
    assert last.cause.kind is CauseKind.NONE
    rows = {r.job_id.job: r for r in recorded.rows if r.step is None}
    assert rows["9_2"].raw_id == "13"
    assert rows["9_2"].job_id.array_task == "2"
    pending = load("array", "submitted").json_jobs[0]
    assert (pending.display_id, pending.array_task) == ("9_[1-3]", "1-3")
    text = load("array", "submitted").text_jobs[0]
    assert (text.display_id, text.array_task) == ("9_[1-3]", "1-3")


def test_text_and_json_squeue_agree() -> None:
    for scenario in sorted(p.name for p in RECORDED.iterdir() if p.is_dir()):
        for phase in sorted(p.name for p in (RECORDED / scenario).iterdir() if p.is_dir()):
            if not (RECORDED / scenario / phase / "squeue.json").exists():
                continue  # recorded by record-steps.sh: the backend's formats, no JSON
            recorded = load(scenario, phase)
            by_id = {j.raw_id: j for j in recorded.json_jobs}
            for text in recorded.text_jobs:
                js = by_id[text.raw_id]
                where = f"{scenario}/{phase} job {text.raw_id}"
                assert (text.name, text.state, text.reason, text.restarts) == (
                    js.name,
                    js.state,
                    js.reason,
                    js.restarts,
                ), where
                assert text.nodes == js.nodes, where
                assert text.display_id == js.display_id, where
                assert text.comment == js.comment, where


def test_the_jobcomp_file_without_accounting_parses_like_sacct() -> None:
    folder = RECORDED / "no-accounting" / "end"
    (row,) = parse_sacct((folder / "sacct-c.txt").read_text(), RECORDED_ACCT_FIELDS)
    assert (row.raw_id, row.state, row.exit) == ("24", "FAILED", row.exit)
    assert row.exit is not None
    assert row.exit.words == "1:0"
    assert row.db_index is None


def test_scontrol_values_with_spaces_are_kept_whole() -> None:
    line = (RECORDED / "dj-comment" / "running" / "scontrol.txt").read_text().splitlines()[0]
    fields = parse_scontrol(line)
    assert fields["Comment"] == "dj:job=abc sub=1 att=1"
    assert fields["JobName"] == "dj-abc"
    assert fields["JobState"] == "RUNNING"
    assert fields["Restarts"] == "0"
    held = parse_scontrol((RECORDED / "admin-hold" / "held" / "scontrol.txt").read_text())
    assert (held["JobState"], held["Reason"]) == ("PENDING", "JobHeldAdmin")


def test_an_end_waits_for_the_earlier_runs_sacct_has_not_named() -> None:
    recorded = load("requeue-twice", "end")
    job = recorded.job("requeue-twice")
    # sacct not caught up: the second run's row still RUNNING, the third's not there yet
    rows = [
        msgspec.structs.replace(r, state="RUNNING") if r.state == "NODE_FAIL" else r
        for r in recorded.rows
        if not (r.raw_id == "20" and r.state == "COMPLETED")
    ]
    observed = observe_adopted(job, rows)
    assert [e.cause.kind for e in observed.executions] == [CauseKind.PREEMPTED]
    assert (observed.phase, observed.cause) == (ObjectPhase.STOPPING, None)


def test_an_executions_nodes_are_those_slurmctld_showed_it_running_on() -> None:
    """sacct's NodeList of a run may hold only the batch host (measured on a 3-node job)."""
    before = load("preempt-requeue", "end")
    job = before.job("victim-low")
    memory = Memory()
    running = msgspec.structs.replace(job, state="RUNNING", restarts=0)
    observe_adopted(running, before.rows, memory=memory)
    short = [
        msgspec.structs.replace(r, nodes=("node2",)) if r.state == "PREEMPTED" else r
        for r in before.rows
    ]
    observed = observe_adopted(job, short, memory=memory)
    assert observed.executions[0].nodes == ("node2", "node3")
    assert observe_adopted(job, short).executions[0].nodes == ("node2",)

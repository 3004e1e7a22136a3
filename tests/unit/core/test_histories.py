"""Golden records (Temporal's replay idea): records written by earlier builds, replayed through
the decoder and ``fold`` on every run, with the Status each must still project to. A change
that breaks old events (a renamed tag, a changed field type, a rule that folds differently)
fails here.

The files in ``tests/data/histories`` are frozen: one JSON line per event,
``{"seq": n, "event": {...}}``, with the stream's gaps. Never regenerate them to make a test
pass; add a new file for new events instead.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from dispatch_core import (
    Cause,
    CauseKind,
    Discovery,
    ExecutionEnded,
    GateState,
    Job,
    JobEvent,
    NoCapacityObserved,
    NodeLossObserved,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    State,
    cluster_of,
    decode_event,
    epoch,
    fold,
    project,
)
from tests.util import written

HISTORIES = Path(__file__).parents[2] / "data" / "histories"
NOW = datetime(2026, 3, 3, tzinfo=UTC)


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    seq: int
    event: msgspec.Raw


def _read(name: str) -> list[tuple[int, JobEvent]]:
    """Decode a golden record with the production decoder, naming the line that fails."""
    record: list[tuple[int, JobEvent]] = []
    path = HISTORIES / name
    for number, text in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = msgspec.json.decode(text, type=_Line)
        except msgspec.DecodeError as err:
            raise AssertionError(f"{path}:{number}: {err}") from err
        record.append((line.seq, decode_event(line.event)))
    return record


def _obj(
    cluster: str,
    id_: str,
    n: int,
    phase: ObjectPhase,
    *,
    kind: CauseKind | None = None,
    gate: GateState = GateState.OPEN,
    attempt: int = 1,
) -> ObservedObject:
    cause = None if kind is None else Cause(kind=kind, provenance=Provenance.SCHEDULER)
    return ObservedObject(
        ref=ObjectRef(cluster=cluster, id=id_),
        name="dj",
        submission=n,
        attempt=attempt,
        phase=phase,
        cause=cause,
        gate=gate,
    )


@dataclass(frozen=True)
class Expected:
    """What a golden record must still project to."""

    state: State
    cause: CauseKind
    submission: int | None
    history: tuple[tuple[State, CauseKind], ...]
    objects: tuple[ObservedObject, ...] = ()
    epoch: int | None = None
    settled: bool = False
    escalations: tuple[str, ...] = ()
    supersedes: str | None = None
    superseded_by: str | None = None


GOLDEN: dict[str, Expected] = {
    "preempted-twice-then-succeeded.jsonl": Expected(
        state=State.SUCCEEDED,
        cause=CauseKind.NONE,
        submission=3,
        history=(
            (State.RECOVERING, CauseKind.PREEMPTED),
            (State.RECOVERING, CauseKind.PREEMPTED),
            (State.SUCCEEDED, CauseKind.NONE),
        ),
        objects=tuple(
            _obj("slurm-a", str(5000 + n), n, ObjectPhase.ENDED, kind=CauseKind.PREEMPTED)
            for n in (1, 2, 3)
        ),
        settled=True,
    ),
    "recovery-hold-resubmitted.jsonl": Expected(
        state=State.RUNNING,
        cause=CauseKind.NONE,
        submission=2,
        history=((State.HELD, CauseKind.HELD), (State.RECOVERING, CauseKind.RELEASED)),
        objects=(
            _obj("kubeflow-east", "ml/dj-llama-oom-1-1", 1, ObjectPhase.ENDED),
            _obj("kubeflow-east", "ml/dj-llama-oom-2-1", 2, ObjectPhase.RUNNING),
        ),
        epoch=epoch(0, 2, 0),
        escalations=("overdue:1",),
    ),
    "node-loss-fence.jsonl": Expected(
        state=State.RECOVERING,
        cause=CauseKind.NODE_LOST,
        submission=2,
        history=((State.RECOVERING, CauseKind.NODE_LOST),),
        objects=(
            _obj(
                "kubeflow-west",
                "ml/dj-gpt-fence-1-1",
                1,
                ObjectPhase.RUNNING,
                kind=CauseKind.NODE_LOST,
            ),
            _obj(
                "kubeflow-west",
                "ml/dj-gpt-fence-2-1",
                2,
                ObjectPhase.PENDING,
                gate=GateState.CLOSED,
            ),
        ),
        epoch=epoch(0, 2, 0),
    ),
    "superseded-failed.jsonl": Expected(
        state=State.FAILED,
        cause=CauseKind.NON_ZERO_EXIT,
        submission=1,
        history=((State.FAILED, CauseKind.NON_ZERO_EXIT),),
        objects=(_obj("slurm-a", "7001", 1, ObjectPhase.ENDED),),
        settled=True,
        escalations=("failed:non-zero-exit",),
        superseded_by="bert-exit1-b",
    ),
    "superseding-job.jsonl": Expected(
        state=State.PENDING,
        cause=CauseKind.NONE,
        submission=None,
        history=(),
        supersedes="bert-exit1",
    ),
    "shared-checkpoint-ceased.jsonl": Expected(
        state=State.RECOVERING,
        cause=CauseKind.PREEMPTED,
        submission=2,
        history=(
            (State.HELD, CauseKind.HELD),
            (State.RECOVERING, CauseKind.RELEASED),
            (State.RECOVERING, CauseKind.PREEMPTED),
        ),
        objects=(_obj("slurm-b", "881", 2, ObjectPhase.PENDING, gate=GateState.CLOSED, attempt=2),),
        epoch=epoch(0, 2, 0),
    ),
    "cancelled-foreign-abandoned.jsonl": Expected(
        state=State.CANCELLED,
        cause=CauseKind.CANCELLED,
        submission=1,
        history=(
            (State.HELD, CauseKind.HELD),
            (State.PENDING, CauseKind.RELEASED),
            (State.CANCELLED, CauseKind.CANCELLED),
        ),
        objects=(
            _obj("slurm-a", "9100", 1, ObjectPhase.ENDED),
            ObservedObject(
                ref=ObjectRef(cluster="slurm-a", id="9155"),
                name="dj-t5-cancel",
                submission=None,
                attempt=None,
                phase=ObjectPhase.RUNNING,
            ),
        ),
        settled=True,
        escalations=("foreign:slurm-a/9155",),
    ),
    "all-unknown-abandoned-then-given-up.jsonl": Expected(
        state=State.FAILED,
        cause=CauseKind.TIME_LIMIT,
        submission=2,
        history=(
            (State.HELD, CauseKind.HELD),
            (State.RECOVERING, CauseKind.RELEASED),
            (State.FAILED, CauseKind.TIME_LIMIT),
        ),
        objects=(_obj("slurm-a", "9300", 2, ObjectPhase.ENDED),),
        settled=True,
        escalations=("all-unknown:1", "give-up"),
    ),
    "progress-free-then-no-progress-hold.jsonl": Expected(
        state=State.HELD,
        cause=CauseKind.HELD,
        submission=3,
        history=(
            (State.RECOVERING, CauseKind.PREEMPTED),
            (State.RECOVERING, CauseKind.PREEMPTED),
            (State.HELD, CauseKind.HELD),
        ),
        objects=tuple(
            _obj("c1", str(99 + n), n, ObjectPhase.ENDED, kind=CauseKind.PREEMPTED)
            for n in (1, 2, 3)
        ),
        escalations=("no-progress:2",),
    ),
    "failover-node-lost-then-succeeded.jsonl": Expected(
        state=State.SUCCEEDED,
        cause=CauseKind.NONE,
        submission=2,
        history=((State.RECOVERING, CauseKind.NODE_LOST), (State.SUCCEEDED, CauseKind.NONE)),
        objects=(
            _obj("slurm-a", "100", 1, ObjectPhase.ENDED, kind=CauseKind.NODE_LOST),
            _obj("local", "101", 2, ObjectPhase.ENDED, kind=CauseKind.NONE),
        ),
        settled=True,
    ),
    "no-capacity-flicker-then-failover.jsonl": Expected(
        state=State.SUCCEEDED,
        cause=CauseKind.NONE,
        submission=2,
        history=((State.RECOVERING, CauseKind.NO_CAPACITY), (State.SUCCEEDED, CauseKind.NONE)),
        objects=(
            _obj("c1", "100", 1, ObjectPhase.ENDED, kind=CauseKind.CANCELLED),
            _obj("c2", "101", 2, ObjectPhase.ENDED, kind=CauseKind.NONE),
        ),
        settled=True,
    ),
    "node-lost-flap-then-fence.jsonl": Expected(
        state=State.SUCCEEDED,
        cause=CauseKind.NONE,
        submission=2,
        history=((State.RECOVERING, CauseKind.NODE_LOST), (State.SUCCEEDED, CauseKind.NONE)),
        objects=(
            _obj("c1", "100", 1, ObjectPhase.ENDED, kind=CauseKind.NODE_LOST),
            _obj("c1", "101", 2, ObjectPhase.ENDED, kind=CauseKind.NONE),
        ),
        settled=True,
    ),
}


def test_node_flap_golden_record_keeps_each_window() -> None:
    """Seed 000, "The node-loss fence": a node lost, back 10 s later (the window ended: a
    ``node-loss.observed`` fact with ``since`` null), lost again; the fence came the window
    (300 s) after the second loss, not after the first."""
    record = _read("node-lost-flap-then-fence.jsonl")
    windows = [ev.since for _, ev in record if isinstance(ev, NodeLossObserved)]
    assert windows == [
        datetime(2026, 1, 1, 0, 1, 2, tzinfo=UTC),
        None,
        datetime(2026, 1, 1, 0, 9, 22, tzinfo=UTC),
    ]
    (fenced,) = [ev for _, ev in record if isinstance(ev, ExecutionEnded) and ev.fenced]
    assert fenced.at == datetime(2026, 1, 1, 0, 14, 22, tzinfo=UTC)
    job = fold(written(record), NOW)
    first = job.object(ObjectRef(cluster="c1", id="100"))
    assert first is not None
    assert (first.node_loss_since, first.fenced) == (windows[-1], True)
    assert [r.cause.kind for r in job.recoveries] == [CauseKind.NODE_LOST]


def test_failover_golden_record_keeps_each_submissions_cluster() -> None:
    """Issue 14, part 2: submission 1 ran on spec.cluster (``cluster`` null), the node-lost
    rule moved submission 2 to the next listed cluster; the record names both."""
    job = fold(written(_read("failover-node-lost-then-succeeded.jsonl")), NOW)
    assert [s.cluster for s in job.submissions] == [None, "local"]
    assert [cluster_of(job, s) for s in job.submissions] == ["slurm-a", "local"]
    assert [o.ref.cluster for o in job.objects] == ["slurm-a", "local"]
    assert job.plan.rules[0].clusters == ("slurm-a", "local")


def test_progress_golden_record_keeps_its_budget_arithmetic() -> None:
    """Issue 14: the first recovery followed progress and spent nothing; the next two
    executions published nothing, the second of them held the job (max_without_progress 2)."""
    job = fold(written(_read("progress-free-then-no-progress-hold.jsonl")), NOW)
    assert [r.free for r in job.recoveries] == [True, False]
    assert job.spent(0) == 1
    assert [(f.step, f.advanced, f.without_progress) for f in job.progress] == [
        (100, True, 0),
        (100, False, 1),
        (100, False, 2),
    ]
    assert (job.plan.rules[0].free_if_progress, job.plan.rules[0].max_without_progress) == (
        True,
        2,
    )


def test_no_capacity_golden_record_keeps_each_wait() -> None:
    """Issue 14, part 2: a no-capacity wait that a Resources sighting broke (two
    ``no-capacity.observed`` facts: begun, ended), then one that lasted ``wait_s``: its
    object was stopped and its end recorded ``no-capacity``; submission 2 ran on ``c2``."""
    record = _read("no-capacity-flicker-then-failover.jsonl")
    waits = [ev.since for _, ev in record if isinstance(ev, NoCapacityObserved)]
    assert waits == [
        datetime(2026, 1, 1, 0, 4, 32, tzinfo=UTC),
        None,
        datetime(2026, 1, 1, 0, 5, 32, tzinfo=UTC),
    ]
    job = fold(written(record), NOW)
    first = job.object(ObjectRef(cluster="c1", id="100"))
    assert first is not None
    assert first.no_capacity_since == waits[-1]
    assert first.stop_why == "no-capacity"
    assert [s.cluster for s in job.submissions] == [None, "c2"]
    assert [r.cause.kind for r in job.recoveries] == [CauseKind.NO_CAPACITY]


def test_every_golden_file_has_an_expected_status() -> None:
    assert sorted(p.name for p in HISTORIES.glob("*.jsonl")) == sorted(GOLDEN)


def test_the_golden_records_hold_every_event_type() -> None:
    """A new event type gets a golden record, so old builds' events stay replayed."""
    seen = {type(ev) for name in GOLDEN for _, ev in _read(name)}
    assert seen == set(typing.get_args(JobEvent))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_golden_record_replays_to_its_status(name: str) -> None:
    expected = GOLDEN[name]
    record = _read(name)
    job: Job = fold(written(record), NOW)
    assert job.seq == record[-1][0]
    discovery = Discovery(cluster="c", job_id=job.job_id, seen_at=NOW, objects=expected.objects)
    status = project(job, discovery, NOW)
    assert (status.state, status.cause.kind) == (expected.state, expected.cause)
    assert status.submission == expected.submission
    assert tuple((t.state, t.cause.kind) for t in status.history) == expected.history
    assert status.epoch == expected.epoch
    assert status.settled == expected.settled
    assert tuple(e.id for e in job.escalations) == expected.escalations
    assert (status.supersedes, status.superseded_by) == (
        expected.supersedes,
        expected.superseded_by,
    )
    # Folding in two halves gives the same job (what a watcher resuming from a snapshot does).
    half = max(1, len(record) // 2)
    assert fold(written(record[half:]), NOW, prior=fold(written(record[:half]), NOW)) == job

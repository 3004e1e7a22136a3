"""A training job's life decided by dispatch's pure core, against a toy scheduler.

    python examples/core_demo.py

The job's policy resubmits on preemption (budget 2) and holds on a non-zero exit. The toy
scheduler preempts the first execution, then lets the second finish. Every pass is
``fold`` -> ``project`` -> ``next_steps``, exactly what the supervisor service runs; here the
"scheduler" is a dict and the clock is a variable, so the whole life prints in a blink.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from msgspec.structs import replace

from dispatch_core import (
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Commit,
    Declarations,
    Discovery,
    GateOpened,
    GateState,
    JobEvent,
    JobSpec,
    Launch,
    LaunchRecorded,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    OpenGate,
    Provenance,
    RecordItem,
    RecoveryPolicy,
    RecoveryRule,
    Stop,
    Submit,
    WriterKind,
    decide,
    epoch,
    fold,
    next_steps,
    project,
)

JOB = "demo-1"
DECLARATIONS = Declarations(node_loss_window_s=60.0)


def main() -> None:
    """Run the job to its outcome, printing each status change and the record at the end."""
    now = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    alice = Actor(name="alice", kind=ActorKind.HUMAN)
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),
            RecoveryRule(on=(CauseKind.NON_ZERO_EXIT,), action=Action.HOLD),
        )
    )
    spec = JobSpec(cluster="toy", command=("python", "train.py"))
    record: list[RecordItem] = []

    def append(*events: JobEvent, writer: WriterKind = WriterKind.SUPERVISOR) -> None:
        # The record says which kind of writer appended each event: the API for what a
        # person decided, the supervisor for the rest (fold refuses any other).
        for event in events:
            record.append((len(record) + 1, event, writer))

    created = decide(
        None, Submit(by=alice, job_id=JOB, spec=spec, policy=policy, declarations=DECLARATIONS), now
    )
    append(*created, writer=WriterKind.API)
    plan = fold(record, now).plan
    print(f"submitted {JOB}: uncovered causes {[str(c) for c in plan.uncovered]}")

    scheduler: dict[str, ObservedObject] = {}  # the toy scheduler's objects, by id
    started: dict[str, datetime] = {}  # when each one started running
    shown = ""
    for _tick in range(40):
        now += timedelta(seconds=5)
        job = fold(record, now)
        discovery = Discovery(
            cluster="toy", job_id=JOB, seen_at=now, objects=tuple(scheduler.values())
        )
        status = project(job, discovery, now)
        why = f" ({status.cause.kind})" if status.cause.kind != CauseKind.NONE else ""
        line = f"{status.state}{why}"
        if line != shown:
            print(f"{now:%H:%M:%S}  {line:<28} submission {status.submission} epoch {status.epoch}")
            shown = line
        if status.settled:
            break
        for step in next_steps(job, discovery, DECLARATIONS, now).steps:
            match step:
                case Commit(event=event):
                    append(event)
                case Launch(intent=intent, submission=n, attempt=a, generation=g):
                    append(intent)
                    ref = ObjectRef(cluster="toy", id=str(len(scheduler) + 100))
                    scheduler[ref.id] = ObservedObject(
                        ref=ref,
                        name=f"dj-{JOB}",
                        submission=n,
                        attempt=a,
                        phase=ObjectPhase.PENDING,
                        gate=GateState.CLOSED,
                    )
                    append(LaunchRecorded(job_id=JOB, at=now, submission=n, attempt=a, ref=ref))
                    print(f"          launch N={n} a={a} DISPATCH_EPOCH={epoch(g, n, 0)}")
                case OpenGate(ref=ref):
                    obj = scheduler[ref.id]
                    scheduler[ref.id] = replace(obj, phase=ObjectPhase.RUNNING, gate=GateState.OPEN)
                    started[ref.id] = now
                    append(GateOpened(job_id=JOB, at=now, ref=ref))
                case Stop(intent=intent):
                    append(intent)
                case _:
                    pass
        _toy_scheduler_moves(scheduler, started, now)

    print("record:")
    for seq, event, writer in record:
        print(f"  {seq:>3} {type(event).__name__:<20} by {writer}")


def _toy_scheduler_moves(
    scheduler: dict[str, ObservedObject], started: dict[str, datetime], now: datetime
) -> None:
    """After 20 s of running, the first submission is preempted and the second completes."""
    for key, obj in scheduler.items():
        if obj.phase is not ObjectPhase.RUNNING or now - started[key] < timedelta(seconds=20):
            continue
        if obj.submission == 1:
            cause = Cause(
                kind=CauseKind.PREEMPTED,
                provenance=Provenance.SCHEDULER,
                detail="PREEMPTED",
                at=now,
            )
        else:
            cause = Cause(
                kind=CauseKind.NONE,
                provenance=Provenance.APPLICATION,
                exit_code=0,
                detail="COMPLETED",
                at=now,
            )
        scheduler[key] = replace(obj, phase=ObjectPhase.ENDED, cause=cause)


if __name__ == "__main__":
    main()

"""Benchmark of the pure core on a 1,000-event record (issue 2, "Performance").

    python bench/core.py [--events 1000] [--runs 300]

The record is written by the planner itself, as the supervisor would: a job whose policy
resubmits on preemption with a large budget, preempted over and over by a toy scheduler,
until the record holds the wanted number of events. Then, in one run and interleaved so
that the machine's drift hits every figure alike, it times:

* ``decode``: a bare msgspec decode of the record's bytes (one ``Decoder(JobEvent)`` call
  per event, as the record store hands them over);
* ``fold``: ``fold`` of the decoded events;
* ``project``: ``project`` of the folded job with a discovery showing its object running;
* ``plan``: one ``next_steps`` pass on the same inputs.

It prints each median and the ratio fold/decode, against the targets (each <= 2 ms,
fold <= 3x decode), and ends with one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec
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
    JobCreated,
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
    Submit,
    WriterKind,
    decide,
    encode,
    fold,
    next_steps,
    project,
)

JOB = "bench-job"
DECLARATIONS = Declarations(node_loss_window_s=60.0)


def _writer(event: JobEvent) -> WriterKind:
    """The writer kind of a bench event: the API made the job, the supervisor the rest."""
    return WriterKind.API if isinstance(event, JobCreated) else WriterKind.SUPERVISOR


def _written(events: list[JobEvent]) -> list[RecordItem]:
    return [(i, e, _writer(e)) for i, e in enumerate(events, 1)]


def build_record(n_events: int) -> tuple[list[tuple[int, bytes]], dict[str, ObservedObject]]:
    """Write a record of at least ``n_events`` events with the planner; return it encoded
    (seq, bytes) with sequence gaps as in a shared stream, and the toy scheduler's objects."""
    now = datetime(2026, 11, 30, tzinfo=UTC)
    policy = RecoveryPolicy(
        rules=(RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=999_000),)
    )
    submit = Submit(
        by=Actor(name="bench", kind=ActorKind.HUMAN),
        job_id=JOB,
        spec=JobSpec(cluster="toy", command=("python", "train.py")),
        policy=policy,
        declarations=DECLARATIONS,
    )
    events: list[JobEvent] = list(decide(None, submit, now))
    scheduler: dict[str, ObservedObject] = {}
    made = 0  # object ids are never reused, as on a real scheduler
    while len(events) < n_events:
        now += timedelta(seconds=30)
        job = fold(_written(events), now)
        discovery = Discovery(
            cluster="toy", job_id=JOB, seen_at=now, objects=tuple(scheduler.values())
        )
        for step in next_steps(job, discovery, DECLARATIONS, now).steps:
            match step:
                case Commit(event=event):
                    events.append(event)
                case Launch(intent=intent, submission=n, attempt=a):
                    events.append(intent)
                    made += 1
                    ref = ObjectRef(cluster="toy", id=str(made))
                    scheduler[ref.id] = ObservedObject(
                        ref=ref,
                        name=f"dj-{JOB}",
                        submission=n,
                        attempt=a,
                        phase=ObjectPhase.PENDING,
                        gate=GateState.CLOSED,
                    )
                    events.append(
                        LaunchRecorded(job_id=JOB, at=now, submission=n, attempt=a, ref=ref)
                    )
                case OpenGate(ref=ref):
                    scheduler[ref.id] = replace(
                        scheduler[ref.id], phase=ObjectPhase.RUNNING, gate=GateState.OPEN
                    )
                    events.append(GateOpened(job_id=JOB, at=now, ref=ref))
                case _:
                    pass
        # the toy scheduler preempts whatever runs; ended objects vanish from its view
        for key, obj in list(scheduler.items()):
            if obj.phase is ObjectPhase.ENDED:
                del scheduler[key]
            elif obj.phase is ObjectPhase.RUNNING:
                preempted = Cause(
                    kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED"
                )
                scheduler[key] = replace(obj, phase=ObjectPhase.ENDED, cause=preempted)
    # a stream shared by many jobs: this job's sequence numbers have gaps
    return [(7 * i + 3, encode(e)) for i, e in enumerate(events)], scheduler


def median_ms(fn: Callable[[], object], runs: int) -> list[float]:
    """Time ``fn`` ``runs`` times; return each run in milliseconds."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    """Build the record, time the four operations interleaved, print figures and JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="events in the record")
    parser.add_argument("--runs", type=int, default=300, help="timed runs of each operation")
    args = parser.parse_args()

    encoded, scheduler = build_record(args.events)
    decoder = msgspec.json.Decoder(JobEvent)
    decoded = [
        (seq, event, _writer(event)) for seq, event in ((s, decoder.decode(d)) for s, d in encoded)
    ]
    now = datetime(2027, 1, 1, tzinfo=UTC)
    job = fold(decoded, now)
    running = next(iter(scheduler.values()))
    discovery = Discovery(cluster="toy", job_id=JOB, seen_at=now, objects=(running,))

    ops: dict[str, Callable[[], object]] = {
        "decode": lambda: [decoder.decode(data) for _, data in encoded],
        "fold": lambda: fold(decoded, now),
        "project": lambda: project(job, discovery, now),
        "plan": lambda: next_steps(job, discovery, DECLARATIONS, now),
    }
    samples: dict[str, list[float]] = {name: [] for name in ops}
    gc.collect()
    # interleave in rounds of 10 so drift in the machine's speed hits every figure alike
    for _ in range(max(1, args.runs // 10)):
        for name, fn in ops.items():
            samples[name].extend(median_ms(fn, 10))
    med = {name: statistics.median(values) for name, values in samples.items()}
    ratio = med["fold"] / med["decode"]

    print(f"record: {len(encoded)} events, {sum(len(d) for _, d in encoded)} bytes")
    for name in ops:
        target = "<= 2 ms" if name != "decode" else "(reference)"
        print(f"{name:>8}: median {med[name]:.3f} ms  {target}")
    print(f"fold/decode ratio: {ratio:.2f}  (target <= 3)")
    print(
        json.dumps(
            {
                "events": len(encoded),
                "decode_ms": round(med["decode"], 4),
                "fold_ms": round(med["fold"], 4),
                "project_ms": round(med["project"], 4),
                "plan_ms": round(med["plan"], 4),
                "fold_over_decode": round(ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()

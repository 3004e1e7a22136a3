"""A recovery pass against the length of the job's record (issue 11, "Performance").

    python bench/pass_length.py [--short 100] [--long 10000] [--runs 200]

Two records are written by the planner itself, as ``bench/core.py`` writes its one: a job
that resubmits on preemption, preempted over and over by a toy scheduler, until the record
holds ``--short`` and ``--long`` events. Each ends where the current object has just been
shown ended (preempted), so the next pass is a recovery: it records the end, commits the
recovery, opens submission N+1 and launches it.

That pass is timed as the supervisor runs it (services/supervisor/passes.py, "One pass"),
without its I/O: ``settled`` and ``next_steps`` on the cached job and the Discovery; the
decisions folded in over the job the pass planned from (``fold(..., prior=job)``, what
``_commit`` checks before appending); each launch's fact folded in one at a time (what
``_fact`` does once the backend answered); the follow-up ``next_steps`` and ``settled`` on
the job after the pass; and the Status projected and encoded twice (the payload and the
comparison ``_comparable`` makes). Both lengths are timed interleaved in one run, so the
machine's drift hits both alike.

It prints each median and the ratio long/short against the target (<= 2x), and ends with one
JSON object on the last line.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
from msgspec.structs import replace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*

from bench.core import DECLARATIONS, JOB, build_record, median_ms
from dispatch_core import (
    Commit,
    Discovery,
    GateOpened,
    GateState,
    Job,
    JobCreated,
    JobEvent,
    Launch,
    LaunchRecorded,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Status,
    Stop,
    WriterKind,
    encode,
    fold,
    next_steps,
    project,
    settled,
)
from dispatch_core.state import Cause, CauseKind, Provenance

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PREEMPTED = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED")


def _writer(event: JobEvent) -> WriterKind:
    return WriterKind.API if isinstance(event, JobCreated) else WriterKind.SUPERVISOR


def recovery_case(n_events: int) -> tuple[Job, Discovery, datetime, int]:
    """A job of at least ``n_events`` events whose current object the scheduler has just
    shown ended (preempted), the Discovery showing it, the time of the next pass, and the
    number of events in its record."""
    encoded, scheduler = build_record(n_events)
    decoder = msgspec.json.Decoder(JobEvent)
    items = [(seq, decoder.decode(data)) for seq, data in encoded]
    job = fold(((seq, ev, _writer(ev)) for seq, ev in items), items[-1][1].at)
    now = items[-1][1].at + timedelta(seconds=30)
    objects = {o.ref: o for o in scheduler.values() if o.phase is not ObjectPhase.ENDED}
    sub = job.submission
    assert sub is not None
    assert sub.attempts
    assert sub.attempts[-1].ref is not None
    ref = sub.attempts[-1].ref
    record = job.object(ref)
    assert record is not None
    length = len(items)
    if record.gate_opened_at is None:
        # The record ends with a launch: open its gate as the pass after would.
        seq = job.seq + 7
        opened = GateOpened(job_id=JOB, at=now, ref=ref)
        job = fold(((seq, opened, WriterKind.SUPERVISOR),), now, prior=job)
        length += 1
        now += timedelta(seconds=30)
    objects[ref] = ObservedObject(
        ref=ref,
        name=f"dj-{JOB}",
        submission=sub.number,
        attempt=sub.attempts[-1].attempt,
        phase=ObjectPhase.ENDED,
        cause=_PREEMPTED,
    )
    discovery = Discovery(cluster="toy", job_id=JOB, seen_at=now, objects=tuple(objects.values()))
    return job, discovery, now, length


def recovery_pass(job: Job, discovery: Discovery, now: datetime) -> tuple[Job, Status, int]:
    """One supervisor pass of ``job`` without I/O; return the job after it, its Status and
    the number of decisions it committed."""
    already = settled(job, discovery)
    plan = next_steps(job, discovery, DECLARATIONS, now)
    decisions: list[JobEvent] = []
    for step in plan.steps:
        match step:
            case Commit(event=event):
                decisions.append(event)
            case Stop(intent=intent):
                decisions.append(intent)
            case Launch(intent=intent, resume=False):
                decisions.append(intent)
            case _:
                pass
    seq = job.seq
    after = fold(
        ((seq + i + 1, e, WriterKind.SUPERVISOR) for i, e in enumerate(decisions)), now, prior=job
    )
    seq += len(decisions)
    made = 0
    for step in plan.steps:
        if isinstance(step, Launch):
            made += 1
            ref = ObjectRef(cluster="toy", id=f"new-{made}")
            fact = LaunchRecorded(
                job_id=JOB, at=now, submission=step.submission, attempt=step.attempt, ref=ref
            )
            seq += 1
            after = fold(((seq, fact, WriterKind.SUPERVISOR),), now, prior=after)
    launched = tuple(
        ObservedObject(
            ref=ObjectRef(cluster="toy", id=f"new-{i}"),
            name=f"dj-{JOB}",
            submission=after.submission.number if after.submission else None,
            attempt=1,
            phase=ObjectPhase.PENDING,
            gate=GateState.CLOSED,
        )
        for i in range(1, made + 1)
    )
    seen = replace(discovery, objects=discovery.objects + launched)
    again = next_steps(after, seen, DECLARATIONS, now)
    settled(after, seen)
    status = project(after, seen, now)
    encode(status)
    encode(replace(status, at=_EPOCH))
    assert not already
    assert not again.settled
    return after, status, len(decisions)


def main() -> None:
    """Build both records, time the recovery pass on each interleaved, print figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=100, help="events in the short record")
    parser.add_argument("--long", type=int, default=10_000, help="events in the long record")
    parser.add_argument("--runs", type=int, default=200, help="timed passes of each length")
    args = parser.parse_args()

    cases = {"short": recovery_case(args.short), "long": recovery_case(args.long)}
    info: dict[str, tuple[int, int, int]] = {}
    for name, (job, discovery, now, _) in cases.items():
        after, status, decided = recovery_pass(job, discovery, now)
        assert after.submission is not None
        assert job.submission is not None
        assert after.submission.number == job.submission.number + 1, "not a recovery pass"
        info[name] = (job.seq, decided, len(encode(status)))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc.collect()
    for _ in range(max(1, args.runs // 10)):
        for name, case in cases.items():
            samples[name].extend(median_ms(functools.partial(recovery_pass, *case[:3]), 10))
    med = {name: statistics.median(values) for name, values in samples.items()}
    ratio = med["long"] / med["short"]
    for name, case in cases.items():
        print(
            f"{name:>5}: record of {case[3]} events, {info[name][1]} decisions, "
            f"Status {info[name][2]} bytes: median {med[name]:.3f} ms"
        )
    print(f"long/short ratio: {ratio:.2f}  (target <= 2)")
    print(
        json.dumps(
            {
                "short_events": cases["short"][3],
                "long_events": cases["long"][3],
                "short_ms": round(med["short"], 4),
                "long_ms": round(med["long"], 4),
                "long_over_short": round(ratio, 3),
                "short_status_bytes": info["short"][2],
                "long_status_bytes": info["long"][2],
            }
        )
    )


if __name__ == "__main__":
    main()

"""Contract v2 against a real nats-server: record subjects carry the writer kind, and the
optimistic concurrency is checked against the job's whole record, whoever wrote its last
event (issue 10, "Writer kinds"; ROUND.md "Contract v2")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from dispatch_core import (
    Actor,
    ActorKind,
    CancelRequested,
    Declarations,
    JobCreated,
    JobSpec,
    MalformedRecord,
    Plan,
    RecoveryPolicy,
    WriterKind,
    WriterRefused,
    decode_record_event,
    encode,
    fold,
)
from dispatch_nats import ConcurrencyConflict, Layout, RecordStore

pytestmark = pytest.mark.integration

API, SUP, NOTIFIER = WriterKind.API, WriterKind.SUPERVISOR, WriterKind.NOTIFIER
T0 = datetime(2026, 3, 1, tzinfo=UTC)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)


def _created(job_id: str) -> JobCreated:
    return JobCreated(
        job_id=job_id,
        at=T0,
        spec=JobSpec(cluster="c"),
        policy=RecoveryPolicy(),
        plan=Plan(rules=(), uncovered=()),
        declarations=Declarations(node_loss_window_s=60.0),
        by=ALICE,
    )


@pytest.fixture
async def stores(nc: NATS, streams: Layout) -> AsyncIterator[dict[WriterKind, RecordStore]]:
    """One record store per writer kind, on this test's streams."""
    made = {kind: RecordStore(nc, writer=kind, layout=streams) for kind in WriterKind}
    yield made
    for store in made.values():
        await store.aclose()


async def test_each_store_appends_on_its_own_writer_subject(
    stores: dict[WriterKind, RecordStore], js: JetStreamContext, streams: Layout
) -> None:
    s1 = await stores[API].append("job-1", b"a", expected_last_seq=0, msg_id="m1")
    s2 = await stores[SUP].append("job-1", b"s", expected_last_seq=s1, msg_id="m2")
    s3 = await stores[NOTIFIER].append("job-1", b"n", expected_last_seq=s2, msg_id="m3")
    for seq, kind in ((s1, API), (s2, SUP), (s3, NOTIFIER)):
        msg = await js.get_msg(streams.record_stream, seq)
        assert msg.subject == f"{streams.root}.record.job-1.{kind}"
    # Every store reads the whole record, each entry with its writer.
    for store in stores.values():
        entries = await store.read("job-1")
        assert [(e.seq, e.payload, e.writer) for e in entries] == [
            (s1, b"a", API),
            (s2, b"s", SUP),
            (s3, b"n", NOTIFIER),
        ]
        assert await store.last_seq("job-1") == s3
        assert [e.seq for e in await store.read("job-1", after_seq=s1)] == [s2, s3]


async def test_counts_and_listing_sum_a_jobs_writer_subjects(
    stores: dict[WriterKind, RecordStore],
) -> None:
    last = 0
    for i, kind in enumerate([API, SUP, SUP, NOTIFIER, API]):
        last = await stores[kind].append("job-a", b"e", expected_last_seq=last, msg_id=f"a{i}")
    await stores[API].append("job-b", b"e", expected_last_seq=0, msg_id="b0")
    assert await stores[NOTIFIER].job_event_counts() == {"job-a": 5, "job-b": 1}
    assert await stores[SUP].list_jobs() == ["job-a", "job-b"]


async def test_a_supervisor_and_an_api_append_racing_on_one_seq_exactly_one_wins(
    stores: dict[WriterKind, RecordStore],
) -> None:
    """The server enforces the expected seq across writer subjects
    (`Nats-Expected-Last-Subject-Sequence-Subject: dispatch.record.<job>.*`), so a
    supervisor's decision and an operator's command never both extend one version.

    The job's last event is the notifier's, on a subject neither racer appends to: checked
    per writer subject, both appends would be refused; checked over the job, one wins.
    """
    for round_ in range(10):
        job = f"race-{round_}"
        s0 = await stores[API].append(job, b"created", expected_last_seq=0, msg_id=f"{job}:0")
        s1 = await stores[NOTIFIER].append(job, b"n", expected_last_seq=s0, msg_id=f"{job}:1")
        results = await asyncio.gather(
            stores[SUP].append(job, b"sup", expected_last_seq=s1, msg_id=f"{job}:sup"),
            stores[API].append(job, b"api", expected_last_seq=s1, msg_id=f"{job}:api"),
            return_exceptions=True,
        )
        wins = [r for r in results if isinstance(r, int)]
        losses = [r for r in results if isinstance(r, ConcurrencyConflict)]
        assert (len(wins), len(losses)) == (1, 1), results
        entries = await stores[NOTIFIER].read(job)
        assert [e.seq for e in entries] == [s0, s1, wins[0]]
        assert losses[0].actual == wins[0]


async def test_an_append_behind_another_writers_event_is_a_conflict(
    stores: dict[WriterKind, RecordStore],
) -> None:
    s1 = await stores[API].append("job-1", b"a", expected_last_seq=0, msg_id="m1")
    s2 = await stores[SUP].append("job-1", b"s", expected_last_seq=s1, msg_id="m2")
    # The notifier folded only s1: its own subject is empty, but the job's record is at s2.
    with pytest.raises(ConcurrencyConflict) as info:
        await stores[NOTIFIER].append("job-1", b"n", expected_last_seq=s1, msg_id="m3")
    assert (info.value.expected, info.value.actual) == (s1, s2)
    # An atomic batch is checked the same way.
    with pytest.raises(ConcurrencyConflict):
        await stores[API].append_many(
            "job-1", [b"x", b"y"], expected_last_seq=s1, msg_ids=["m4", "m5"]
        )
    # And a first append (expected 0) to a record another writer began.
    with pytest.raises(ConcurrencyConflict):
        await stores[SUP].append("job-1", b"z", expected_last_seq=0, msg_id="m6")
    assert [e.seq for e in await stores[API].read("job-1")] == [s1, s2]


async def test_a_retry_is_found_in_the_job_record_after_another_writer_appended(
    stores: dict[WriterKind, RecordStore],
) -> None:
    ours = await stores[SUP].append("job-1", b"ours", expected_last_seq=0, msg_id="ours")
    await stores[API].append("job-1", b"theirs", expected_last_seq=ours, msg_id="theirs")
    assert await stores[SUP].append("job-1", b"ours", expected_last_seq=0, msg_id="ours") == ours
    assert len(await stores[SUP].read("job-1")) == 2


async def test_a_msg_id_of_another_writer_kind_is_never_taken_for_ones_own(
    stores: dict[WriterKind, RecordStore],
) -> None:
    """Resolving a conflict scans the job's record for the append's msg id, but only this
    writer's own subject can hold an earlier try of it."""
    s1 = await stores[API].append("job-1", b"a", expected_last_seq=0, msg_id="m0")
    await stores[API].append("job-1", b"b", expected_last_seq=s1, msg_id="same")
    with pytest.raises(ConcurrencyConflict):
        await stores[NOTIFIER].append("job-1", b"n", expected_last_seq=s1, msg_id="same")


async def test_a_notifier_cancel_is_refused_by_fold_naming_it(
    stores: dict[WriterKind, RecordStore],
) -> None:
    """A compromised notifier appends an operator's command on its own subject (the only one
    its identity may publish): the record shows who wrote it, and fold refuses it."""
    creation = _created("job-1")
    s1 = await stores[API].append("job-1", encode(creation), expected_last_seq=0, msg_id="c")
    forged = CancelRequested(job_id="job-1", at=T0, by=ALICE, reason="forged")
    s2 = await stores[NOTIFIER].append("job-1", encode(forged), expected_last_seq=s1, msg_id="f")
    entries = await stores[API].read("job-1")
    items = [
        (e.seq, decode_record_event(e.payload, job_id="job-1", seq=e.seq), e.writer)
        for e in entries
    ]
    with pytest.raises(WriterRefused) as info:
        fold(items, T0)
    err = info.value
    assert (err.job_id, err.seq, err.event_type) == ("job-1", s2, "cancel.requested")
    assert err.writer == "notifier"
    assert isinstance(err, MalformedRecord)
    assert f"record of job 'job-1', event seq {s2}" in str(err)
    assert "cancel.requested was appended by a notifier writer" in str(err)
    assert "may write it: api" in str(err)


async def test_an_event_on_a_subject_naming_no_writer_kind_fails_that_jobs_read(
    stores: dict[WriterKind, RecordStore], js: JetStreamContext, streams: Layout
) -> None:
    """The stream's subjects are `dispatch.record.*.*`: a raw publish can use any last token.
    Reading that job names it and the seq; other jobs read as before."""
    s1 = await stores[API].append("job-1", b"ok", expected_last_seq=0, msg_id="m1")
    await stores[API].append("job-2", b"ok", expected_last_seq=0, msg_id="m2")
    ack = await js.publish(f"{streams.root}.record.job-1.observer", b"x")
    with pytest.raises(MalformedRecord) as info:
        await stores[SUP].read("job-1")
    assert (info.value.job_id, info.value.seq) == ("job-1", ack.seq)
    assert "names no writer kind" in str(info.value)
    assert len(await stores[SUP].read("job-2")) == 1
    assert await stores[SUP].job_event_counts() == {"job-1": 2, "job-2": 1}
    assert [e.seq for e in await stores[SUP].read("job-1", after_seq=ack.seq)] == []
    assert s1 < ack.seq
    # A subject no job id can be read from is no job's: the listing goes on without it.
    await js.publish(f"{streams.root}.record.Not_A_Job.api", b"x")
    assert await stores[SUP].list_jobs() == ["job-1", "job-2"]

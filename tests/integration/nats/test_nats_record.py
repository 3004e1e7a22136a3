"""RecordStore against a real nats-server: appends, optimistic concurrency, idempotency, reads."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from dispatch_core import WriterKind
from dispatch_nats import (
    ConcurrencyConflict,
    InvalidName,
    Layout,
    MsgIdReused,
    RecordStore,
    StreamNotFound,
)

pytestmark = pytest.mark.integration


async def test_first_append_expects_zero(store: RecordStore) -> None:
    seq = await store.append("job-1", b"created", expected_last_seq=0, msg_id="job-1:created")
    assert seq >= 1
    assert await store.last_seq("job-1") == seq
    [entry] = await store.read("job-1")
    assert (entry.seq, entry.payload, entry.msg_id) == (seq, b"created", "job-1:created")
    assert entry.time.tzinfo is UTC
    assert abs(datetime.now(UTC) - entry.time) < timedelta(seconds=30)


async def test_appends_chain_on_the_last_seq(store: RecordStore) -> None:
    s1 = await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:1")
    s2 = await store.append("job-1", b"e2", expected_last_seq=s1, msg_id="job-1:2")
    s3 = await store.append("job-1", b"e3", expected_last_seq=s2, msg_id="job-1:3")
    assert s1 < s2 < s3
    assert [e.payload for e in await store.read("job-1")] == [b"e1", b"e2", b"e3"]
    assert [e.seq for e in await store.read("job-1", after_seq=s1)] == [s2, s3]
    assert await store.read("job-1", after_seq=s3) == []


async def test_lost_race_raises_concurrency_conflict(store: RecordStore) -> None:
    s1 = await store.append("job-1", b"a", expected_last_seq=0, msg_id="job-1:a")
    with pytest.raises(ConcurrencyConflict) as info:
        await store.append("job-1", b"b", expected_last_seq=0, msg_id="job-1:b")
    assert (info.value.job_id, info.value.expected, info.value.actual) == ("job-1", 0, s1)
    assert info.value.retryable
    assert "expected last seq 0" in str(info.value)
    s2 = await store.append("job-1", b"c", expected_last_seq=s1, msg_id="job-1:c")
    with pytest.raises(ConcurrencyConflict) as stale:
        await store.append("job-1", b"d", expected_last_seq=s1, msg_id="job-1:d")
    assert (stale.value.expected, stale.value.actual) == (s1, s2)
    assert [e.payload for e in await store.read("job-1")] == [b"a", b"c"]


async def test_appends_to_other_jobs_do_not_conflict(store: RecordStore) -> None:
    a = await store.append("job-a", b"1", expected_last_seq=0, msg_id="job-a:1")
    await store.append("job-b", b"1", expected_last_seq=0, msg_id="job-b:1")
    await store.append("job-a", b"2", expected_last_seq=a, msg_id="job-a:2")
    assert len(await store.read("job-a")) == 2


async def test_two_racing_writers_never_both_win(store: RecordStore) -> None:
    s0 = await store.append("job-1", b"0", expected_last_seq=0, msg_id="job-1:0")
    results = await asyncio.gather(
        *(
            store.append("job-1", f"w{i}".encode(), expected_last_seq=s0, msg_id=f"job-1:w{i}")
            for i in range(20)
        ),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, int)]
    assert len(wins) == 1
    assert all(isinstance(r, ConcurrencyConflict) for r in results if not isinstance(r, int))
    assert len(await store.read("job-1")) == 2


async def test_retry_with_same_msg_id_returns_the_original_seq(store: RecordStore) -> None:
    seq = await store.append("job-1", b"e", expected_last_seq=0, msg_id="job-1:launch:1")
    again = await store.append("job-1", b"e", expected_last_seq=0, msg_id="job-1:launch:1")
    assert again == seq
    assert len(await store.read("job-1")) == 1


async def test_retry_finds_the_original_after_another_writer_appended(store: RecordStore) -> None:
    """The lab's recipe checked only the last message; the store scans after `expected`."""
    ours = await store.append("job-1", b"ours", expected_last_seq=0, msg_id="job-1:ours")
    theirs = await store.append("job-1", b"theirs", expected_last_seq=ours, msg_id="job-1:x")
    await store.append("job-1", b"more", expected_last_seq=theirs, msg_id="job-1:y")
    again = await store.append("job-1", b"ours", expected_last_seq=0, msg_id="job-1:ours")
    assert again == ours
    assert len(await store.read("job-1")) == 3


async def test_a_new_msg_id_after_a_stale_version_is_a_conflict(store: RecordStore) -> None:
    s1 = await store.append("job-1", b"e", expected_last_seq=0, msg_id="job-1:1")
    with pytest.raises(ConcurrencyConflict):
        await store.append("job-1", b"e", expected_last_seq=0, msg_id="job-1:2")
    assert await store.last_seq("job-1") == s1


async def test_msg_id_used_by_another_job_is_refused(store: RecordStore) -> None:
    seq = await store.append("job-a", b"e", expected_last_seq=0, msg_id="not-unique")
    with pytest.raises(MsgIdReused) as info:
        await store.append("job-b", b"e", expected_last_seq=0, msg_id="not-unique")
    assert info.value.seq == seq
    assert info.value.subject == store.layout.record_subject("job-a", store.writer)
    assert await store.read("job-b") == []


async def test_bad_names_are_refused_before_anything_is_sent(store: RecordStore) -> None:
    with pytest.raises(InvalidName, match=r"job id 'Job\.1'"):
        await store.append("Job.1", b"e", expected_last_seq=0, msg_id="m")
    with pytest.raises(InvalidName, match="msg id"):
        await store.append("job-1", b"e", expected_last_seq=0, msg_id="has space")
    with pytest.raises(InvalidName):
        await store.read("job.1")
    assert await store.list_jobs() == []


async def test_reading_a_1000_event_record(
    store: RecordStore, js: JetStreamContext, streams: Layout
) -> None:
    """All 1,000 events in order, with other jobs' events interleaved in the stream."""
    subject = streams.record_subject("big", WriterKind.SUPERVISOR)
    acks = []
    for i in range(1000):
        payload = b"%04d" % i + b"x" * 196
        acks.append(await js.publish_async(subject, payload, headers={"Nats-Msg-Id": f"b{i}"}))
        if i % 10 == 0:
            acks.append(
                await js.publish_async(
                    streams.record_subject(f"other-{i % 7}", WriterKind.API), b"z"
                )
            )
    await asyncio.wait_for(asyncio.gather(*acks), 30)
    timings = []
    entries = []
    for _ in range(5):
        t0 = time.perf_counter()
        entries = await store.read("big")
        timings.append(time.perf_counter() - t0)
    assert len(entries) == 1000
    assert [e.payload[:4] for e in entries] == [b"%04d" % i for i in range(1000)]
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert entries[999].msg_id == "b999"
    best = min(timings)
    print(
        f"read 1000 events: best {best * 1000:.1f} ms, runs {[round(t * 1000, 1) for t in timings]}"
    )
    assert best < 0.5  # measured about 10-20 ms here; a loose bound for a loaded machine


async def test_reads_page_through_large_records(nc: NATS, streams: Layout) -> None:
    small_pages = RecordStore(
        nc, writer=WriterKind.SUPERVISOR, layout=streams, page_size=7, page_bytes=1000
    )
    last = 0
    for i in range(50):
        last = await small_pages.append("job-1", b"p" * 100, expected_last_seq=last, msg_id=f"m{i}")
    entries = await small_pages.read("job-1")
    assert [e.msg_id for e in entries] == [f"m{i}" for i in range(50)]
    assert len(await small_pages.read("job-1", after_seq=entries[24].seq)) == 25
    await small_pages.aclose()


async def test_unknown_job_reads_empty(store: RecordStore) -> None:
    assert await store.read("nobody") == []
    assert await store.last_seq("nobody") == 0


async def test_a_checked_read_asks_the_leader_once_when_nothing_is_new(
    nc: NATS, streams: Layout, store: RecordStore
) -> None:
    """The supervisor's read after its fold: nothing new costs one request (the leader's
    next event after the fold), one new event two (no direct get), more a direct get; other
    jobs' and other writers' events in between change nothing of what is read."""
    checked = RecordStore(nc, writer=WriterKind.SUPERVISOR, layout=streams, check_reads=True)
    api = RecordStore(nc, writer=WriterKind.API, layout=streams)
    sent: list[str] = []
    publish = nc.publish

    async def counted(subject: str, *args: object, **kw: object) -> None:
        sent.append(subject)
        await publish(subject, *args, **kw)  # type: ignore[arg-type]

    nc.publish = counted  # type: ignore[method-assign]
    try:
        s1 = await api.append("job-c", b"a", expected_last_seq=0, msg_id="job-c:a")
        await store.append("other", b"x", expected_last_seq=0, msg_id="other:x")
        sent.clear()
        assert await checked.read("job-c", after_seq=s1) == []
        assert len(sent) == 1
        assert ".STREAM.MSG.GET." in sent[0]
        s2 = await store.append("job-c", b"b", expected_last_seq=s1, msg_id="job-c:b")
        sent.clear()
        [one] = await checked.read("job-c", after_seq=s1)
        assert (one.seq, one.payload, one.msg_id, one.writer) == (
            s2,
            b"b",
            "job-c:b",
            WriterKind.SUPERVISOR,
        )
        assert abs(datetime.now(UTC) - one.time) < timedelta(seconds=30)
        assert len(sent) == 2
        assert all(".STREAM.MSG.GET." in s for s in sent)
        assert [e.payload for e in await checked.read("job-c")] == [b"a", b"b"]
        s3 = await api.append("job-c", b"c", expected_last_seq=s2, msg_id="job-c:c")
        assert [e.seq for e in await checked.read("job-c", after_seq=s1)] == [s2, s3]
        assert await checked.read("job-c", after_seq=s3) == []
        assert await checked.read("nobody") == []
    finally:
        nc.publish = publish  # type: ignore[method-assign]
        await checked.aclose()
        await api.aclose()


async def test_list_jobs_and_counts(store: RecordStore) -> None:
    assert await store.stream_last_seq() == 0
    for job, n in (("job-b", 2), ("job-a", 1), ("job-c", 3)):
        last = 0
        for i in range(n):
            last = await store.append(job, b"e", expected_last_seq=last, msg_id=f"{job}:{i}")
    assert await store.list_jobs() == ["job-a", "job-b", "job-c"]
    assert await store.job_event_counts() == {"job-a": 1, "job-b": 2, "job-c": 3}
    assert await store.stream_last_seq() == 6


async def test_scan_writer_reads_one_writers_appends_across_jobs_in_pages(
    nc: NATS, streams: Layout, store: RecordStore
) -> None:
    """What the API's jobs index learns every job's ``job.created`` from (a few batch reads,
    not a read per job): only that writer kind's events, in stream order, past pages."""
    api = RecordStore(nc, writer=WriterKind.API, layout=streams, page_size=2)
    try:
        mine = []
        for job in ("job-b", "job-a", "job-c"):
            seq = await api.append(job, f"created {job}".encode(), expected_last_seq=0,
                msg_id=f"{job}:0")  # fmt: skip
            mine.append((job, seq))
            await store.append(job, b"not the api's", expected_last_seq=seq, msg_id=f"{job}:1")
        scanned = [(job, e.seq, e.payload, e.writer) async for job, e in api.scan_writer(
            WriterKind.API)]  # fmt: skip
        assert scanned == [
            (job, seq, f"created {job}".encode(), WriterKind.API) for job, seq in mine
        ]
        after = [job async for job, _ in api.scan_writer(WriterKind.API, mine[0][1])]
        assert after == ["job-a", "job-c"]
    finally:
        await api.aclose()


async def test_missing_stream_is_a_typed_error(nc: NATS) -> None:
    store = RecordStore(
        nc, writer=WriterKind.SUPERVISOR, layout=Layout(namespace="never-created"), attempts=1
    )
    with pytest.raises(StreamNotFound):
        await store.append("job-1", b"e", expected_last_seq=0, msg_id="m")
    with pytest.raises(StreamNotFound):
        await store.read("job-1")
    with pytest.raises(StreamNotFound):
        await store.list_jobs()
    await store.aclose()


async def test_append_many_is_all_or_nothing(store: RecordStore) -> None:
    seqs = await store.append_many(
        "job-1", [b"a", b"b", b"c"], expected_last_seq=0, msg_ids=["m1", "m2", "m3"]
    )
    assert [e.seq for e in await store.read("job-1")] == seqs
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]
    with pytest.raises(ConcurrencyConflict) as info:
        await store.append_many("job-1", [b"d", b"e"], expected_last_seq=0, msg_ids=["m4", "m5"])
    assert info.value.actual == seqs[-1]
    assert len(await store.read("job-1")) == 3  # nothing of the failed batch
    # A retry of the stored batch returns its seqs.
    again = await store.append_many(
        "job-1", [b"a", b"b", b"c"], expected_last_seq=0, msg_ids=["m1", "m2", "m3"]
    )
    assert again == seqs


async def test_append_many_seqs_are_the_stored_ones_under_concurrent_writers(
    store: RecordStore,
) -> None:
    async def batches(job: str) -> list[int]:
        out: list[int] = []
        last = 0
        for b in range(10):
            ids = [f"{job}:{b}:{i}" for i in range(5)]
            seqs = await store.append_many(job, [b"x"] * 5, expected_last_seq=last, msg_ids=ids)
            out += seqs
            last = seqs[-1]
        return out

    results = await asyncio.gather(*(batches(f"job-{j}") for j in range(8)))
    for j, seqs in enumerate(results):
        entries = await store.read(f"job-{j}")
        assert [e.seq for e in entries] == seqs
        assert [e.msg_id for e in entries] == [
            f"job-{j}:{b}:{i}" for b in range(10) for i in range(5)
        ]


async def test_append_many_validates_its_arguments(store: RecordStore) -> None:
    with pytest.raises(ValueError, match="msg ids"):
        await store.append_many("job-1", [b"a"], expected_last_seq=0, msg_ids=["1", "2"])
    with pytest.raises(ValueError, match="distinct"):
        await store.append_many("job-1", [b"a", b"b"], expected_last_seq=0, msg_ids=["1", "1"])
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        await store.append_many("job-1", [], expected_last_seq=0, msg_ids=[])
    assert await store.append_many("job-1", [b"a"], expected_last_seq=0, msg_ids=["1"]) == [
        await store.last_seq("job-1")
    ]


_ROUND = st.lists(st.sampled_from(["a", "b", "both", "read-a", "read-b"]), min_size=1, max_size=25)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rounds=_ROUND)
async def test_interleaved_writers_never_both_extend_a_version(
    store: RecordStore, rounds: list[str]
) -> None:
    """Two writers append from what they last read, one at a time or at once, in any order.

    Whatever the interleaving, no two stored events were appended from the same version, the
    record is exactly the successful appends in order, and each event's predecessor is the
    version its writer expected.
    """
    job = f"hyp-{time.monotonic_ns()}"
    known = {"a": 0, "b": 0}
    won: list[tuple[int, int, str]] = []  # (expected, seq, msg id)
    counter = 0
    conflicts: list[tuple[int, int]] = []

    async def write(w: str) -> None:
        nonlocal counter
        counter += 1
        msg_id = f"{job}:{w}:{counter}"
        try:
            seq = await store.append(
                job, msg_id.encode(), expected_last_seq=known[w], msg_id=msg_id
            )
        except ConcurrencyConflict as err:
            conflicts.append((err.expected, known[w]))
            return
        won.append((known[w], seq, msg_id))
        known[w] = seq

    for step in rounds:
        if step == "both":
            await asyncio.gather(write("a"), write("b"))
        elif step.startswith("read-"):
            known[step[-1]] = await store.last_seq(job)
        else:
            await write(step)

    assert all(reported == sent for reported, sent in conflicts)
    assert all(reported == sent for reported, sent in conflicts)
    expected_versions = [w[0] for w in won]
    assert len(expected_versions) == len(set(expected_versions))
    entries = await store.read(job)
    assert [(e.seq, e.msg_id) for e in entries] == sorted((w[1], w[2]) for w in won)
    previous = 0
    by_seq = {w[1]: w[0] for w in won}
    for e in entries:
        assert by_seq[e.seq] == previous
        previous = e.seq

"""The record repository's contract (`dispatch_nats.RecordRepository`), run on the IN-MEMORY
FAKE store (`tests/contract/record_fake.py`) and on the real `RecordStore` on a real
nats-server: the same tests, parametrised by the `harness` fixture.

Covered: incremental load, decisions committed with optimistic concurrency, lost races
re-loaded and re-decided (bounded), facts re-appended without re-deciding, redundant and
moot facts dropped, unknown outcomes (ack lost after storing, request lost, outcome unknown
past the deadline) found out by reading the msg ids, poison contained to its job. Faults
are injected at the store's boundary by `FaultyStore` (both stores), and on the real server
by freezing it through the store's ack wait and by restarting it mid-append.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS

from dispatch_core import (
    Actor,
    ActorKind,
    CancelRequested,
    Declarations,
    EscalationCommitted,
    EscalationDelivered,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    LaunchIntended,
    LaunchRecorded,
    MalformedRecord,
    ObjectRef,
    Plan,
    RecoveryPolicy,
    SubmissionOpened,
    UndecodableEvent,
    WriterKind,
    WriterRefused,
    encode,
    fold,
)
from dispatch_core.backoff import Backoff
from dispatch_core.events import SubmissionWhy
from dispatch_nats import (
    AppendOutcomeUnknown,
    Change,
    Layout,
    Loaded,
    RecordPort,
    RecordRepository,
    RecordStore,
    TooManyConflicts,
    UnfoldableDecision,
    ensure_streams,
    record_items,
)
from tests.contract.record_fake import FakeRecordStream, FaultyStore
from tests.integration.nats.support import connect
from tests.servers.nats import NatsServer

pytestmark = pytest.mark.integration

API, SUP, NOTIFIER = WriterKind.API, WriterKind.SUPERVISOR, WriterKind.NOTIFIER
T0 = datetime(2026, 3, 1, tzinfo=UTC)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
FAST = Backoff(base_s=0.01, max_s=0.05, jitter=0.0)


def _clock() -> datetime:
    return T0 + timedelta(hours=1)


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


def _launch(job_id: str, n: int = 1) -> list[Change]:
    """The supervisor's decisions to open submission ``n`` and launch its attempt 1."""
    return [
        Change(
            f"{job_id}:s{n}",
            SubmissionOpened(job_id=job_id, at=T0, submission=n, why=SubmissionWhy.INITIAL),
        ),
        Change(f"{job_id}:l{n}", LaunchIntended(job_id=job_id, at=T0, submission=n, attempt=1)),
    ]


def _escalated(job_id: str, esc: str) -> Change:
    return Change(
        f"{job_id}:e:{esc}", EscalationCommitted(job_id=job_id, at=T0, id=esc, detail="d")
    )


def _delivered(job_id: str, esc: str) -> EscalationDelivered:
    return EscalationDelivered(job_id=job_id, at=T0, id=esc, channel="c")


def _is_delivered(job: Job, event: JobEvent) -> bool:
    assert isinstance(event, EscalationDelivered)
    esc = job.escalation(event.id)
    return esc is not None and esc.delivered is not None


class Harness:
    """A record stream (fake or real) and stores on it, one per writer kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fake = FakeRecordStream()
        self.nc: NATS | None = None
        self.layout: Layout | None = None
        self._stores: list[RecordStore] = []

    def store(self, writer: WriterKind) -> RecordPort:
        """A store appending as ``writer``."""
        if self.nc is None:
            return self.fake.store(writer)
        store = RecordStore(
            self.nc,
            writer=writer,
            layout=self.layout or Layout(),
            check_reads=self.kind == "real-checked",
        )
        self._stores.append(store)
        return store

    def repo(
        self, writer: WriterKind, store: RecordPort | None = None, **kw: object
    ) -> RecordRepository:
        options: dict[str, object] = {"backoff": FAST, "unknown_for_s": 10.0, **kw}
        return RecordRepository(
            store if store is not None else self.store(writer),
            writer=writer,
            clock=_clock,
            **options,  # type: ignore[arg-type]
        )

    async def raw(self, job_id: str, payload: bytes, writer: str) -> None:
        """Store an event as someone bypassing dispatch would: unchecked, undecoded."""
        if self.nc is None:
            self.fake.put(job_id, payload, WriterKind(writer), None)
            return
        assert self.layout is not None
        subject = f"{self.layout.root}.record.{job_id}.{writer}"
        await self.nc.jetstream().publish(subject, payload, stream=self.layout.record_stream)

    async def stored(self, job_id: str) -> list[tuple[str | None, WriterKind]]:
        """The job's stored events as (msg id, writer), read by a plain store."""
        entries = await self.store(SUP).read(job_id)
        return [(e.msg_id, e.writer) for e in entries]

    async def aclose(self) -> None:
        for store in self._stores:
            await store.aclose()


@pytest.fixture(params=["fake", "real", "real-checked"])
def backing(request: pytest.FixtureRequest) -> tuple[str, NATS | None, Layout | None]:
    """Which store: the in-memory fake, or the real one on the session server (reading
    as any reader does, or checked against the stream leader as the supervisor does)."""
    if request.param != "fake":
        return request.param, request.getfixturevalue("nc"), request.getfixturevalue("streams")
    return "fake", None, None


@pytest.fixture
async def harness(
    backing: tuple[str, NATS | None, Layout | None],
) -> AsyncIterator[Harness]:
    """The contract's subject (see `backing`)."""
    h = Harness(backing[0])
    h.nc, h.layout = backing[1], backing[2]
    yield h
    await h.aclose()


async def _submitted(h: Harness, job_id: str) -> Job:
    """Commit the job's creation as the API does; return the job."""

    async def create(loaded: Loaded | None) -> Sequence[Change]:
        assert loaded is None
        return [Change(f"{job_id}:created", _created(job_id))]

    done = await h.repo(API).decide(job_id, create)
    assert done.job is not None
    return done.job


# ----------------------------------------------------------------------------------- load


async def test_a_job_without_a_record_loads_as_none(harness: Harness) -> None:
    assert await harness.repo(SUP).load("nobody") is None


async def test_load_is_incremental_and_equals_a_full_fold(harness: Harness) -> None:
    job = await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    first = await sup.load("job-1")
    assert first is not None
    assert first.job == job
    assert len(first.entries) == 1

    unchanged = await sup.load("job-1", first.job)
    assert unchanged == Loaded(first.job, ())

    await sup.commit("job-1", first, _launch("job-1"))
    later = await sup.load("job-1", first.job)
    assert later is not None
    assert [e.msg_id for e in later.entries] == ["job-1:s1", "job-1:l1"]  # only what is new
    full = await sup.load("job-1")
    assert full is not None
    assert later.job == full.job
    entries = await harness.store(SUP).read("job-1")
    assert later.job == fold(record_items("job-1", entries), _clock())


# ------------------------------------------------------------------------------ decisions


async def test_decide_commits_with_the_version_it_decided_on(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    seen: list[int] = []

    async def launch(loaded: Loaded | None) -> Sequence[Change]:
        assert loaded is not None
        seen.append(loaded.job.seq)
        return _launch("job-1")

    done = await harness.repo(SUP).decide("job-1", launch)
    assert len(seen) == 1
    assert done.loaded is not None
    assert done.loaded.job.seq == seen[0]
    assert done.job is not None
    assert done.job.seq == done.seqs[-1]
    assert [type(e) for _, e in done.events] == [SubmissionOpened, LaunchIntended]
    assert await harness.stored("job-1") == [
        ("job-1:created", API),
        ("job-1:s1", SUP),
        ("job-1:l1", SUP),
    ]
    reloaded = await harness.repo(SUP).load("job-1")
    assert reloaded is not None
    assert reloaded.job == done.job


async def test_nothing_decided_appends_nothing(harness: Harness) -> None:
    job = await _submitted(harness, "job-1")

    async def nothing(loaded: Loaded | None) -> Sequence[Change]:
        return []

    done = await harness.repo(SUP).decide("job-1", nothing)
    assert done.events == ()
    assert done.job == job
    assert len(await harness.stored("job-1")) == 1


async def test_a_lost_race_is_reloaded_and_decided_again(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    faulty = FaultyStore(harness.store(SUP))
    other = harness.repo(API)
    versions: list[tuple[int, bool]] = []

    async def cancel_first(job_id: str) -> None:
        faulty.before_append = None  # once: the API's cancel lands between load and commit
        loaded = await other.load(job_id)
        cancel = CancelRequested(job_id=job_id, at=T0, by=ALICE, reason="r")
        await other.commit(job_id, loaded, [Change(f"{job_id}:cancel", cancel)])

    faulty.before_append = cancel_first

    async def launch(loaded: Loaded | None) -> Sequence[Change]:
        assert loaded is not None
        versions.append((loaded.job.seq, loaded.job.cancel_requested_at is not None))
        return _launch("job-1")

    conflicts: list[str] = []
    repo = harness.repo(SUP, faulty, on_conflict=conflicts.append)
    done = await repo.decide("job-1", launch)
    assert conflicts == ["decision"]
    assert len(versions) == 2
    assert versions[0][0] < versions[1][0]
    assert versions == [(versions[0][0], False), (versions[1][0], True)]  # re-decided on the cancel
    assert [m for m, _ in await harness.stored("job-1")] == [
        "job-1:created",
        "job-1:cancel",
        "job-1:s1",
        "job-1:l1",
    ]
    assert done.job is not None
    assert done.job.cancel_requested_at is not None


async def test_conflicts_are_bounded(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    faulty = FaultyStore(harness.store(SUP))
    other = harness.repo(API)
    n = 0

    async def always_first(job_id: str) -> None:
        nonlocal n
        n += 1
        loaded = await other.load(job_id)
        cancel = CancelRequested(job_id=job_id, at=T0, by=ALICE, reason=f"r{n}")
        await other.commit(job_id, loaded, [Change(f"{job_id}:c{n}", cancel)])

    faulty.before_append = always_first
    decided = 0

    async def launch(loaded: Loaded | None) -> Sequence[Change]:
        nonlocal decided
        decided += 1
        return _launch("job-1")

    with pytest.raises(TooManyConflicts) as info:
        await harness.repo(SUP, faulty, conflict_tries=3).decide("job-1", launch)
    assert info.value.retryable
    assert info.value.tries == 3
    assert decided == 3
    assert [w for _, w in await harness.stored("job-1")] == [API] * 4  # none of ours


async def test_decisions_that_would_not_fold_are_never_appended(harness: Harness) -> None:
    job = await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    loaded = Loaded(job, ())
    # Submission 2 before submission 1: dispatch's own fold refuses it.
    with pytest.raises(UnfoldableDecision) as bad:
        await sup.commit("job-1", loaded, _launch("job-1", n=2))
    assert isinstance(bad.value.__cause__, MalformedRecord)
    assert not isinstance(bad.value, MalformedRecord)  # not the stored record's poison
    # An event the supervisor may not write (a person's cancel).
    cancel = CancelRequested(job_id="job-1", at=T0, by=ALICE, reason="r")
    with pytest.raises(UnfoldableDecision) as refused:
        await sup.commit("job-1", loaded, [Change("x", cancel)])
    assert isinstance(refused.value.__cause__, WriterRefused)
    assert len(await harness.stored("job-1")) == 1


# ---------------------------------------------------------------------- unknown outcomes


async def test_a_lost_ack_is_found_by_reading_the_msg_ids(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    faulty = FaultyStore(harness.store(SUP))
    faulty.lose_acks = 1

    async def launch(loaded: Loaded | None) -> Sequence[Change]:
        return _launch("job-1")

    done = await harness.repo(SUP, faulty).decide("job-1", launch)
    assert faulty.appends == 1  # found by reading: not sent again
    stored = await harness.stored("job-1")
    assert [m for m, _ in stored] == ["job-1:created", "job-1:s1", "job-1:l1"]
    entries = await harness.store(SUP).read("job-1")
    assert done.seqs == [e.seq for e in entries[1:]]


async def test_a_lost_request_is_sent_again_and_stored_once(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    faulty = FaultyStore(harness.store(SUP))
    faulty.lose_sends = 2

    async def launch(loaded: Loaded | None) -> Sequence[Change]:
        return _launch("job-1")

    done = await harness.repo(SUP, faulty).decide("job-1", launch)
    assert faulty.appends == 1
    assert [m for m, _ in await harness.stored("job-1")] == [
        "job-1:created",
        "job-1:s1",
        "job-1:l1",
    ]
    assert done.job is not None
    assert done.job.seq == done.seqs[-1]


async def test_an_outcome_unknown_past_the_deadline_is_raised_retryable(harness: Harness) -> None:
    job = await _submitted(harness, "job-1")
    faulty = FaultyStore(harness.store(SUP))
    faulty.lose_sends = 1000
    repo = harness.repo(SUP, faulty, unknown_for_s=0.2)
    with pytest.raises(AppendOutcomeUnknown) as info:
        await repo.commit("job-1", Loaded(job, ()), _launch("job-1"))
    assert info.value.retryable
    faulty.lose_sends = 0
    # The caller's retry with the same msg ids and version is stored once.
    done = await repo.commit("job-1", Loaded(job, ()), _launch("job-1"))
    assert len(done.seqs) == 2
    assert len(await harness.stored("job-1")) == 3


# ----------------------------------------------------------------------------------- facts


async def test_a_fact_is_appended_again_on_the_new_version_without_deciding(
    harness: Harness,
) -> None:
    await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    loaded = await sup.load("job-1")
    launched = await sup.commit("job-1", loaded, _launch("job-1"))
    assert launched.job is not None
    faulty = FaultyStore(harness.store(SUP))
    other = harness.repo(API)

    async def cancel_first(job_id: str) -> None:
        faulty.before_append = None
        current = await other.load(job_id)
        cancel = CancelRequested(job_id=job_id, at=T0, by=ALICE, reason="r")
        await other.commit(job_id, current, [Change(f"{job_id}:cancel", cancel)])

    faulty.before_append = cancel_first
    fact = LaunchRecorded(
        job_id="job-1", at=T0, submission=1, attempt=1, ref=ObjectRef(cluster="c", id="o1")
    )
    done = await harness.repo(SUP, faulty).append_fact(launched.job, "job-1:l1:recorded", fact)
    assert done.seq is not None
    assert done.job.seq == done.seq
    assert (
        done.job.cancel_requested_at is not None
    )  # the fact went on top of the other writer's event
    assert [m for m, _ in await harness.stored("job-1")][-2:] == [
        "job-1:cancel",
        "job-1:l1:recorded",
    ]
    full = await sup.load("job-1")
    assert full is not None
    assert full.job == done.job


async def test_a_redundant_fact_is_not_appended(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    escalated = await sup.commit("job-1", await sup.load("job-1"), [_escalated("job-1", "x:1")])
    assert escalated.job is not None
    notifier = harness.repo(NOTIFIER)
    first = await notifier.append_fact(
        escalated.job, "delivered:job-1:x:1", _delivered("job-1", "x:1"), redundant=_is_delivered
    )
    assert first.seq is not None
    # A second notifier that folded before the delivery: its append conflicts, the re-load
    # shows it delivered, so nothing more is appended.
    again = await harness.repo(NOTIFIER).append_fact(
        escalated.job,
        "delivered:job-1:x:1:again",
        _delivered("job-1", "x:1"),
        redundant=_is_delivered,
    )
    assert again.seq is None
    assert again.job.seq == first.seq
    assert len(await harness.stored("job-1")) == 3


async def test_a_fact_with_a_lost_ack_is_stored_once(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    escalated = await sup.commit("job-1", await sup.load("job-1"), [_escalated("job-1", "x:1")])
    assert escalated.job is not None
    faulty = FaultyStore(harness.store(NOTIFIER))
    faulty.lose_acks = 1
    done = await harness.repo(NOTIFIER, faulty).append_fact(
        escalated.job, "delivered:job-1:x:1", _delivered("job-1", "x:1")
    )
    assert done.seq is not None
    assert faulty.appends == 1
    assert (await harness.stored("job-1"))[-1] == ("delivered:job-1:x:1", NOTIFIER)
    assert len(await harness.stored("job-1")) == 3


async def test_a_fact_another_replica_stored_after_other_events_is_read_not_assumed(
    harness: Harness,
) -> None:
    """Two supervisor replicas append the same fact under the same msg id. JetStream answers
    the later one with the earlier copy's seq whatever its expected seq; events stored
    between the later replica's view and that copy must not be skipped in its job."""
    await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    launched = await sup.commit("job-1", await sup.load("job-1"), _launch("job-1"))
    assert launched.job is not None
    behind = launched.job  # replica A's view
    fact = LaunchRecorded(
        job_id="job-1", at=T0, submission=1, attempt=1, ref=ObjectRef(cluster="c", id="o1")
    )
    cancel = CancelRequested(job_id="job-1", at=T0, by=ALICE, reason="r")
    api = harness.repo(API)
    await api.commit("job-1", await api.load("job-1"), [Change("job-1:cancel", cancel)])
    seen = await sup.load("job-1")
    assert seen is not None
    other = await harness.repo(SUP).append_fact(seen.job, "job-1:l1:recorded", fact)
    # replica B saw the cancel, then stored the fact
    assert other.seq is not None

    done = await harness.repo(SUP).append_fact(behind, "job-1:l1:recorded", fact)

    assert [m for m, _ in await harness.stored("job-1")].count("job-1:l1:recorded") == 1
    assert done.job.cancel_requested_at is not None  # the event in between is not skipped
    full = await sup.load("job-1")
    assert full is not None
    assert done.job == full.job


async def test_a_moot_fact_is_dropped(harness: Harness) -> None:
    job = await _submitted(harness, "job-1")
    # A launch recorded for a launch never intended: the record's own fold refuses it.
    fact = LaunchRecorded(
        job_id="job-1", at=T0, submission=1, attempt=1, ref=ObjectRef(cluster="c", id="o1")
    )
    done = await harness.repo(SUP).append_fact(job, "job-1:moot", fact)
    assert done.seq is None
    assert done.job == job
    assert len(await harness.stored("job-1")) == 1


# ---------------------------------------------------------------------------------- poison


async def test_an_undecodable_event_is_its_jobs_problem_only(harness: Harness) -> None:
    await _submitted(harness, "job-bad")
    good = await _submitted(harness, "job-good")
    sup = harness.repo(SUP)
    before = await sup.load("job-bad")
    assert before is not None
    await harness.raw("job-bad", b'{"type":"no.such.event"}', "supervisor")
    with pytest.raises(UndecodableEvent) as info:
        await sup.load("job-bad")
    assert info.value.job_id == "job-bad"
    assert info.value.seq > before.job.seq
    with pytest.raises(UndecodableEvent):
        await sup.load("job-bad", before.job)  # an incremental load meets it too
    loaded = await sup.load("job-good")
    assert loaded is not None
    assert loaded.job == good

    async def launch(loaded: Loaded | None) -> Sequence[Change]:
        return _launch("job-good")

    assert (await sup.decide("job-good", launch)).seqs


async def test_an_event_its_writer_may_not_write_is_refused_by_load(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    await harness.raw(
        "job-1", encode(CancelRequested(job_id="job-1", at=T0, by=ALICE, reason="r")), "notifier"
    )
    with pytest.raises(WriterRefused) as info:
        await harness.repo(SUP).load("job-1")
    assert info.value.job_id == "job-1"


# ------------------------------------------------------------------- real server faults


class _OnLog(logging.Handler):
    """Sets ``event`` when a log record with message ``msg`` is emitted."""

    def __init__(self, msg: str) -> None:
        super().__init__(logging.DEBUG)
        self.msg = msg
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == self.msg:
            self.event.set()


async def _private(server: NatsServer, **options: float) -> tuple[NATS, Layout, RecordStore]:
    nc = await connect(server.url)
    layout = Layout(namespace=f"t{uuid.uuid4().hex[:12]}")
    await ensure_streams(nc, layout=layout)
    store = RecordStore(nc, writer=SUP, layout=layout, attempts=1, **options)  # type: ignore[arg-type]
    return nc, layout, store


async def _commit_through(server: NatsServer, fault: str) -> None:
    """Freeze the server under an append until the store gives up (unknown outcome), then
    ``resume`` it or ``restart`` it; the repository must end with the events stored once."""
    nc, layout, store = await _private(server, ack_timeout_s=0.3, read_timeout_s=0.3)
    patient = RecordStore(nc, writer=SUP, layout=layout)
    handler = _OnLog("repository.append_unknown")
    logger = logging.getLogger("dispatch_nats.repository")
    logger.addHandler(handler)
    try:
        api = RecordRepository(RecordStore(nc, writer=API, layout=layout), writer=API, clock=_clock)
        created = await api.commit("job-1", None, [Change("job-1:created", _created("job-1"))])
        repo = RecordRepository(
            store,
            writer=SUP,
            clock=_clock,
            unknown_for_s=60.0,
            backoff=Backoff(base_s=0.2, max_s=1.0),
        )
        server.pause()
        paused = True
        try:
            loaded = Loaded(created.job, ()) if created.job else None
            task = asyncio.create_task(repo.commit("job-1", loaded, _launch("job-1")))
            await asyncio.wait_for(handler.event.wait(), 30)
            if fault == "resume":
                server.resume()
            else:
                await asyncio.to_thread(server.restart)
            paused = False
            done = await asyncio.wait_for(task, 60)
        finally:
            if paused:
                server.resume()
        entries = await patient.read("job-1")
        assert [e.msg_id for e in entries] == ["job-1:created", "job-1:s1", "job-1:l1"]
        assert done.seqs == [e.seq for e in entries[1:]]
    finally:
        logger.removeHandler(handler)
        await store.aclose()
        await patient.aclose()
        await nc.close()


async def test_real_an_ack_lost_in_a_frozen_server_is_resolved(
    private_nats_server: NatsServer,
) -> None:
    """The server is frozen (SIGSTOP) through the store's only attempt: the store raises
    AppendOutcomeUnknown; the server thaws and stores the buffered append; the repository
    reads, finds its msg ids (or sends it again and JetStream deduplicates it)."""
    await _commit_through(private_nats_server, "resume")


async def test_real_a_server_restarted_mid_append_ends_stored_once(
    private_nats_server: NatsServer,
) -> None:
    """The server is restarted while an append waits for its ack: whether the append was
    stored before the restart or not, the repository ends with it stored exactly once."""
    await _commit_through(private_nats_server, "restart")


async def test_events_are_decoded_and_checked_without_folding(harness: Harness) -> None:
    await _submitted(harness, "job-1")
    sup = harness.repo(SUP)
    launched = await sup.commit("job-1", await sup.load("job-1"), _launch("job-1"))
    stored = await sup.events("job-1", launched.seqs[0])
    assert [(s.entry.msg_id, type(s.event)) for s in stored] == [("job-1:l1", LaunchIntended)]
    assert [s.item for s in stored] == [(launched.seqs[1], launched.events[1][1], SUP)]
    await harness.raw(
        "job-1", encode(CancelRequested(job_id="job-1", at=T0, by=ALICE, reason="r")), "notifier"
    )
    with pytest.raises(WriterRefused):
        await sup.events("job-1", launched.seqs[-1])  # a part of the record is checked too

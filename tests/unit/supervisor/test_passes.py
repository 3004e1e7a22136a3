"""The pass executor on in-memory ports (docs/runtime.md, "One pass"): decisions committed
before actions, re-planning on a conflict, racing replicas launching once, facts dropped when
moot, seed 002's delivery (after the next pass; the last look) and the Status's OCC."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from dispatch_backends import LaunchRefusedError, Unreachable
from dispatch_core import (
    Actor,
    ActorKind,
    Cancel,
    Cause,
    CauseKind,
    Discovery,
    Escalation,
    EscalationDelivered,
    GateState,
    HoldCommand,
    Job,
    JobEvent,
    JobSpec,
    Launch,
    LaunchIntended,
    LaunchRecorded,
    LaunchUnknown,
    Level,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    OutcomeCommitted,
    Provenance,
    RecoveryPolicy,
    State,
    Status,
    Submit,
    WriterKind,
    decide,
    decode,
    decode_event,
    encode,
    fold,
)
from dispatch_nats import RecordEntry, StaleRead
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassExecutor
from services.supervisor.ports import DeliverFn
from tests.contract.record_fake import FakeRecordStream, FaultyStore
from tests.unit.core.helpers import rule
from tests.unit.supervisor.fakes import FakeBackend, FakeLatest
from tests.util import writer_of

JOB = "job-1"
CLUSTER = "fake"
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)


class Installation:
    """Ports shared by the executors (replicas) of one test."""

    def __init__(self) -> None:
        self.stream = FakeRecordStream()
        self.records = FaultyStore(self.stream.store(WriterKind.SUPERVISOR))
        """The supervisor's record store (the repository contract's fake), with faults."""
        self.discoveries = FakeLatest()
        self.statuses = FakeLatest()
        self.backend = FakeBackend(CLUSTER)
        self.registry = CollectorRegistry()

    def executor(
        self,
        *,
        deliver: DeliverFn | None = None,
        writer: str | None = None,
        launch_retry_s: float = 30.0,
        registry: CollectorRegistry | None = None,
        status_echo_s: float | None = None,
    ) -> PassExecutor:
        return PassExecutor(
            status_echo_s=status_echo_s,
            launch_retry_s=launch_retry_s,
            records=self.records,
            discoveries=self.discoveries,
            statuses=self.statuses,
            backends={CLUSTER: self.backend},
            metrics=SupervisorMetrics(registry or CollectorRegistry()),
            deliver=deliver,
            writer=writer,
        )

    def submit(self, job_id: str = JOB, policy: RecoveryPolicy | None = None) -> None:
        events = decide(
            None,
            Submit(
                by=ALICE,
                job_id=job_id,
                spec=JobSpec(cluster=CLUSTER, command=("train",)),
                policy=policy or RecoveryPolicy(),
                declarations=self.backend.declarations(),
            ),
            datetime.now(UTC),
        )
        self.write(job_id, *events)

    def write(self, job_id: str, *events: JobEvent) -> None:
        """Append as another writer would (unchecked), as the kind that appends each event in
        production."""
        for event in events:
            self.stream.put(job_id, encode(event), writer_of(event), f"other:{self.stream.seq}")

    def events(self, job_id: str = JOB) -> list[JobEvent]:
        return [decode_event(e.payload) for e in self.stream.entries.get(job_id, [])]

    def last(self, job_id: str = JOB) -> int:
        return self.stream.last(job_id)

    def job(self, job_id: str = JOB) -> Job:
        entries = self.stream.entries[job_id]
        return fold(
            ((e.seq, decode_event(e.payload), e.writer) for e in entries), datetime.now(UTC)
        )

    async def show(self, *objects: ObservedObject, job_id: str = JOB) -> None:
        discovery = Discovery(
            cluster=CLUSTER, job_id=job_id, seen_at=datetime.now(UTC), objects=objects
        )
        await self.discoveries.put((CLUSTER, job_id), encode(discovery))

    def status(self, job_id: str = JOB) -> Status:
        entry = self.statuses.values[(job_id,)]
        return decode(entry.payload, Status)


def _obj(
    object_id: str,
    phase: ObjectPhase,
    *,
    gate: GateState = GateState.OPEN,
    cause: Cause | None = None,
    submission: int | None = 1,
) -> ObservedObject:
    return ObservedObject(
        ref=ObjectRef(cluster=CLUSTER, id=object_id),
        name=f"dj-{JOB}",
        submission=submission,
        attempt=None if submission is None else 1,
        phase=phase,
        gate=gate,
        cause=cause,
    )


def _tags(inst: Installation) -> list[str]:
    return [str(type(e).__struct_config__.tag) for e in inst.events(JOB)]


async def test_the_launch_intent_is_committed_before_the_backend_is_called() -> None:
    inst = Installation()
    inst.submit()
    seen_at_start: list[list[str]] = []

    async def on_start(launch: Launch) -> None:
        seen_at_start.append(_tags(inst))

    inst.backend.on_start = on_start
    outcome = await inst.executor().run_pass(JOB)
    assert seen_at_start == [["job.created", "submission.opened", "launch.intended"]]
    assert _tags(inst) == [
        "job.created",
        "submission.opened",
        "launch.intended",
        "launch.recorded",
    ]
    assert outcome.appended == 3
    # Planning again on what it appended gives nothing to do until the object shows up: no
    # follow-up pass, and the pass covers the record up to its own last append.
    assert not outcome.follow_up
    assert outcome.planned_seq == inst.last(JOB)
    status = inst.status()
    assert status.seq == inst.last(JOB)
    assert status.state is State.PENDING


async def test_an_append_answered_by_silence_is_sent_again_and_found_stored() -> None:
    """JetStream stored the decisions and the launch's fact but never answered: sent again
    with the same msg ids, each is found stored; the launch is made once, not left unknown."""
    inst = Installation()
    inst.submit()
    inst.records.lose_acks = 2
    outcome = await inst.executor().run_pass(JOB)
    assert len(inst.backend.started) == 1
    assert _tags(inst) == [
        "job.created",
        "submission.opened",
        "launch.intended",
        "launch.recorded",
    ]
    assert outcome.appended == 3


async def test_a_refused_launch_asks_for_a_follow_up_pass() -> None:
    """The scheduler refused attempt 1: planning again gives attempt 2 at once."""
    inst = Installation()
    inst.submit()

    async def refuse_first(launch: Launch) -> None:
        if launch.attempt == 1:
            raise LaunchRefusedError(CLUSTER, "partition down")

    inst.backend.on_start = refuse_first
    ex = inst.executor()
    first = await ex.run_pass(JOB)
    assert first.follow_up
    assert first.planned_seq < inst.last(JOB)
    second = await ex.run_pass(JOB)
    assert not second.follow_up
    assert [launch.attempt for launch in inst.backend.started] == [2]


async def test_a_recovery_is_counted_by_the_cause_that_ended_the_execution() -> None:
    """``dispatch_supervisor_recoveries_total{cause}`` (the dashboard's recoveries by cause,
    issue 16): one per submission a recovery rule opens, labelled with the cause kind."""
    inst = Installation()
    inst.submit(policy=RecoveryPolicy(rules=(rule(CauseKind.PREEMPTED, budget=2),)))
    registry = CollectorRegistry()
    ex = inst.executor(registry=registry)
    await ex.run_pass(JOB)
    preempted = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="")
    await inst.show(_obj("1", ObjectPhase.ENDED, cause=preempted))
    while (await ex.run_pass(JOB)).follow_up:
        pass
    sample = "dispatch_supervisor_recoveries_total"
    assert registry.get_sample_value(sample, {"cause": "preempted"}) == 1.0
    assert [launch.submission for launch in inst.backend.started] == [1, 2]


async def test_an_unreachable_start_is_tried_again_then_recorded_unknown() -> None:
    """The core's unknown-launch policy (StartRetry): nothing was created, so the same start
    is tried again until ``launch_retry_s``; then the outcome is unknown, with its detail."""
    inst = Installation()
    inst.submit()
    tries: list[int] = []

    async def unreachable(launch: Launch) -> None:
        tries.append(launch.attempt)
        raise Unreachable(CLUSTER, "connection refused")

    inst.backend.on_start = unreachable
    await inst.executor(launch_retry_s=1.0).run_pass(JOB)
    assert len(tries) >= 2
    assert set(tries) == {1}  # the same attempt each time
    unknown = inst.events(JOB)[-1]
    assert isinstance(unknown, LaunchUnknown)
    assert unknown.detail.startswith("scheduler unreachable for 1 s: ")
    assert "connection refused" in unknown.detail


async def test_a_start_that_fails_unclassified_is_unknown_never_failed() -> None:
    """DESIGN.md section 5: whatever went wrong, an object may exist."""
    inst = Installation()
    inst.submit()

    async def crash(launch: Launch) -> None:
        raise RuntimeError("the client library broke")

    inst.backend.on_start = crash
    await inst.executor().run_pass(JOB)
    unknown = inst.events(JOB)[-1]
    assert isinstance(unknown, LaunchUnknown)
    assert unknown.detail == "RuntimeError: the client library broke"


async def test_a_conflicting_append_makes_the_pass_plan_again() -> None:
    """Another writer cancels the job between the pass's read and its commit: the pass's
    decisions (open submission 1, launch it) are never carried out."""
    inst = Installation()
    inst.submit()
    cancelled = False

    async def cancel_first(job_id: str) -> None:
        nonlocal cancelled
        if not cancelled:
            cancelled = True
            inst.write(
                job_id, *decide(inst.job(), Cancel(by=ALICE, reason="no"), datetime.now(UTC))
            )

    inst.records.before_append = cancel_first
    ex = inst.executor()
    outcome = await ex.run_pass(JOB)
    assert inst.backend.started == []
    assert _tags(inst) == ["job.created", "cancel.requested", "outcome.committed"]
    assert outcome.settled
    assert inst.status().state is State.CANCELLED


@pytest.mark.parametrize("same_writer", [False, True])
async def test_racing_replicas_launch_an_attempt_once(same_writer: bool) -> None:
    """Two replicas plan from the same version and decide the same launch. With a writer
    token each, the loser gets a conflict and re-plans (one launch). With one token for
    both (which is what the bare step key as msg id amounts to), the record store takes the
    winner's stored intent for the loser's own, and the loser launches the attempt again:
    why decisions' msg ids carry the writer's token (docs/runtime.md)."""
    inst = Installation()
    inst.submit()

    async def slow(launch: Launch) -> None:
        await asyncio.sleep(0.01)

    inst.backend.on_start = slow
    writers = ("w", "w") if same_writer else (None, None)
    a, b = (inst.executor(writer=w) for w in writers)
    await asyncio.gather(a.run_pass(JOB), b.run_pass(JOB))
    intents = [e for e in inst.events(JOB) if isinstance(e, LaunchIntended)]
    assert len(intents) == 1
    assert len(inst.backend.started) == (2 if same_writer else 1)


async def test_a_fact_another_writer_made_moot_is_dropped() -> None:
    """While the backend starts the object, another replica finds it in a Discovery and
    records the launch: this pass's own LaunchRecorded would make the record malformed, so
    it is dropped."""
    inst = Installation()
    inst.submit()

    async def found_meanwhile(launch: Launch) -> None:
        inst.write(
            JOB,
            LaunchRecorded(
                job_id=JOB,
                at=datetime.now(UTC),
                submission=1,
                attempt=1,
                ref=ObjectRef(cluster=CLUSTER, id="1"),
                found=True,
            ),
        )

    inst.backend.on_start = found_meanwhile
    outcome = await inst.executor().run_pass(JOB)
    recorded = [e for e in inst.events(JOB) if isinstance(e, LaunchRecorded)]
    assert [r.found for r in recorded] == [True]
    assert outcome.appended == 2  # submission and intent; the fact was moot
    inst.job()  # the record still folds


class Inbox:
    """A deliver function that records each call and fails while ``failing``."""

    def __init__(self, *, failing: bool = False) -> None:
        self.calls: list[str] = []
        self.failing = failing

    async def __call__(self, job_id: str, escalation: Escalation) -> None:
        self.calls.append(escalation.id)
        if self.failing:
            raise ConnectionError("pager down")


async def _run_to_launched(inst: Installation, ex: PassExecutor) -> None:
    await ex.run_pass(JOB)
    await inst.show(_obj("1", ObjectPhase.PENDING, gate=GateState.CLOSED))
    await ex.run_pass(JOB)
    assert inst.backend.opened == [ObjectRef(cluster=CLUSTER, id="1")]
    await inst.show(_obj("1", ObjectPhase.RUNNING))
    await ex.run_pass(JOB)


_EXIT_3 = Cause(
    kind=CauseKind.NON_ZERO_EXIT, provenance=Provenance.APPLICATION, detail="exit 3", exit_code=3
)


@pytest.mark.parametrize("failing", [False, True])
async def test_the_settling_pass_last_look_delivers_once(failing: bool) -> None:
    """Seed 002: the escalation the settling pass committed is delivered by the last look;
    a failure is not offered again once the job has settled."""
    inst = Installation()
    inst.submit()
    inbox = Inbox(failing=failing)
    ex = inst.executor(deliver=inbox)
    await _run_to_launched(inst, ex)
    await inst.show(_obj("1", ObjectPhase.ENDED, cause=_EXIT_3))
    outcome = await ex.run_pass(JOB)
    assert outcome.settled
    assert inbox.calls == ["failed:non-zero-exit"]
    delivered = [e for e in inst.events(JOB) if isinstance(e, EscalationDelivered)]
    assert len(delivered) == (0 if failing else 1)
    for _ in range(2):  # the job is settled: no more deliveries
        again = await ex.run_pass(JOB)
        assert again.settled
        assert again.appended == 0
    assert inbox.calls == ["failed:non-zero-exit"]
    assert inst.status().state is State.FAILED


async def test_an_escalation_is_delivered_after_the_next_pass() -> None:
    """Seed 002: "An escalation the pass itself committed is delivered after the next
    pass"; one whose delivery failed is offered again after the next pass."""
    inst = Installation()
    inst.submit()
    inbox = Inbox(failing=True)
    ex = inst.executor(deliver=inbox)
    await _run_to_launched(inst, ex)
    await inst.show(_obj("1", ObjectPhase.RUNNING), _obj("9", ObjectPhase.RUNNING, submission=None))
    first = await ex.run_pass(JOB)
    assert inst.job().escalation("foreign:9") is not None
    assert inbox.calls == []
    assert not first.settled
    await ex.run_pass(JOB)
    assert inbox.calls == ["foreign:9"]
    inbox.failing = False
    await ex.run_pass(JOB)
    assert inbox.calls == ["foreign:9", "foreign:9"]
    escalation = inst.job().escalation("foreign:9")
    assert escalation is not None
    assert escalation.delivered is not None
    await ex.run_pass(JOB)
    assert inbox.calls == ["foreign:9", "foreign:9"]


async def test_a_status_is_never_published_over_a_newer_records_status() -> None:
    inst = Installation()
    inst.submit()
    newer = Status(
        job_id=JOB,
        level=Level.FULL,
        state=State.RUNNING,
        cause=Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER),
        at=datetime.now(UTC),
        seq=10**9,
    )
    await inst.statuses.put((JOB,), encode(newer))
    await inst.executor().run_pass(JOB)
    assert inst.status().seq == 10**9
    assert inst.statuses.puts == 1


# -- planning from the cached fold without a read (issue 11) ----------------------------------


class _CountingReads:
    """The installation's record store, counting reads."""

    def __init__(self, inst: Installation) -> None:
        self.reads = 0
        self._read = inst.records.read

        async def read(job_id: str, after_seq: int = 0) -> list[object]:
            self.reads += 1
            return await self._read(job_id, after_seq)  # type: ignore[return-value]

        inst.records.read = read  # type: ignore[method-assign,assignment]


def _preempted(object_id: str, submission: int = 1) -> ObservedObject:
    preempted = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="p")
    return _obj(object_id, ObjectPhase.ENDED, cause=preempted, submission=submission)


async def test_a_current_cache_commits_its_decisions_without_reading_first() -> None:
    """The recovery pass plans from the fold the executor cached (its own appends made it);
    the commit's expected last seq proves it current: no read. A pass that commits nothing
    (opening a gate) reads what is new first."""
    inst = Installation()
    inst.submit(policy=RecoveryPolicy(rules=(rule(CauseKind.PREEMPTED, budget=2),)))
    ex = inst.executor()
    counting = _CountingReads(inst)
    await ex.run_pass(JOB)  # launch 1: a cold cache is read
    assert counting.reads == 1
    await inst.show(_obj("1", ObjectPhase.PENDING, gate=GateState.CLOSED))
    await ex.run_pass(JOB)  # open the gate: nothing to commit, so read first
    assert inst.backend.opened == [ObjectRef(cluster=CLUSTER, id="1")]
    assert counting.reads == 2
    await inst.show(_preempted("1"))
    outcome = await ex.run_pass(JOB)  # recovery decisions and launch 2: no read
    assert counting.reads == 2
    assert [launch.submission for launch in inst.backend.started] == [1, 2]
    assert outcome.seq == inst.last(JOB)
    assert ex.cached(JOB) == inst.job()  # the cache is the record, folded


async def test_an_unread_cache_never_opens_a_gate_over_a_hold_the_record_holds() -> None:
    """A person held the job after the executor's last pass, and nothing told the executor
    (another replica took the append's delivery): planned from the cache alone the pass
    would open the gate; it commits nothing, so it reads first, and keeps the gate shut."""
    inst = Installation()
    inst.submit()
    ex = inst.executor()
    await ex.run_pass(JOB)
    inst.write(JOB, *decide(inst.job(), HoldCommand(by=ALICE, reason="look"), datetime.now(UTC)))
    await inst.show(_obj("1", ObjectPhase.PENDING, gate=GateState.CLOSED))
    outcome = await ex.run_pass(JOB)
    assert inst.backend.opened == []
    assert outcome.seq == inst.last(JOB)
    assert inst.status().hold is not None


async def test_an_unread_cache_that_lost_the_race_plans_again_on_the_record() -> None:
    """The job was cancelled after the executor's last pass, unknown to it; its object is
    then preempted. Planned from the cache, the pass decides a recovery; the commit
    conflicts (expected last seq: the cache's), so it re-reads and re-plans: no relaunch."""
    inst = Installation()
    inst.submit(policy=RecoveryPolicy(rules=(rule(CauseKind.PREEMPTED, budget=2),)))
    registry = CollectorRegistry()
    ex = inst.executor(registry=registry)
    await ex.run_pass(JOB)
    inst.write(JOB, *decide(inst.job(), Cancel(by=ALICE, reason="no"), datetime.now(UTC)))
    await inst.show(_preempted("1"))
    while (await ex.run_pass(JOB)).follow_up:
        pass
    assert [launch.submission for launch in inst.backend.started] == [1]
    assert any(isinstance(e, OutcomeCommitted) for e in inst.events())
    assert inst.status().state is State.CANCELLED
    assert (
        registry.get_sample_value("dispatch_supervisor_conflicts_total", {"what": "decision"})
        == 1.0
    )


async def test_an_append_noted_makes_the_next_pass_read_before_planning() -> None:
    """The replica was told of another writer's append (its record delivery, or a Status of
    a later record seq): the next pass reads first and loses no race."""
    inst = Installation()
    inst.submit(policy=RecoveryPolicy(rules=(rule(CauseKind.PREEMPTED, budget=2),)))
    registry = CollectorRegistry()
    ex = inst.executor(registry=registry)
    await ex.run_pass(JOB)
    inst.write(JOB, *decide(inst.job(), Cancel(by=ALICE, reason="no"), datetime.now(UTC)))
    ex.note_appended(JOB, inst.last(JOB))
    await inst.show(_preempted("1"))
    while (await ex.run_pass(JOB)).follow_up:
        pass
    assert [launch.submission for launch in inst.backend.started] == [1]
    assert not registry.get_sample_value(
        "dispatch_supervisor_conflicts_total", {"what": "decision"}
    )


# -- a Status published without an ack, its echo taken for the ack (issue 11) -----------------


def _echoing(inst: Installation, ex: PassExecutor) -> None:
    """Bring every stored Status back to ``ex``, as the replica's status watch does."""
    inst.statuses.watchers.append(lambda entry: ex.note_status(entry.key[-1], entry))


async def test_a_status_is_published_without_an_ack_and_its_echo_confirms_it() -> None:
    inst = Installation()
    inst.submit()
    ex = inst.executor(status_echo_s=30.0)
    _echoing(inst, ex)
    outcome = await ex.run_pass(JOB)
    assert inst.statuses.published == 1
    assert inst.statuses.puts == 1  # the fake's store of that publish: no acked put
    assert outcome.status is not None
    assert inst.status() == outcome.status
    await ex.run_pass(JOB)  # nothing changed: nothing published
    assert inst.statuses.published == 1


async def test_the_echo_of_a_pass_s_own_status_is_not_decoded_again() -> None:
    """Issue 11 (speed): the bytes that come back are the ones the pass encoded, so the
    watch takes the pass's Status as it is, and what it compares the next Status with."""
    inst = Installation()
    inst.submit()
    ex = inst.executor(status_echo_s=30.0)
    seen: list[Status | None] = []
    inst.statuses.watchers.append(lambda entry: seen.append(ex.note_status(entry.key[-1], entry)))
    outcome = await ex.run_pass(JOB)
    assert outcome.status is not None
    assert seen == [outcome.status]
    assert seen[0] is outcome.status  # not a decoded copy
    await ex.run_pass(JOB)  # nothing changed: nothing published
    assert inst.statuses.published == 1


async def test_a_status_whose_echo_never_comes_is_put_acked() -> None:
    """No watch brings it back (not following yet, a reconnect): after ``status_echo_s``
    the same put is sent acked; the first copy was stored, so that one conflicts, the
    Status is read and found current: one Status, the pass's."""
    inst = Installation()
    inst.submit()
    ex = inst.executor(status_echo_s=0.05)
    outcome = await ex.run_pass(JOB)
    assert inst.statuses.published == 1
    assert outcome.status is not None
    assert inst.status().seq == outcome.status.seq == inst.last(JOB)
    assert inst.statuses.puts == 1


@pytest.mark.parametrize("newer", [True, False])
async def test_a_status_refused_for_another_writers_is_decided_again(newer: bool) -> None:
    """Another replica's Status lands between this pass's read of the status stream and its
    publish: the publish is refused and the echo is the other's value. Of a newer record,
    it is left there; of an older one (a replica behind), the pass's Status replaces it."""
    inst = Installation()
    inst.submit()
    ex = inst.executor(status_echo_s=30.0)
    _echoing(inst, ex)
    await ex.run_pass(JOB)
    other = Status(
        job_id=JOB,
        level=Level.FULL,
        state=State.RUNNING,
        cause=Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER),
        at=datetime.now(UTC),
        seq=10**9 if newer else 1,
    )
    publish = inst.statuses.publish
    raced: list[bool] = []

    async def another_first(key: tuple[str, ...], payload: bytes, **kw: object) -> None:
        if not raced:
            raced.append(True)
            await inst.statuses.put(key, encode(other))  # lands first, unseen by the pass
        await publish(key, payload, **kw)  # type: ignore[arg-type]

    inst.statuses.publish = another_first  # type: ignore[method-assign]
    await inst.show(_obj("1", ObjectPhase.PENDING, gate=GateState.CLOSED))
    outcome = await ex.run_pass(JOB)
    assert inst.backend.opened == [ObjectRef(cluster=CLUSTER, id="1")]
    assert inst.status().seq == (10**9 if newer else outcome.seq)
    assert outcome.seq == inst.last(JOB)


async def test_a_pass_whose_read_misses_the_append_that_woke_it_fails_retryably(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record consumer delivered the API's ``job.created``, but the read misses it:
    the stream's leader applies an append after a follower whose consumer delivered it
    (the chaos test, a loaded box: "no record", the delivery acked, the job never
    supervised). The pass fails retryably (its delivery comes again) and the next one,
    reading it, launches."""
    inst = Installation()
    inst.submit()
    executor = inst.executor()
    entries = await inst.records.read(JOB)
    executor.note_appended(JOB, entries[-1].seq)  # what the record delivery says
    read = inst.records.read

    async def behind(job_id: str, after_seq: int = 0) -> list[RecordEntry]:
        return []

    monkeypatch.setattr(inst.records, "read", behind)
    with pytest.raises(StaleRead):
        await executor.run_pass(JOB)
    assert await read(JOB) == entries  # nothing was decided from the stale read
    monkeypatch.setattr(inst.records, "read", read)
    outcome = await executor.run_pass(JOB)
    assert outcome.found
    assert any(isinstance(e, LaunchIntended) for e in inst.events(JOB)), inst.events(JOB)

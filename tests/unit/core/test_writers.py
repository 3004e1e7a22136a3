"""Writer kinds: the table of who may write each event type, and ``fold``'s refusal of an event
its writer may not write (issue 10, "Writer kinds"; DESIGN.md section 5)."""

from __future__ import annotations

import typing
from datetime import timedelta

import pytest
from hypothesis import given

from dispatch_core import (
    SUPERVISOR,
    WRITERS,
    Abandon,
    Abandoned,
    AbandonTarget,
    Action,
    Cancel,
    CancelRequested,
    CauseKind,
    EmergencyStop,
    EmergencyStopRequested,
    EscalationCommitted,
    EscalationDelivered,
    GateOpened,
    GaveUp,
    GiveUp,
    HoldCommand,
    HoldHow,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    JobCreated,
    JobEvent,
    LaunchIntended,
    MalformedRecord,
    ObjectRef,
    OperatorCommand,
    OutcomeCommitted,
    Refused,
    Release,
    Resubmit,
    State,
    SubmissionOpened,
    SubmissionWhy,
    Supersede,
    Superseded,
    WriterKind,
    WriterRefused,
    decide,
    fold,
    may_write,
    writers_of,
)
from dispatch_core.errors import InvalidPolicy
from tests.unit.core.helpers import ALICE, CLUSTER, T0, Sim, cause, committed, rule, start
from tests.unit.core.strategies import Record, commands, records
from tests.util import written

API, SUP, NOTIFIER = WriterKind.API, WriterKind.SUPERVISOR, WriterKind.NOTIFIER
EVENT_TYPES: tuple[type[JobEvent], ...] = typing.get_args(JobEvent)


def _hold(kind: HoldKind) -> HoldPlaced:
    return HoldPlaced(
        job_id="j1",
        at=T0,
        instance=1,
        kind=kind,
        by=ALICE if kind is HoldKind.ACTOR else SUPERVISOR,
        reason="r",
        deadline=T0 + timedelta(hours=1),
    )


def _released(how: str) -> HoldReleased:
    return HoldReleased(job_id="j1", at=T0, instance=1, by=ALICE, how=HoldHow(how))


def _opened(why: str) -> SubmissionOpened:
    return SubmissionOpened(job_id="j1", at=T0, submission=1, why=SubmissionWhy(why))


# -- the table ----------------------------------------------------------------------------


def test_writer_kinds_are_the_closed_list_of_the_contract() -> None:
    assert [k.value for k in WriterKind] == ["api", "supervisor", "notifier"]


def test_every_event_type_has_a_rule() -> None:
    assert set(WRITERS) == set(EVENT_TYPES)


@pytest.mark.parametrize(
    "event_type",
    [JobCreated, CancelRequested, GaveUp, Abandoned, EmergencyStopRequested, Superseded],
)
def test_what_a_person_decided_has_the_api_as_its_only_writer(
    event_type: type[JobEvent],
) -> None:
    assert WRITERS[event_type] == frozenset({API})


@pytest.mark.parametrize(
    ("event", "writers"),
    [
        (_hold(HoldKind.ACTOR), {API}),
        (_hold(HoldKind.RECOVERY), {SUP}),
        (_released("release"), {API}),
        (_released("resubmit"), {API}),
        (_released("cancel"), {API}),
        (_released("give-up"), {API}),
        (_released("outcome"), {SUP}),
        (_released("replaced"), {SUP}),
        (_released("ceased"), {SUP}),
        (_opened("resubmit"), {API}),
        (_opened("initial"), {SUP}),
        (_opened("recovery"), {SUP}),
        (_opened("abandoned"), {SUP}),
        (_opened("ceased"), {SUP}),
    ],
    ids=lambda v: getattr(v, "kind", None) or getattr(v, "how", None) or getattr(v, "why", ""),
)
def test_the_table_looks_at_the_field_that_says_who_decided(
    event: JobEvent, writers: set[WriterKind]
) -> None:
    assert writers_of(event) == writers


def test_the_api_commits_only_the_outcomes_and_escalation_a_command_does() -> None:
    def outcome(state: State) -> OutcomeCommitted:
        return OutcomeCommitted(job_id="j1", at=T0, state=state, cause=cause(CauseKind.NONE))

    assert writers_of(outcome(State.CANCELLED)) == {API, SUP}
    assert writers_of(outcome(State.FAILED)) == {API, SUP}
    assert writers_of(outcome(State.SUCCEEDED)) == {SUP}
    give_up = EscalationCommitted(job_id="j1", at=T0, id="give-up", detail="x")
    assert writers_of(give_up) == {API, SUP}
    overdue = EscalationCommitted(job_id="j1", at=T0, id="overdue:1", detail="x")
    assert writers_of(overdue) == {SUP}


def test_the_notifier_writes_only_deliveries() -> None:
    for event_type, rule_ in WRITERS.items():
        kinds = (
            rule_ if isinstance(rule_, frozenset) else rule_.otherwise.union(*rule_.cases.values())
        )
        assert (NOTIFIER in kinds) == (event_type is EscalationDelivered), event_type


def test_a_delivery_may_come_from_the_notifier_or_an_in_process_supervisor() -> None:
    delivered = EscalationDelivered(job_id="j1", at=T0, id="give-up")
    assert writers_of(delivered) == {NOTIFIER, SUP}
    assert not may_write(API, delivered)


@given(records(), commands)
def test_the_api_may_write_everything_an_operator_command_commits(
    record: Record, command: OperatorCommand
) -> None:
    job = fold(written(record), T0)
    try:
        events = decide(job, command, job.created_at + timedelta(days=30))
    except (Refused, InvalidPolicy):
        return
    for event in events:
        assert may_write(API, event), event
        assert not may_write(NOTIFIER, event), event


def _recovery_held() -> Sim:
    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD, hold_for_s=3600.0))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.OUT_OF_MEMORY))
    sim.step()
    hold = sim.job.hold
    assert hold is not None
    assert hold.kind is HoldKind.RECOVERY
    return sim


def test_the_api_is_the_only_writer_of_operator_commands() -> None:
    """What a command commits is the API's alone, except the outcome (and give-up's
    escalation), which a supervisor commits of its own too."""
    sim = _recovery_held()
    shared = (OutcomeCommitted, EscalationCommitted)
    foreign = AbandonTarget(foreign=ObjectRef(cluster=CLUSTER, id="9"))
    for command in (
        Resubmit(by=ALICE, reason="again"),
        GiveUp(by=ALICE, reason="enough"),
        Cancel(by=ALICE, reason="stop"),
        EmergencyStop(by=ALICE, reason="now"),
        Abandon(by=ALICE, reason="not ours", target=foreign),
    ):
        events = decide(sim.job, command, sim.now)
        assert events
        for event in events:
            expected = {API, SUP} if isinstance(event, shared) else {API}
            assert writers_of(event) == expected, (command, event)
    actor = Sim()
    start(actor)
    (placed,) = decide(actor.job, HoldCommand(by=ALICE, reason="look", for_s=60.0), actor.now)
    assert writers_of(placed) == {API}
    actor.record.append([placed])
    (released,) = decide(actor.job, Release(by=ALICE, reason="ok"), actor.now)
    assert writers_of(released) == {API}
    actor.command(Cancel(by=ALICE, reason="done"))
    new, superseded = decide(actor.job, Supersede(by=ALICE, new_job_id="next"), actor.now)
    assert writers_of(new) == {API}
    assert writers_of(superseded) == {API}


def test_the_planner_writes_what_a_supervisor_may_write() -> None:
    """The planner's events are folded as the supervisor's (``next_steps`` applies them so):
    a recovery hold and its pass fold, and an actor's hold is never one it places."""
    sim = _recovery_held()
    for the_pass in sim.passes:
        for event in committed(the_pass):
            assert may_write(SUP, event), event


# -- fold's refusals: one per kind of forgery -----------------------------------------------


def _record() -> Sim:
    """A running job: created by the API, launched by a supervisor."""
    sim = Sim(rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD, hold_for_s=3600.0))
    start(sim)
    return sim


def _refused(sim: Sim, event: JobEvent, writer: WriterKind) -> WriterRefused:
    job = sim.job
    seq = job.seq + 1
    with pytest.raises(WriterRefused) as info:
        fold([(seq, event, writer)], sim.now, prior=job)
    err = info.value
    assert isinstance(err, MalformedRecord)
    assert (err.job_id, err.seq, err.writer) == (sim.job_id, seq, writer.value)
    assert f"record of job {sim.job_id!r}, event seq {seq}" in str(err)
    assert f"was appended by a {writer} writer, which may not write it" in str(err)
    assert err.event_type in str(err)
    return err


def test_a_notifier_cancel_is_refused() -> None:
    sim = _record()
    err = _refused(sim, CancelRequested(job_id="j1", at=sim.now, by=ALICE, reason="x"), NOTIFIER)
    assert err.event_type == "cancel.requested"
    assert err.allowed == ("api",)


def test_a_supervisor_cancel_is_refused() -> None:
    sim = _record()
    err = _refused(sim, CancelRequested(job_id="j1", at=sim.now, by=ALICE, reason="x"), SUP)
    assert err.event_type == "cancel.requested"


def test_a_notifier_escalation_is_refused() -> None:
    sim = _record()
    event = EscalationCommitted(job_id="j1", at=sim.now, id="give-up", detail="x")
    err = _refused(sim, event, NOTIFIER)
    assert err.allowed == ("api", "supervisor")


def test_an_api_escalation_other_than_give_up_is_refused() -> None:
    sim = _record()
    event = EscalationCommitted(job_id="j1", at=sim.now, id="overdue:1", detail="forged")
    assert _refused(sim, event, API).allowed == ("supervisor",)


def test_an_api_success_is_refused() -> None:
    sim = _record()
    event = OutcomeCommitted(
        job_id="j1", at=sim.now, state=State.SUCCEEDED, cause=cause(CauseKind.NONE)
    )
    assert _refused(sim, event, API).event_type == "outcome.committed"


def test_a_supervisor_actor_hold_is_refused() -> None:
    sim = _record()
    hold = HoldPlaced(
        job_id="j1",
        at=sim.now,
        instance=1,
        kind=HoldKind.ACTOR,
        by=ALICE,
        reason="pretending to be alice",
        deadline=sim.now + timedelta(hours=1),
    )
    assert _refused(sim, hold, SUP).event_type == "hold.placed"


def test_a_supervisor_release_of_a_persons_kind_is_refused() -> None:
    sim = _recovery_held()
    release = HoldReleased(job_id="j1", at=sim.now, instance=1, by=ALICE, how=HoldHow.RESUBMIT)
    assert _refused(sim, release, SUP).event_type == "hold.released"


def test_a_supervisor_resubmit_is_refused() -> None:
    sim = _recovery_held()
    opened = SubmissionOpened(
        job_id="j1", at=sim.now, submission=2, why=SubmissionWhy.RESUBMIT, by=ALICE
    )
    assert _refused(sim, opened, SUP).event_type == "submission.opened"


def test_an_api_launch_is_refused() -> None:
    sim = _record()
    intent = LaunchIntended(job_id="j1", at=sim.now, submission=1, attempt=2)
    assert _refused(sim, intent, API).allowed == ("supervisor",)


def test_an_api_delivery_is_refused() -> None:
    sim = _record()
    opened = GateOpened(job_id="j1", at=sim.now, ref=ObjectRef(cluster=CLUSTER, id="100"))
    _refused(sim, opened, API)
    delivered = EscalationDelivered(job_id="j1", at=sim.now, id="x")
    assert _refused(sim, delivered, API).allowed == ("notifier", "supervisor")


@pytest.mark.parametrize(
    "event_type", [GaveUp, EmergencyStopRequested], ids=["give-up", "emergency-stop"]
)
def test_a_notifier_decision_of_a_person_is_refused(event_type: type[GaveUp]) -> None:
    sim = _record()
    _refused(sim, event_type(job_id="j1", at=sim.now, by=ALICE, reason="x"), NOTIFIER)


def test_a_job_created_by_a_supervisor_is_refused_as_the_first_event() -> None:
    sim = _record()
    created = sim.record.events[0][1]
    assert isinstance(created, JobCreated)
    with pytest.raises(WriterRefused) as info:
        fold([(1, created, SUP)], sim.now)
    assert (info.value.job_id, info.value.seq, info.value.event_type) == ("j1", 1, "job.created")


def test_abandon_and_supersede_by_a_supervisor_are_refused() -> None:
    sim = _record()
    target = AbandonTarget(foreign=ObjectRef(cluster=CLUSTER, id="9"))
    _refused(sim, Abandoned(job_id="j1", at=sim.now, target=target, by=ALICE, reason="x"), SUP)
    _refused(sim, Superseded(job_id="j1", at=sim.now, new_job="j2", by=ALICE, reason="x"), SUP)


def test_the_same_events_from_their_writers_fold() -> None:
    sim = _recovery_held()
    job = sim.job
    release = HoldReleased(job_id="j1", at=sim.now, instance=1, by=ALICE, how=HoldHow.RESUBMIT)
    opened = SubmissionOpened(
        job_id="j1", at=sim.now, submission=2, why=SubmissionWhy.RESUBMIT, by=ALICE
    )
    after = fold([(job.seq + 1, release, API), (job.seq + 2, opened, API)], sim.now, prior=job)
    assert len(after.submissions) == 2
    delivered = EscalationDelivered(job_id="j1", at=sim.now, id="overdue:1")
    assert writers_of(delivered) == {SUP, NOTIFIER}

"""dispatch_core.supervision: the rules of one supervisor pass that are not the planner's own
(issue 11 item 1: "The pass is the core's"). The invariants over random walks are in
test_plan_properties.py (``test_plan_pass_*``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dispatch_core.backoff import Backoff
from dispatch_core.events import (
    CessationObserved,
    EscalationDelivered,
    GateOpened,
    JobEvent,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
)
from dispatch_core.state import CauseKind, ObjectRef
from dispatch_core.steps import AskCessation, Commit, Deliver, Launch, OpenGate, Stop
from dispatch_core.supervision import (
    PassPlan,
    Started,
    StartRefused,
    StartRetry,
    StartUnknown,
    StartUnreachable,
    cessation_observed,
    conclude,
    decisions,
    escalation_delivered,
    gate_opened,
    is_redundant,
    last_look,
    launch_fact,
    plan_pass,
)
from tests.unit.core.helpers import CLUSTER, Sim, cause, rule, start

REF = ObjectRef(cluster=CLUSTER, id="7")


def _failed_sim() -> Sim:
    """A running job whose execution just ended with a cause no rule covers: the next pass
    commits its end, the ``failed`` outcome and ``failed:<cause>``, and settles it."""
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.NON_ZERO_EXIT, exit_code=3))
    sim.tick(1)
    return sim


def _plan(sim: Sim, *, delivers: bool = True) -> PassPlan:
    return plan_pass(sim.job, sim.discovery(), sim.declarations, sim.now, delivers=delivers)


def test_decisions_are_the_commits_then_the_intents_of_stops_and_fresh_launches() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.PREEMPTED))
    sim.tick(1)
    plan = _plan(sim)
    expected = []
    for step in plan.steps:
        if isinstance(step, Commit):
            expected.append((step.key, step.event))
    for step in plan.steps:
        if isinstance(step, Stop) or (isinstance(step, Launch) and not step.resume):
            expected.append((step.key, step.intent))
    assert [(d.key, d.event) for d in plan.decisions] == expected
    assert any(isinstance(s, Launch) for s in plan.steps)  # the recovery launches
    assert decisions(plan.steps) == plan.decisions
    assert plan.after.seq == sim.job.seq + len(plan.decisions)
    assert plan.after.submission is not None
    assert plan.after.submission.number == 2


def test_the_settling_pass_takes_a_last_look_and_the_next_pass_delivers_nothing() -> None:
    """Seed 002: "when that pass settled the job, the supervisor's last look ... delivers it
    before Run returns ... once the job has settled, Run returns after one attempt"."""
    sim = _failed_sim()
    plan = _plan(sim)
    assert plan.settled
    assert plan.last_look
    assert [e.id for e in plan.after.escalations] == ["failed:non-zero-exit"]
    sim.step()  # committed; the channel did not accept it
    again = _plan(sim)
    assert again.settled
    assert not again.last_look
    assert again.steps == ()
    assert again.decisions == ()
    # The planner alone offers it again: the settled-at-start rule is plan_pass's.
    assert any(isinstance(s, Deliver) for s in sim.plan().steps)


def test_a_shell_that_does_not_deliver_gets_no_deliver_step_and_no_last_look() -> None:
    sim = _failed_sim()
    plan = _plan(sim, delivers=False)
    assert plan.settled
    assert not plan.last_look
    assert not any(isinstance(s, Deliver) for s in plan.steps)
    assert plan.decisions == _plan(sim).decisions


def test_last_look_offers_what_is_undelivered_and_was_not_offered() -> None:
    sim = _failed_sim()
    sim.step()
    job = sim.job
    (escalation,) = job.escalations
    assert last_look(job, set()) == (escalation,)
    assert last_look(job, {escalation.id}) == ()
    delivered = sim.job
    sim.record.append([EscalationDelivered(job_id=sim.job_id, at=sim.now, id=escalation.id)])
    assert last_look(sim.job, set()) == ()
    assert last_look(delivered, frozenset()) == (escalation,)


def test_a_pass_that_appended_nothing_asks_no_follow_up() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED))
    start(sim)
    sim.tick(1)
    plan = _plan(sim)
    end = conclude(plan, sim.job, sim.discovery(), sim.declarations, sim.now, appended=0)
    assert not end.follow_up
    assert (end.settled, end.wake_at, end.covered_seq) == (
        plan.settled,
        plan.wake_at,
        sim.job.seq,
    )


def test_a_refused_launch_asks_for_a_follow_up_pass_that_retries_it() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED))
    sim.launch_answer = "refused"
    plan = _plan(sim)
    launch = next(s for s in plan.steps if isinstance(s, Launch))
    sim.step()  # the decisions, then the LaunchRefused fact
    end = conclude(
        plan, sim.job, sim.discovery(), sim.declarations, sim.now, appended=len(plan.decisions) + 1
    )
    assert end.follow_up
    assert end.covered_seq == plan.planned_seq
    retried = _plan(sim)
    assert any(isinstance(s, Launch) and s.attempt == launch.attempt + 1 for s in retried.steps)


def test_a_launch_recorded_leaves_nothing_to_do_until_the_object_shows() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED))
    seen = sim.discovery()  # what the pass was planned with: no object yet
    plan = _plan(sim)
    sim.step()  # the sim's scheduler shows the object at once
    end = conclude(plan, sim.job, seen, sim.declarations, sim.now, appended=len(plan.decisions) + 1)
    assert not end.follow_up
    assert end.covered_seq == sim.job.seq


def test_is_redundant_holds_for_an_opened_gate_and_a_delivered_escalation_only() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED))
    obj = start(sim)  # its gate opened
    job = sim.job
    assert is_redundant(job, GateOpened(job_id=sim.job_id, at=sim.now, ref=obj.ref))
    assert not is_redundant(job, GateOpened(job_id=sim.job_id, at=sim.now, ref=REF))
    failed = _failed_sim()
    failed.step()
    (escalation,) = failed.job.escalations
    delivered = EscalationDelivered(job_id=failed.job_id, at=failed.now, id=escalation.id)
    assert not is_redundant(failed.job, delivered)
    failed.record.append([delivered])
    assert is_redundant(failed.job, delivered)
    ceased = CessationObserved(job_id=sim.job_id, at=sim.now, ref=obj.ref, ceased=True)
    assert not is_redundant(job, ceased)


def test_an_unreachable_start_is_tried_again_with_backoff_until_retry_s_then_is_unknown() -> None:
    policy = StartRetry(retry_s=2.0, backoff=Backoff(base_s=0.25, max_s=1.0, jitter=0.0))
    assert policy.delay(1, 0.0) == 0.25
    assert policy.delay(2, 0.25) == 0.5
    assert policy.delay(3, 0.75) == 1.0
    assert policy.delay(4, 1.75) is None  # 1.75 + 1.0 is past 2 s
    assert policy.detail("connection refused") == (
        "scheduler unreachable for 2 s: connection refused"
    )
    assert StartRetry().retry_s == 30.0  # the supervisor's default (--launch-retry-s)


def _launch(sim: Sim) -> Launch:
    return next(s for s in _plan(sim).steps if isinstance(s, Launch))


@pytest.mark.parametrize(
    ("outcome", "word", "detail"),
    [
        (Started(ref=REF), "recorded", None),
        (StartRefused(detail="sbatch: error"), "refused", "sbatch: error"),
        (StartUnknown(detail="timeout"), "unknown", "timeout"),
        (StartUnreachable(detail="no route"), "unknown", "scheduler unreachable for 5 s: no route"),
    ],
)
def test_the_fact_a_launch_outcome_commits(
    outcome: Started | StartRefused | StartUnknown | StartUnreachable,
    word: str,
    detail: str | None,
) -> None:
    sim = Sim(rule(CauseKind.PREEMPTED))
    step = _launch(sim)
    at = sim.now + timedelta(seconds=3)
    got, fact = launch_fact(step, outcome, at, retry=StartRetry(retry_s=5.0))
    assert got == word
    assert fact.key == f"{step.key}:{word}"
    n, a = step.submission, step.attempt
    expected: JobEvent
    if word == "recorded":
        expected = LaunchRecorded(job_id=sim.job_id, at=at, submission=n, attempt=a, ref=REF)
    elif word == "refused":
        expected = LaunchRefused(
            job_id=sim.job_id, at=at, submission=n, attempt=a, detail=detail or ""
        )
    else:
        expected = LaunchUnknown(
            job_id=sim.job_id, at=at, submission=n, attempt=a, detail=detail or ""
        )
    assert fact.event == expected


def test_the_facts_of_gates_answers_and_deliveries_keep_their_msg_id_keys() -> None:
    """The keys are the facts' Nats-Msg-Ids: every replica (and every version) must derive
    the same one, so a fact two writers append is stored once."""
    at = Sim().now
    gate = OpenGate(key="j1:open-gate:c1/7", ref=REF)
    assert gate_opened(gate, "j1", at).key == "j1:open-gate:c1/7:opened"
    assert gate_opened(gate, "j1", at).event == GateOpened(job_id="j1", at=at, ref=REF)
    ask = AskCessation(key="j1:ask:c1/7", ref=REF)
    answer = cessation_observed(ask, "j1", at, ceased=True, detail="no processes")
    assert answer.key == "j1:ask:c1/7:answer"
    assert answer.event == CessationObserved(
        job_id="j1", at=at, ref=REF, ceased=True, detail="no processes"
    )
    delivered = escalation_delivered("j1", "failed:oom", at, channel="pager")
    assert delivered.key == "j1:delivered:failed:oom"
    assert delivered.event == EscalationDelivered(
        job_id="j1", at=at, id="failed:oom", channel="pager"
    )

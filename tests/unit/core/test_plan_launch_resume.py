"""The planner completes a launch whose outcome a crash lost, on a backend whose start is
idempotent per attempt (issue 15, "Launches survive the launcher"; docs/core-semantics.md,
"Launches that survive the launcher"); ``all-unknown``/``unmatched`` stay for what no
backend can settle (seed 002)."""

from __future__ import annotations

from datetime import timedelta

from dispatch_core.commands import Cancel
from dispatch_core.events import LaunchIntended, LaunchRecorded, LaunchUnknown
from dispatch_core.job import LaunchOutcome
from dispatch_core.plan import RESUME_INTERVAL_S, next_steps
from dispatch_core.state import (
    CauseKind,
    Declarations,
    JobSpec,
    ObjectPhase,
    State,
    UnknownLaunchPolicy,
)
from dispatch_core.steps import Deliver, Launch, OpenGate, Stop
from tests.unit.core.helpers import (
    ALICE,
    CLUSTER,
    Sim,
    actions,
    committed,
    decisions,
    escalation_ids,
    facts,
    rule,
)

AGE_S = 600.0
IDEMPOTENT = Declarations(node_loss_window_s=300.0, idempotent_start=True)
NOT_IDEMPOTENT = Declarations(node_loss_window_s=300.0)


def _intents(sim: Sim) -> list[tuple[int, int]]:
    return [
        (e.submission, e.attempt) for _, e in sim.record.events if isinstance(e, LaunchIntended)
    ]


def _crashed_launch(declarations: Declarations, *, unresolved_age_s: float = AGE_S) -> Sim:
    """A job whose first launch intent is committed and whose supervisor died before the
    start's answer was recorded."""
    spec = JobSpec(cluster=CLUSTER, unresolved_age_s=unresolved_age_s)
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=declarations, spec=spec)
    sim.launch_answer = "lost"
    sim.step()
    assert sim.job.submissions[0].attempts[0].outcome is LaunchOutcome.UNKNOWN
    sim.launch_answer = "recorded"
    return sim


def test_a_launch_whose_answer_a_crash_lost_is_started_again_on_an_idempotent_backend() -> None:
    """The restarted supervisor starts the same attempt again (no new intent, the backend
    returns or makes its object), with the words of why in the record; the job runs. Not
    before RESUME_INTERVAL_S after the intent: a start in flight in a live supervisor is
    not started twice."""
    sim = _crashed_launch(IDEMPOTENT)
    assert sim.plan().wake_at == sim.now + timedelta(seconds=RESUME_INTERVAL_S)
    sim.tick(RESUME_INTERVAL_S - 1)
    assert not actions(sim.step(), Launch)
    sim.tick(1)

    p = sim.step()

    (resumed,) = actions(p, Launch)
    assert (resumed.submission, resumed.attempt, resumed.resume) == (1, 1, True)
    (unknown,) = committed(p, LaunchUnknown)
    assert "started again" in unknown.detail
    assert "its supervisor stopped" in unknown.detail
    assert resumed.intent.at == sim.job.submissions[0].attempts[0].intended_at
    assert LaunchIntended not in {type(e) for e in decisions(p)}
    assert _intents(sim) == [(1, 1)]
    job = sim.job
    assert job.submissions[0].attempts[0].outcome is LaunchOutcome.LAUNCHED
    p = sim.step()
    assert [s.ref for s in actions(p, OpenGate)] == [job.objects[0].ref]
    sim.tick(AGE_S * 2)
    assert escalation_ids(sim.step()) == []
    assert len(sim.objects) == 1


def test_an_object_the_cut_off_start_made_is_the_one_returned() -> None:
    """The crashed start did make the object, and discovery has not shown it yet: the
    second start returns it (idempotent), never a second object."""
    sim = _crashed_launch(IDEMPOTENT)
    sim.tick(RESUME_INTERVAL_S)
    made = sim.own(1, 1)
    sim.objects.clear()  # not shown yet
    sim.objects[made.ref] = made  # the scheduler has it; the sim's start will find it
    p = sim.step(discovery=False)
    assert [s.resume for s in actions(p, Launch)] == [True]
    assert sim.job.objects[0].ref == made.ref
    assert len(sim.objects) == 1


def test_a_supervisor_down_past_the_unresolved_age_resumes_instead_of_escalating() -> None:
    """The unresolved age ran out while no supervisor ran: the launch is started again
    first, and nobody is asked to abandon it when that start settles it."""
    sim = _crashed_launch(IDEMPOTENT)
    sim.tick(AGE_S * 3)

    p = sim.step()

    assert escalation_ids(p) == []
    assert [s.resume for s in actions(p, Launch)] == [True]
    sim.tick(AGE_S)
    assert escalation_ids(sim.step()) == []
    assert sim.job.escalations == ()


def test_a_start_that_came_back_unknown_is_started_again_after_the_interval() -> None:
    """Policy ``wait``: an unknown answer is asked again every RESUME_INTERVAL_S (never in
    a loop), and the record keeps the backend's words."""
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=IDEMPOTENT)
    sim.launch_answer = "unknown"
    sim.step()
    assert sim.plan().wake_at == sim.now + timedelta(seconds=RESUME_INTERVAL_S)
    sim.tick(RESUME_INTERVAL_S - 1)
    assert not actions(sim.step(), Launch)

    sim.tick(1)
    p = sim.step()
    (resumed,) = actions(p, Launch)
    assert resumed.resume
    (unknown,) = committed(p, LaunchUnknown)
    assert "timeout after 30 s" in unknown.detail  # the earlier start's words
    assert p.wake_at == sim.now + timedelta(seconds=RESUME_INTERVAL_S)

    sim.launch_answer = "recorded"
    sim.tick(RESUME_INTERVAL_S)
    sim.step()
    assert sim.job.submissions[0].attempts[0].outcome is LaunchOutcome.LAUNCHED
    assert _intents(sim) == [(1, 1)]


def test_a_scheduler_that_never_answers_still_escalates_all_unknown() -> None:
    """Started again every interval, the launch stays unknown while the scheduler keeps
    not answering; after the unresolved age a person is asked (seed 002)."""
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=IDEMPOTENT)
    sim.launch_answer = "unknown"
    sim.step()
    ids: list[str] = []
    for _ in range(int(AGE_S / RESUME_INTERVAL_S) + 1):
        sim.tick(RESUME_INTERVAL_S)
        ids += escalation_ids(sim.step())
    assert ids == ["all-unknown:1"]
    assert _intents(sim) == [(1, 1)]


def test_planning_again_after_a_resume_gives_nothing_new() -> None:
    """docs/core-semantics.md: once a pass's commits are in the record, planning again with
    the same discovery and now gives nothing but Deliver, even while the resumed start is
    still in flight."""
    sim = _crashed_launch(IDEMPOTENT)
    sim.tick(RESUME_INTERVAL_S)
    p = sim.plan()
    assert actions(p, Launch)
    sim.record.append(decisions(p))
    sim.record.append(facts(p, sim.now))  # the resumed start has not answered
    again = next_steps(sim.job, sim.discovery(), sim.declarations, sim.now)
    assert [s for s in again.steps if not isinstance(s, Deliver)] == []


def test_under_policy_relaunch_a_resume_in_flight_is_not_relaunched_beside() -> None:
    """Found by the planner's idempotence property: the resume commits ``LaunchUnknown``
    (started again), and policy ``relaunch`` took that for a start that came back unknown,
    so planning again launched attempt 2 while attempt 1's resumed start could still make
    its object: two objects for one submission. A resumed attempt is answered by its own
    start; only that answer (unknown, refused) lets ``relaunch`` go on."""
    spec = JobSpec(cluster=CLUSTER, on_unknown_launch=UnknownLaunchPolicy.RELAUNCH)
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=IDEMPOTENT, spec=spec)
    sim.launch_answer = "lost"
    sim.step()
    sim.tick(RESUME_INTERVAL_S)
    p = sim.plan()
    assert [(s.attempt, s.resume) for s in actions(p, Launch)] == [(1, True)]
    sim.record.append(decisions(p))
    sim.record.append(facts(p, sim.now))  # the resumed start has not answered
    again = next_steps(sim.job, sim.discovery(), sim.declarations, sim.now)
    assert [s for s in again.steps if not isinstance(s, Deliver)] == []

    # Once the resumed start answers unknown after all, relaunch goes on with attempt 2.
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=IDEMPOTENT, spec=spec)
    sim.launch_answer = "lost"
    sim.step()
    sim.tick(RESUME_INTERVAL_S)
    sim.launch_answer = "unknown"
    assert [(s.attempt, s.resume) for s in actions(sim.step(), Launch)] == [(1, True)]
    sim.launch_answer = "recorded"
    assert [(s.attempt, s.resume) for s in actions(sim.step(), Launch)] == [(2, False)]


def test_a_relaunch_policy_launches_the_next_attempt_and_leaves_the_earlier_unmatched() -> None:
    """Policy ``relaunch`` after an unknown answer launches attempt 2 (seed 002); starting
    attempt 1 again would make a duplicate of it, so it stays ``unmatched:1/1`` for a person
    when no object turns up."""
    spec = JobSpec(cluster=CLUSTER, on_unknown_launch=UnknownLaunchPolicy.RELAUNCH)
    sim = Sim(rule(CauseKind.PREEMPTED), declarations=IDEMPOTENT, spec=spec)
    sim.launch_answer = "unknown"
    sim.step()
    sim.launch_answer = "recorded"
    p = sim.step()
    assert [(s.attempt, s.resume) for s in actions(p, Launch)] == [(2, False)]
    sim.tick(AGE_S)
    assert "unmatched:1/1" in escalation_ids(sim.step())


def test_a_cancelled_job_whose_launch_was_cut_off_settles_without_a_person() -> None:
    """Cancelled while its launch's answer was lost: the start is completed (its gate stays
    closed), the object is stopped, and the record settles without an all-unknown."""
    sim = _crashed_launch(IDEMPOTENT)
    sim.tick(RESUME_INTERVAL_S)
    sim.command(Cancel(by=ALICE, reason="r"))
    p = sim.step()
    assert [s.resume for s in actions(p, Launch)] == [True]
    assert not actions(p, OpenGate)
    p = sim.step()
    assert len(actions(p, Stop)) == 1
    sim.settle_stops()
    sim.step()
    status = sim.status()
    assert status.state is State.CANCELLED
    assert status.settled
    sim.tick(AGE_S * 4)
    assert sim.job.escalations == ()


def test_a_backend_that_cannot_find_a_launch_leaves_it_to_a_person() -> None:
    """Without ``idempotent_start`` (a scheduler that can't find a launch's object) a second
    start could be a second object: the launch whose answer was lost is never started again,
    and after the unresolved age ``all-unknown:1`` asks a person (seed 002)."""
    sim = _crashed_launch(NOT_IDEMPOTENT)
    sim.tick(RESUME_INTERVAL_S)
    assert not actions(sim.step(), Launch)
    sim.tick(AGE_S)
    assert escalation_ids(sim.step()) == ["all-unknown:1"]
    assert _intents(sim) == [(1, 1)]
    assert not sim.objects


def test_an_object_shown_for_the_attempt_is_found_not_started_again() -> None:
    """Discovery shows the object the cut-off start made: it is recorded found (seed 002),
    and nothing is started."""
    sim = _crashed_launch(IDEMPOTENT)
    obj = sim.own(1, 1, phase=ObjectPhase.PENDING)
    p = sim.step()
    assert not actions(p, Launch)
    (found,) = committed(p, LaunchRecorded)
    assert (found.ref, found.found) == (obj.ref, True)


def test_an_unresolved_age_shorter_than_the_interval_waits_for_the_resumed_start() -> None:
    """A cut-off launch is not escalated before its start was asked again: an unresolved
    age shorter than RESUME_INTERVAL_S must not ask a person about a launch the backend
    settles."""
    sim = _crashed_launch(IDEMPOTENT, unresolved_age_s=3.0)
    sim.tick(5)
    p = sim.step()
    assert escalation_ids(p) == []
    assert p.wake_at == sim.now + timedelta(seconds=RESUME_INTERVAL_S - 5)
    sim.tick(RESUME_INTERVAL_S - 5)
    sim.launch_answer = "unknown"  # and this start's answer is unknown too
    p = sim.step()
    assert escalation_ids(p) == []
    assert [s.resume for s in actions(p, Launch)] == [True]
    sim.tick(1)
    assert escalation_ids(sim.step()) == ["all-unknown:1"]  # the backend could not settle it

"""Progress-aware recovery (issue 14, part 1): ``free_if_progress`` and
``max_without_progress``, through the planner (examples) and the budget arithmetic of
:mod:`dispatch_core.progress` (hypothesis properties).
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_core.codec import decode_event, encode
from dispatch_core.commands import Resubmit
from dispatch_core.errors import InvalidPolicy
from dispatch_core.escalations import ESCALATIONS, EscalationKind
from dispatch_core.events import (
    HoldPlaced,
    JobEvent,
    OutcomeCommitted,
    ProgressObserved,
    RecoveryCommitted,
    SubmissionOpened,
)
from dispatch_core.policy import make_plan, validate
from dispatch_core.progress import Verdict, observe, verdict
from dispatch_core.state import (
    Action,
    Cause,
    CauseKind,
    Declarations,
    HoldKind,
    JobSpec,
    ObjectRef,
    PlannedRule,
    Publications,
    RecoveryPolicy,
    RecoveryRule,
    State,
)
from dispatch_core.steps import Launch
from dispatch_core.writers import WriterKind, may_write
from tests.unit.core.helpers import (
    ALICE,
    T0,
    Sim,
    actions,
    cause,
    committed,
    escalation_ids,
    rule,
)

PREEMPTED = cause(CauseKind.PREEMPTED, "PREEMPTED")
EXIT_1 = cause(CauseKind.NON_ZERO_EXIT, "FAILED 1:0")


def _published(sim: Sim, submission: int, step: int) -> None:
    """The job's ``pub/`` shows a publication of ``step`` by ``submission`` (seed 004)."""
    sim.publications = Publications(read_at=sim.now, epoch=submission * 10**6, step=step)


def _run_and_end(sim: Sim, why: Cause = PREEMPTED, *, step: int | None = None) -> list[JobEvent]:
    """Start the current submission's object, let it publish ``step``, end it; return the
    pass that decides the end's commits."""
    sim.tick(1)
    sim.step()
    sim.tick(1)
    sim.step()
    obj = sim.current()
    if step is not None:
        _published(sim, obj.submission or 0, step)
    sim.end(obj.ref, why)
    sim.tick(1)
    return list(committed(sim.step()))


# -- the record and the plan ------------------------------------------------------------------


def test_old_rules_decode_with_progress_settings_off() -> None:
    old = b'{"on":["preempted"],"action":"resubmit","budget":3,"enforcer":"supervisor"}'
    decoded = msgspec.json.decode(old, type=RecoveryRule)
    assert (decoded.free_if_progress, decoded.max_without_progress) == (False, None)
    planned = msgspec.json.decode(
        b'{"rule":0,"on":["preempted"],"action":"resubmit","budget":3,'
        b'"enforcer":"supervisor","hold_for_s":86400.0}',
        type=PlannedRule,
    )
    assert (planned.free_if_progress, planned.max_without_progress) == (False, None)


def test_the_plan_shows_both_settings_per_rule() -> None:
    policy = RecoveryPolicy(
        rules=(
            rule(CauseKind.PREEMPTED, free_if_progress=True, max_without_progress=3),
            rule(CauseKind.NON_ZERO_EXIT, action=Action.HOLD),
        )
    )
    plan = make_plan(JobSpec(cluster="c"), policy, Declarations(node_loss_window_s=1.0))
    assert [(r.free_if_progress, r.max_without_progress) for r in plan.rules] == [
        (True, 3),
        (False, None),
    ]


def test_max_without_progress_below_one_is_refused() -> None:
    policy = RecoveryPolicy(rules=(rule(CauseKind.PREEMPTED, max_without_progress=0),))
    with pytest.raises(InvalidPolicy, match="max_without_progress 0"):
        validate(policy)


def test_progress_fact_round_trips_and_is_the_supervisors() -> None:
    fact = ProgressObserved(
        job_id="j1",
        at=T0,
        ref=ObjectRef(cluster="c", id="1"),
        restart=0,
        submission=1,
        epoch=10**6,
        step=40,
        read_at=T0,
        advanced=True,
        rule=0,
    )
    assert decode_event(encode(fact)) == fact
    assert may_write(WriterKind.SUPERVISOR, fact)
    assert not may_write(WriterKind.API, fact)
    assert not may_write(WriterKind.NOTIFIER, fact)


def test_no_progress_is_answered_by_resubmit_give_up_cancel() -> None:
    info = ESCALATIONS[EscalationKind.NO_PROGRESS]
    assert info.answers == ("resubmit", "give-up", "cancel")
    assert info.id_format == "no-progress:<N>"


# -- the planner ------------------------------------------------------------------------------


def test_preemption_after_progress_costs_nothing_under_free_if_progress() -> None:
    """Issue 14: "a recovery whose ended execution advanced the published step does not
    spend the rule's budget"; budget 1 and three preemptions, each after progress."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=1, free_if_progress=True))
    for n, step in enumerate((100, 200, 300), 1):
        events = _run_and_end(sim, step=step)
        (fact,) = [e for e in events if isinstance(e, ProgressObserved)]
        assert (fact.submission, fact.step, fact.advanced) == (n, step, True)
        (recovery,) = [e for e in events if isinstance(e, RecoveryCommitted)]
        assert recovery.free
    assert sim.job.spent(0) == 0
    assert len(sim.job.submissions) == 4
    assert sim.job.outcome is None


def test_preemption_without_progress_spends_the_budget_then_fails() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED, budget=1, free_if_progress=True))
    events = _run_and_end(sim, step=100)
    assert [e.free for e in events if isinstance(e, RecoveryCommitted)] == [True]
    events = _run_and_end(sim)  # publishes nothing new: step stays 100
    (fact,) = [e for e in events if isinstance(e, ProgressObserved)]
    assert (fact.step, fact.advanced) == (100, False)
    assert [e.free for e in events if isinstance(e, RecoveryCommitted)] == [False]
    assert sim.job.spent(0) == 1
    events = _run_and_end(sim)
    assert [e.state for e in events if isinstance(e, OutcomeCommitted)] == [State.FAILED]


def test_without_free_if_progress_progress_still_spends() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED, budget=1))
    sim.publications = Publications(read_at=T0)
    _run_and_end(sim, step=100)
    assert sim.job.spent(0) == 1
    assert [f.advanced for f in sim.job.progress] == [True]


def test_three_executions_that_publish_nothing_hold_with_no_progress_3() -> None:
    """Issue 14: "after N consecutive executions that ended by a cause the rule covers
    without advancing the published step, the job is held under a recovery hold with an
    escalation no-progress:<N>"."""
    sim = Sim(rule(CauseKind.PREEMPTED, budget=10, max_without_progress=3))
    for n in (1, 2):
        events = _run_and_end(sim)
        assert [e.without_progress for e in events if isinstance(e, ProgressObserved)] == [n]
        assert not [e for e in events if isinstance(e, HoldPlaced)]
    sim.tick(1)
    sim.step()
    sim.tick(1)
    sim.step()
    obj = sim.current()
    sim.end(obj.ref, PREEMPTED)
    sim.tick(1)
    p = sim.step()
    (placed,) = committed(p, HoldPlaced)
    assert placed.kind is HoldKind.RECOVERY
    assert placed.rule == 0
    assert "3 executions in a row" in placed.reason
    assert escalation_ids(p) == ["no-progress:3"]
    assert not actions(p, Launch)
    assert committed(p, SubmissionOpened) == []
    assert sim.status().state is State.HELD
    assert sim.job.spent(0) == 2
    # A person resubmits: counting starts again, and the hold fires again at the third.
    sim.command(Resubmit(by=ALICE, reason="fixed the loader"))
    for n in (1, 2):
        events = _run_and_end(sim)
        assert [e.without_progress for e in events if isinstance(e, ProgressObserved)] == [n]
    events = _run_and_end(sim)
    assert [e.kind for e in events if isinstance(e, HoldPlaced)] == [HoldKind.RECOVERY]


def test_progress_resets_the_count() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED, budget=10, max_without_progress=2))
    _run_and_end(sim)
    _run_and_end(sim, step=50)
    events = _run_and_end(sim)
    assert [e.without_progress for e in events if isinstance(e, ProgressObserved)] == [1]
    assert sim.job.hold is None


def test_an_ending_another_rule_covers_breaks_the_run() -> None:
    sim = Sim(
        rule(CauseKind.PREEMPTED, budget=10, max_without_progress=2),
        rule(CauseKind.NON_ZERO_EXIT, budget=10, max_without_progress=5),
    )
    _run_and_end(sim)
    _run_and_end(sim, EXIT_1)
    events = _run_and_end(sim)
    assert [e.without_progress for e in events if isinstance(e, ProgressObserved)] == [1]
    assert sim.job.hold is None


def test_a_job_without_progress_settings_or_listing_records_no_fact() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED, budget=2))
    events = _run_and_end(sim)
    assert not [e for e in events if isinstance(e, ProgressObserved)]
    assert sim.job.progress == ()


def test_the_planner_is_idempotent_with_a_progress_fact() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED, budget=1, free_if_progress=True))
    _run_and_end(sim, step=10)
    again = sim.plan()
    assert committed(again) == []


# -- the budget arithmetic (properties) -------------------------------------------------------

_REF = ObjectRef(cluster="c", id="o")


def _simulate(
    budget: int, free: bool, limit: int | None, endings: list[int | None]
) -> tuple[int, int, list[int], list[Verdict]]:
    """Run the arithmetic over executions that each end by the rule's cause, having
    published ``step`` (``None``: the listing showed nothing new). Stops at a failure or a
    hold, as the job would. Returns (recoveries, progressed, hold positions, verdicts)."""
    from tests.unit.core.helpers import Sim as _Sim

    planned = make_plan(
        JobSpec(cluster="c"),
        RecoveryPolicy(
            rules=(
                rule(
                    CauseKind.PREEMPTED,
                    budget=budget,
                    free_if_progress=free,
                    max_without_progress=limit,
                ),
            )
        ),
        Declarations(node_loss_window_s=1.0),
    ).rules[0]
    job = _Sim(
        rule(CauseKind.PREEMPTED, budget=budget, free_if_progress=free, max_without_progress=limit)
    ).job
    spent = recoveries = progressed = 0
    holds: list[int] = []
    verdicts: list[Verdict] = []
    latest: int | None = None
    for i, step in enumerate(endings):
        if step is not None:
            latest = step if latest is None else max(latest, step)
        pubs = Publications(read_at=T0, epoch=i + 1, step=latest) if latest is not None else None
        fact = observe(
            job,
            ref=_REF,
            restart=i,
            submission=i + 1,
            rule=planned,
            publications=pubs,
            now=T0 + timedelta(seconds=i),
        )
        job = msgspec.structs.replace(job, progress=(*job.progress, fact))
        judged = verdict(planned, spent, fact)
        verdicts.append(judged)
        progressed += fact.advanced
        if judged is Verdict.SPENT:
            break
        if judged is Verdict.NO_PROGRESS:
            holds.append(i)
            break
        recoveries += 1
        spent += judged is Verdict.SPEND
    return recoveries, progressed, holds, verdicts


_endings = st.lists(st.one_of(st.none(), st.integers(0, 1000)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 5),
    free=st.booleans(),
    limit=st.one_of(st.none(), st.integers(1, 6)),
    endings=_endings,
)
def test_never_more_recoveries_than_the_budget_plus_the_progressed_ones(
    budget: int, free: bool, limit: int | None, endings: list[int | None]
) -> None:
    recoveries, progressed, _, verdicts = _simulate(budget, free, limit, endings)
    assert recoveries <= budget + progressed
    if not free:
        assert recoveries <= budget
    assert sum(v is Verdict.SPEND for v in verdicts) <= budget


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 50),
    limit=st.integers(1, 6),
    lead=st.lists(st.integers(0, 999), max_size=5),
    stalls=st.integers(0, 10),
)
def test_a_no_progress_hold_fires_exactly_at_n(
    budget: int, limit: int, lead: list[int], stalls: int
) -> None:
    """Executions that each publish a newer step, then ``stalls`` that publish nothing: the
    hold fires at the N-th stalled one, never before, while budget is left. (Lead offsets
    stay below 1000 so every lead step is newer than the one before: 1000 + 1000 and
    2000 + 0 would be the same step, a stall.)"""
    steps: list[int | None] = [1000 * (i + 1) + s for i, s in enumerate(lead)]
    endings = [*steps, *([None] * stalls)]
    _, _, holds, verdicts = _simulate(budget + len(lead) + limit, True, limit, endings)
    if stalls >= limit:
        assert holds == [len(lead) + limit - 1]
        assert verdicts[-1] is Verdict.NO_PROGRESS
    else:
        assert holds == []
    assert Verdict.NO_PROGRESS not in verdicts[:-1]


def test_status_shows_the_latest_published_step_and_when() -> None:
    sim = Sim(rule(CauseKind.PREEMPTED, budget=3, free_if_progress=True))
    assert sim.status().published_step is None
    _run_and_end(sim, step=120)
    read_at = sim.job.progress[-1].read_at
    _run_and_end(sim)  # nothing new: the step stays, and when it was last read
    status = sim.status()
    assert status.published_step == 120
    assert status.published_at is not None
    assert read_at is not None
    assert status.published_at >= read_at

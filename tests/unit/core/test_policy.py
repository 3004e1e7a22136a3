"""validate and make_plan (seed 000, "Recovery rules are written against causes", "An object
ending is not the job ending"; seed 004, "When a job can't isolate")."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_core import (
    COVERABLE_CAUSES,
    SHARED_HOLD_FOR_S,
    Action,
    CauseKind,
    Declarations,
    Enforcer,
    InvalidPolicy,
    JobSpec,
    RecoveryPolicy,
    RecoveryRule,
    SharedCheckpoint,
    make_plan,
    validate,
)
from tests.unit.core.strategies import legal_policies

SPEC = JobSpec(cluster="slurm-a")
SHARED = JobSpec(cluster="slurm-a", extensions=(SharedCheckpoint(),))
DECL = Declarations(node_loss_window_s=300.0)
NATIVE = Declarations(node_loss_window_s=300.0, native_actions=frozenset({Action.REQUEUE}))


def _policy(*rules: RecoveryRule) -> RecoveryPolicy:
    return RecoveryPolicy(rules=rules)


def _rule(*on: CauseKind, action: Action = Action.RESUBMIT, **kw: object) -> RecoveryRule:
    return RecoveryRule(on=on, action=action, **kw)  # type: ignore[arg-type]


def _refusal(policy: RecoveryPolicy) -> InvalidPolicy:
    with pytest.raises(InvalidPolicy) as err:
        validate(policy)
    return err.value


# -- validate: examples, one per seed sentence -------------------------------------------


def test_a_cause_covered_by_two_rules_is_refused() -> None:
    """ "RecoveryPolicy.Validate refuses a cause covered by two rules, so there's never a
    question of which applies" (seed 000)."""
    err = _refusal(
        _policy(
            _rule(CauseKind.PREEMPTED, CauseKind.NODE_LOST, budget=3),
            _rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD),
            _rule(CauseKind.NODE_LOST, action=Action.ESCALATE),
        )
    )
    assert (err.rule, err.cause) == (2, CauseKind.NODE_LOST)
    assert "already covered by rule 0" in str(err)


def test_cancelled_from_the_scheduler_cannot_be_covered() -> None:
    """ "cancelled from the scheduler is final: a cancel that reached the scheduler is never
    undone by recovery" (seed 000)."""
    err = _refusal(_policy(_rule(CauseKind.PREEMPTED, CauseKind.CANCELLED)))
    assert (err.rule, err.cause) == (0, CauseKind.CANCELLED)
    assert "a cancel that reached the scheduler is final" in str(err)


def test_none_cannot_be_covered() -> None:
    """ "none is success" (seed 000)."""
    err = _refusal(_policy(_rule(CauseKind.NONE, action=Action.ESCALATE)))
    assert (err.rule, err.cause, err.reason) == (
        0,
        CauseKind.NONE,
        "no rule may cover none: none is success",
    )


@pytest.mark.parametrize("kind", [CauseKind.HELD, CauseKind.RELEASED])
def test_held_and_released_are_decisions_not_endings(kind: CauseKind) -> None:
    assert _refusal(_policy(_rule(kind, action=Action.HOLD))).cause == kind


@pytest.mark.parametrize("action", [Action.RESUBMIT, Action.RESTART, Action.REQUEUE])
def test_unknown_may_only_be_covered_by_a_hold_or_escalate_rule(action: Action) -> None:
    """ "unknown may only be covered by a hold or escalate rule, because resubmitting on a
    cause nobody understands is a guess" (seed 000)."""
    err = _refusal(_policy(_rule(CauseKind.UNKNOWN, action=action, budget=1)))
    assert (err.rule, err.cause) == (0, CauseKind.UNKNOWN)
    assert "is a guess" in str(err)
    validate(_policy(_rule(CauseKind.UNKNOWN, action=Action.HOLD)))
    validate(_policy(_rule(CauseKind.UNKNOWN, action=Action.ESCALATE)))


def test_a_rule_without_causes_a_negative_budget_or_a_bad_hold_time_is_refused() -> None:
    assert _refusal(_policy(_rule())).reason == "the rule covers no cause"
    assert (
        _refusal(_policy(_rule(CauseKind.PREEMPTED, budget=-1))).reason
        == "budget -1 is not in 0..999999 (submissions)"
    )
    # each recovery opens a submission; N can't pass 999,999 (seed 004, "The epoch")
    assert (
        "budget 1000000 is not in"
        in _refusal(_policy(_rule(CauseKind.PREEMPTED, budget=1_000_000))).reason
    )
    for hold_for_s in (0.0, -5.0, math.nan, math.inf, 1e12):
        err = _refusal(
            _policy(_rule(CauseKind.PREEMPTED, action=Action.HOLD, hold_for_s=hold_for_s))
        )
        assert "hold_for_s" in err.reason


def test_a_legal_policy_is_accepted() -> None:
    validate(RecoveryPolicy())
    validate(
        _policy(
            _rule(CauseKind.PREEMPTED, CauseKind.NODE_LOST, budget=3),
            _rule(CauseKind.OUT_OF_MEMORY, CauseKind.UNKNOWN, action=Action.HOLD),
            _rule(CauseKind.TIME_LIMIT, action=Action.REQUEUE, enforcer=Enforcer.BACKEND, budget=2),
            _rule(CauseKind.NON_ZERO_EXIT, action=Action.ESCALATE),
        )
    )


# -- validate: the oracle ---------------------------------------------------------------

_ANY_RULE = st.builds(
    RecoveryRule,
    on=st.lists(st.sampled_from(CauseKind), max_size=4).map(tuple),
    action=st.sampled_from(Action),
    budget=st.sampled_from([-2, -1, 0, 1, 3, 999_999, 1_000_000]),
    enforcer=st.sampled_from(Enforcer),
    hold_for_s=st.sampled_from([86400.0, 60.0, 0.0, -1.0, math.inf, math.nan, 4e9]),
)


def _oracle(policy: RecoveryPolicy) -> tuple[int, CauseKind | None] | None:
    """The rules of seed 000 restated: the first illegal (rule, cause), or None if legal."""
    seen: set[CauseKind] = set()
    for index, rule in enumerate(policy.rules):
        if len(rule.on) == 0 or not 0 <= rule.budget <= 999_999:
            return index, None
        if not 0 < rule.hold_for_s <= 100 * 365 * 24 * 3600 or rule.hold_for_s != rule.hold_for_s:
            return index, None
        never = [k for k in rule.on if k.value in ("none", "cancelled", "held", "released")]
        if never:
            return index, never[0]
        if "unknown" in rule.on and rule.action.value not in ("hold", "escalate"):
            return index, CauseKind.UNKNOWN
        again = [k for k in rule.on if k in seen]
        if again:
            return index, again[0]
        seen |= set(rule.on)
    return None


@given(st.lists(_ANY_RULE, max_size=4).map(lambda rules: RecoveryPolicy(rules=tuple(rules))))
def test_validate_refuses_exactly_the_illegal_policies(policy: RecoveryPolicy) -> None:
    expected = _oracle(policy)
    if expected is None:
        validate(policy)
    else:
        err = _refusal(policy)
        assert (err.rule, err.cause) == expected


@given(legal_policies())
def test_the_legal_policies_the_records_use_are_valid(policy: RecoveryPolicy) -> None:
    validate(policy)


# -- make_plan --------------------------------------------------------------------------


def test_the_plan_lists_every_cause_no_rule_covers_before_the_job_starts() -> None:
    """ "Plan.Uncovered lists, before the job starts, every cause no rule covers" (seed 000)."""
    plan = make_plan(
        SPEC,
        _policy(
            _rule(CauseKind.PREEMPTED, CauseKind.NODE_LOST, budget=3),
            _rule(CauseKind.UNKNOWN, action=Action.HOLD),
        ),
        DECL,
    )
    assert plan.uncovered == (
        CauseKind.OUT_OF_MEMORY,
        CauseKind.TIME_LIMIT,
        CauseKind.NON_ZERO_EXIT,
        CauseKind.LAUNCH_FAILED,
        CauseKind.NO_CAPACITY,
        CauseKind.REQUEUED,
        CauseKind.DUPLICATE,
    )
    assert [r.rule for r in plan.rules] == [0, 1]
    assert plan.substitutions == ()


@given(legal_policies(), st.booleans())
def test_uncovered_and_covered_causes_partition_the_coverable_ones(
    policy: RecoveryPolicy, shared: bool
) -> None:
    plan = make_plan(SHARED if shared else SPEC, policy, DECL)
    covered = {kind for rule in plan.rules for kind in rule.on}
    assert covered.isdisjoint(plan.uncovered)
    assert covered | set(plan.uncovered) == set(COVERABLE_CAUSES)
    assert list(plan.uncovered) == sorted(plan.uncovered, key=list(CauseKind).index)


def test_a_shared_checkpoint_turns_every_recovery_rule_into_a_24_hour_hold() -> None:
    """ "every recovery rule becomes a hold for a person, for 24 hours (dispatch.SharedHoldFor),
    and the plan shows the substitution before the job starts" (seed 004)."""
    plan = make_plan(
        SHARED,
        _policy(
            _rule(CauseKind.PREEMPTED, budget=3),
            _rule(CauseKind.TIME_LIMIT, action=Action.REQUEUE, enforcer=Enforcer.BACKEND, budget=1),
            _rule(CauseKind.NON_ZERO_EXIT, action=Action.ESCALATE),
            _rule(CauseKind.UNKNOWN, action=Action.HOLD, hold_for_s=600.0),
        ),
        NATIVE,
    )
    assert [(r.action, r.substituted_for, r.hold_for_s) for r in plan.rules] == [
        (Action.HOLD, Action.RESUBMIT, SHARED_HOLD_FOR_S),
        (Action.HOLD, Action.REQUEUE, SHARED_HOLD_FOR_S),
        (Action.ESCALATE, None, 86400.0),
        (Action.HOLD, None, 600.0),
    ]
    assert SHARED_HOLD_FOR_S == 24 * 3600
    assert [(s.rule, s.original, s.substitute) for s in plan.substitutions] == [
        (0, Action.RESUBMIT, Action.HOLD),
        (1, Action.REQUEUE, Action.HOLD),
    ]
    assert all("shares a mutable checkpoint" in s.reason for s in plan.substitutions)
    assert plan.rules[0].budget == 3
    assert all(r.enforcer is Enforcer.SUPERVISOR and r.unenforced is None for r in plan.rules)


def test_restart_or_requeue_assigned_to_the_supervisor_is_unenforced() -> None:
    """ "a rule with one of those actions assigned to the supervisor fails the job, with an
    escalation saying supervisor recovery for that action isn't implemented" (seed 000)."""
    plan = make_plan(
        SPEC,
        _policy(
            _rule(CauseKind.PREEMPTED, action=Action.REQUEUE, budget=2),
            _rule(CauseKind.NODE_LOST, action=Action.RESTART, budget=2),
        ),
        NATIVE,
    )
    assert [r.unenforced for r in plan.rules] == [
        "supervisor recovery for requeue isn't implemented",
        "supervisor recovery for restart isn't implemented",
    ]


def test_restart_or_requeue_is_carried_out_only_by_a_backend_that_enforces_it_natively() -> None:
    """ "restart and requeue are carried out only by a backend that enforces them natively"
    (seed 000)."""
    policy = _policy(
        _rule(CauseKind.PREEMPTED, action=Action.REQUEUE, enforcer=Enforcer.BACKEND, budget=2),
        _rule(CauseKind.NODE_LOST, action=Action.RESTART, enforcer=Enforcer.BACKEND, budget=2),
    )
    plan = make_plan(SPEC, policy, NATIVE)
    assert plan.rules[0].unenforced is None
    assert plan.rules[0].enforcer is Enforcer.BACKEND
    assert plan.rules[1].unenforced == "backend of cluster slurm-a doesn't enforce restart natively"


def test_the_supervisor_carries_out_resubmit_hold_and_escalate() -> None:
    """ "Today the supervisor carries out resubmit and hold itself" (seed 000)."""
    plan = make_plan(
        SPEC,
        _policy(
            _rule(CauseKind.PREEMPTED, enforcer=Enforcer.BACKEND, budget=1),
            _rule(CauseKind.OUT_OF_MEMORY, action=Action.HOLD, enforcer=Enforcer.BACKEND),
        ),
        DECL,
    )
    assert [(r.enforcer, r.unenforced) for r in plan.rules] == [(Enforcer.SUPERVISOR, None)] * 2


def test_make_plan_refuses_an_illegal_policy() -> None:
    with pytest.raises(InvalidPolicy, match=r"rule 0, cause 'none'"):
        make_plan(SPEC, _policy(_rule(CauseKind.NONE)), DECL)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("unresolved_age_s", 0.0),
        ("unresolved_age_s", float("inf")),
        ("cleanup_deadline_s", -1.0),
        ("cleanup_deadline_s", 1e12),
        ("max_launch_attempts", 0),
        ("max_launch_attempts", 1001),
    ],
)
def test_a_spec_whose_limits_the_planner_cannot_use_is_refused_naming_the_field(
    field: str, value: float
) -> None:
    """The planner adds the unresolved age and the cleanup deadline (seed 002: "10 minutes
    unless WithUnresolvedAge set it", "30 minutes unless WithCleanupDeadline set it") to
    times; a value it can't add is refused at submission, naming the field, not later in a
    pass."""
    from dispatch_core import InvalidSpec, JobSpec, validate_spec

    spec = msgspec.structs.replace(JobSpec(cluster="c"), **{field: value})
    with pytest.raises(InvalidSpec, match=field) as err:
        validate_spec(spec)
    assert err.value.field == field
    validate_spec(JobSpec(cluster="c"))  # the defaults are fine

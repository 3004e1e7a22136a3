"""Failover to another cluster (issue 14, part 2): a resubmit rule's ``clusters`` list moves
the next submission to the next cluster in the list; the epoch keeps rising; an old object on
the cluster the job left is still fenced and ended; old records decode (``cluster`` absent).
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_core import (
    Action,
    CauseKind,
    Declarations,
    Discovery,
    InvalidPolicy,
    JobSpec,
    RecoveryPolicy,
    State,
    current_cluster,
    decode_event,
    epoch,
    make_plan,
    merge_discoveries,
    next_cluster,
    validate,
)
from dispatch_core.commands import Resubmit
from dispatch_core.events import SubmissionOpened
from dispatch_core.job import Status
from dispatch_core.steps import Launch, OpenGate, Stop
from tests.unit.core.helpers import (
    ALICE,
    CLUSTER,
    T0,
    Sim,
    actions,
    cause,
    committed,
    rule,
    start,
)

OTHER = "c2"
THIRD = "c3"
WINDOW_S = 300.0
NODE_LOST = cause(CauseKind.NODE_LOST, "NODE_FAIL")
NO_CAPACITY = cause(CauseKind.NO_CAPACITY, "ReqNodeNotAvail")
PREEMPTED = cause(CauseKind.PREEMPTED, "PREEMPTED")
FAILOVER_ON = (CauseKind.NODE_LOST, CauseKind.NO_CAPACITY, CauseKind.LAUNCH_FAILED)


def _sim(*clusters: str, budget: int = 5, **kw: object) -> Sim:
    return Sim(
        rule(*FAILOVER_ON, budget=budget, clusters=list(clusters)),
        rule(CauseKind.PREEMPTED, budget=budget),
        declarations=Declarations(node_loss_window_s=WINDOW_S),
        **kw,  # type: ignore[arg-type]
    )


def _status(sim: Sim) -> Status:
    status = sim.status()
    assert isinstance(status, Status)
    return status


def _epoch(sim: Sim) -> int:
    status = _status(sim)
    assert status.epoch is not None
    return status.epoch


# -- next_cluster ---------------------------------------------------------------------------

_NAMES = st.sampled_from(["a", "b", "c", "d", "e"])


@given(st.lists(_NAMES, min_size=1, max_size=5, unique=True), _NAMES)
def test_next_cluster_is_the_next_in_the_list_and_never_outside_it(
    clusters: list[str], current: str
) -> None:
    """The one after the current cluster; the last stays the last; the first when the
    current one isn't listed; always a listed cluster."""
    chosen = next_cluster(clusters, current)
    assert chosen in clusters
    if current not in clusters:
        assert chosen == clusters[0]
    elif current == clusters[-1]:
        assert chosen == current
    else:
        assert chosen == clusters[clusters.index(current) + 1]


def test_next_cluster_of_no_clusters_is_an_error() -> None:
    with pytest.raises(ValueError, match="no clusters"):
        next_cluster([], "a")


# -- the planner ----------------------------------------------------------------------------


def test_node_lost_resubmits_on_the_next_cluster_and_the_epoch_rises() -> None:
    sim = _sim(CLUSTER, OTHER)
    obj = start(sim)
    assert obj.ref.cluster == CLUSTER
    first_epoch = _epoch(sim)
    sim.end(obj.ref, NODE_LOST)

    p = sim.step()

    (opened,) = committed(p, SubmissionOpened)
    assert (opened.submission, opened.why, opened.cluster) == (2, "recovery", OTHER)
    (launch,) = actions(p, Launch)
    assert launch.spec.cluster == OTHER
    assert launch.spec == msgspec.structs.replace(sim.spec, cluster=OTHER)
    assert current_cluster(sim.job) == OTHER
    assert _status(sim).cluster == OTHER
    sim.tick(1)
    sim.step()  # the new object shows on c2; its gate opens
    sim.tick(1)
    new = sim.current()
    assert new.ref.cluster == OTHER
    assert _status(sim).state is State.RUNNING
    assert _epoch(sim) > first_epoch
    assert _epoch(sim) == epoch(0, 2, 0)
    # The record shows which cluster each execution ran on.
    assert [o.ref.cluster for o in sim.job.objects] == [CLUSTER, OTHER]


def test_a_cause_the_failover_rule_does_not_cover_stays_on_the_cluster() -> None:
    sim = _sim(CLUSTER, OTHER)
    obj = start(sim)
    sim.end(obj.ref, PREEMPTED)
    p = sim.step()
    (opened,) = committed(p, SubmissionOpened)
    assert opened.cluster is None  # spec.cluster: the record reads as before failover
    (launch,) = actions(p, Launch)
    assert launch.spec == sim.spec


def test_the_last_cluster_stays_the_last_until_the_budget_is_spent() -> None:
    sim = _sim(CLUSTER, OTHER, budget=3)
    seen = []
    for _ in range(4):
        obj = start(sim)
        seen.append(obj.ref.cluster)
        sim.end(obj.ref, NO_CAPACITY)
        sim.step()
        sim.tick(1)
    assert seen == [CLUSTER, OTHER, OTHER, OTHER]
    assert sim.job.outcome is State.FAILED  # budget 3 spent, rules as usual


def test_a_spec_cluster_not_in_the_list_goes_to_the_first_listed() -> None:
    sim = _sim(OTHER, THIRD)
    obj = start(sim)
    sim.end(obj.ref, NODE_LOST)
    (opened,) = committed(sim.step(), SubmissionOpened)
    assert opened.cluster == OTHER


def test_after_a_failover_other_submissions_stay_on_the_current_cluster() -> None:
    """A preemption on c2 after a failover resubmits on c2 (``cluster`` carried on)."""
    sim = _sim(CLUSTER, OTHER, THIRD)
    obj = start(sim)
    sim.end(obj.ref, NODE_LOST)
    sim.step()
    sim.tick(1)
    obj = start(sim)
    assert obj.ref.cluster == OTHER
    sim.end(obj.ref, PREEMPTED)
    (opened,) = committed(sim.step(), SubmissionOpened)
    assert opened.cluster == OTHER


def test_a_persons_resubmit_stays_on_the_current_cluster() -> None:
    sim = Sim(
        rule(CauseKind.NODE_LOST, budget=1, clusters=[CLUSTER, OTHER]),
        rule(CauseKind.NON_ZERO_EXIT, action=Action.HOLD),
    )
    obj = start(sim)
    sim.end(obj.ref, NODE_LOST)
    sim.step()
    sim.tick(1)
    obj = start(sim)
    sim.end(obj.ref, cause(CauseKind.NON_ZERO_EXIT, "exit 1"))
    sim.step()
    assert sim.job.hold is not None
    sim.command(Resubmit(by=ALICE, reason="fixed"))
    sub = sim.job.submission
    assert sub is not None
    assert (sub.number, sub.why, sub.cluster) == (3, "resubmit", OTHER)


def test_the_old_object_on_the_cluster_left_is_fenced_and_keeps_the_new_gate_closed() -> None:
    """Seed 000's fence across clusters: past the window the object on c1 is stopped and the
    node-lost rule moves the job to c2; the replacement's gate on c2 stays closed until c1's
    scheduler shows the old object ended (the pass reads both clusters' Discoveries)."""
    sim = _sim(CLUSTER, OTHER)
    obj = start(sim)
    sim.update(obj.ref, cause=cause(CauseKind.NODE_LOST, "NotReady", at=sim.now))
    sim.step()
    sim.tick(WINDOW_S + 1)

    p = sim.step()

    (stop,) = actions(p, Stop)
    assert stop.ref == obj.ref
    (opened,) = committed(p, SubmissionOpened)
    assert opened.cluster == OTHER
    sim.tick(1)
    p = sim.step()  # the replacement shows on c2; c1's object still runs
    assert not actions(p, OpenGate)
    assert sim.discovery().covers(CLUSTER)
    sim.settle_stops()  # c1's scheduler ends the old object
    sim.tick(1)
    p = sim.step()
    (gate,) = actions(p, OpenGate)
    assert gate.ref.cluster == OTHER
    # The old object's end is recorded from c1's Discovery: the job can settle later.
    old = sim.job.object(obj.ref)
    assert old is not None
    assert old.ended


def test_without_the_left_clusters_discovery_the_new_gate_stays_closed() -> None:
    """An object on a cluster whose Discovery the pass doesn't have proves nothing: the
    replacement's gate stays closed (gone is not ended, issue 15)."""
    sim = _sim(CLUSTER, OTHER)
    obj = start(sim)
    sim.update(obj.ref, cause=cause(CauseKind.NODE_LOST, "NotReady", at=sim.now))
    sim.step()
    sim.tick(WINDOW_S + 1)
    sim.step()
    sim.tick(1)
    sim.step()
    new = sim.current()
    assert new.ref.cluster == OTHER
    # Only c2's Discovery: c1's old object is neither shown nor proven ended.
    only_c2 = Discovery(
        cluster=OTHER,
        job_id=sim.job_id,
        seen_at=sim.now,
        objects=tuple(o for o in sim.objects.values() if o.ref.cluster == OTHER),
    )
    from dispatch_core.plan import next_steps

    p = next_steps(sim.job, only_c2, sim.declarations, sim.now)
    assert not actions(p, OpenGate)


@settings(max_examples=60, deadline=None)
@given(
    clusters=st.lists(
        st.sampled_from([CLUSTER, OTHER, THIRD]), min_size=1, max_size=3, unique=True
    ),
    endings=st.lists(
        st.sampled_from([CauseKind.NODE_LOST, CauseKind.NO_CAPACITY, CauseKind.PREEMPTED]),
        min_size=1,
        max_size=6,
    ),
)
def test_failover_follows_the_list_and_the_epoch_strictly_rises(
    clusters: list[str], endings: list[CauseKind]
) -> None:
    """For any ending sequence: a submission opened on a covered cause runs on the next
    cluster of the list after the previous one; on another cause, on the same cluster; a
    failover never leaves the list; each execution's epoch is greater than the last."""
    sim = _sim(*clusters, budget=10)
    previous_cluster, previous_epoch = None, -1
    for kind in endings:
        obj = start(sim)
        here = obj.ref.cluster
        assert here == current_cluster(sim.job)
        this_epoch = _epoch(sim)
        assert this_epoch > previous_epoch
        if previous_cluster is not None:
            last = sim.job.submissions[-1]
            assert last.cause is not None
            if last.cause.kind in FAILOVER_ON:
                assert here == next_cluster(clusters, previous_cluster)
                assert here in clusters
            else:
                assert here == previous_cluster
        previous_cluster, previous_epoch = here, this_epoch
        sim.end(obj.ref, cause(kind, str(kind)))
        sim.step()
        sim.tick(1)
    assert sim.job.outcome is None


# -- validation, plan, records --------------------------------------------------------------


@pytest.mark.parametrize(
    ("clusters", "action", "words"),
    [
        (["c1"], Action.HOLD, "only for a resubmit rule"),
        (["c1", "c1"], Action.RESUBMIT, "listed twice"),
        (["C1"], Action.RESUBMIT, "not a cluster name"),
    ],
)
def test_validate_refuses_a_bad_failover_list(
    clusters: list[str], action: Action, words: str
) -> None:
    policy = RecoveryPolicy(rules=(rule(CauseKind.NODE_LOST, action=action, clusters=clusters),))
    with pytest.raises(InvalidPolicy, match=words) as info:
        validate(policy)
    assert info.value.rule == 0


def test_the_plan_shows_each_rules_clusters() -> None:
    policy = RecoveryPolicy(rules=(rule(*FAILOVER_ON, clusters=["slurm", "local"]),))
    plan = make_plan(JobSpec(cluster="slurm"), policy, Declarations(node_loss_window_s=60))
    assert plan.rules[0].clusters == ("slurm", "local")


def test_an_old_submission_opened_without_cluster_decodes_to_spec_cluster() -> None:
    """A record written before failover existed has no ``cluster``: it decodes to ``None``
    and the submission runs on ``spec.cluster``."""
    raw = (
        b'{"type":"submission.opened","job_id":"j1","at":"2026-01-01T00:00:00Z",'
        b'"submission":1,"why":"initial","cause":null,"by":null}'
    )
    event = decode_event(raw)
    assert isinstance(event, SubmissionOpened)
    assert event.cluster is None
    sim = Sim()
    sim.record.append([msgspec.structs.replace(event, at=T0 + timedelta(seconds=1))])
    assert current_cluster(sim.job) == CLUSTER


def test_merge_keeps_the_current_clusters_identity_and_covers_the_others() -> None:
    a = Discovery(cluster="a", job_id="j", seen_at=T0)
    b = Discovery(cluster="b", job_id="j", seen_at=T0 + timedelta(seconds=5))
    merged = merge_discoveries([a, b])
    assert merged is not None
    assert (merged.cluster, merged.merged, merged.seen_at) == ("a", ("b",), T0)
    assert merged.covers("a")
    assert merged.covers("b")
    assert not merged.covers("c")
    assert merge_discoveries([]) is None
    assert merge_discoveries([a]) is a
    with pytest.raises(ValueError, match="different jobs"):
        merge_discoveries([a, Discovery(cluster="b", job_id="k", seen_at=T0)])


# -- refusals -------------------------------------------------------------------------------


def _refuse_every_attempt(sim: Sim) -> None:
    sim.launch_answer = "refused"
    for _ in range(3):  # max_launch_attempts
        sim.step()
        sim.tick(1)
    sim.launch_answer = "recorded"
    sim.step()  # every attempt refused: this pass decides
    sim.tick(1)


def test_a_submission_refused_everywhere_fails_over_when_the_rule_covers_launch_failed() -> None:
    """Every attempt refused on c1 and the failover rule covers launch-failed: the rule
    recovers (spending one) and the next submission launches on c2, instead of
    ``refused:<N>``."""
    sim = _sim(CLUSTER, OTHER)
    _refuse_every_attempt(sim)
    job = sim.job
    assert job.outcome is None
    assert escalation_ids_of(sim) == []
    sub = job.submission
    assert sub is not None
    assert (sub.number, sub.why, sub.cluster) == (2, "recovery", OTHER)
    assert sub.cause is not None
    assert sub.cause.kind is CauseKind.LAUNCH_FAILED
    assert sim.job.spent(0) == 1
    sim.step()
    sim.tick(1)
    obj = sim.current()
    assert obj.ref.cluster == OTHER
    assert _status(sim).state is State.RUNNING
    assert _epoch(sim) == epoch(0, 2, 0)


@pytest.mark.parametrize("clusters", [(CLUSTER,), ()])
def test_a_submission_refused_on_the_last_cluster_still_fails_refused(
    clusters: tuple[str, ...],
) -> None:
    sim = _sim(*clusters)
    _refuse_every_attempt(sim)
    assert sim.job.outcome is State.FAILED
    assert escalation_ids_of(sim) == ["refused:1"]


def escalation_ids_of(sim: Sim) -> list[str]:
    return [e.id for e in sim.job.escalations]


def test_a_failover_launch_excludes_no_node_of_the_cluster_it_left() -> None:
    """Nodes lost on c1 are no node of c2's: the launch there excludes none."""
    sim = _sim(CLUSTER, OTHER)
    obj = start(sim)
    sim.end(obj.ref, NODE_LOST)
    (launch,) = actions(sim.step(), Launch)
    assert launch.spec.cluster == OTHER
    assert launch.exclude_nodes == ()


def test_a_launch_on_the_same_cluster_still_excludes_its_lost_nodes() -> None:
    sim = Sim(rule(CauseKind.NODE_LOST, budget=2))
    obj = start(sim)
    sim.end(obj.ref, NODE_LOST)
    (launch,) = actions(sim.step(), Launch)
    assert launch.exclude_nodes == ("n1", "n2")

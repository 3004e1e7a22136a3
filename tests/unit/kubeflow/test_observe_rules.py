"""The phase table of a TrainJob not ended (``observe.ALIVE_RULES``): one case per row, where
that row is the first that applies, and the order between rows (the module docstring's table)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_backends.kubeflow.causes import PodFacts
from dispatch_backends.kubeflow.observe import ALIVE_RULES, Now, alive_rule
from dispatch_core.state import Cause, CauseKind, GateState, ObjectPhase, Provenance

LOST = Cause(kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail="node b lost")
HELD_WORDS = "kueue.x-k8s.io/admission-gated-by: site/audit"


def pod(phase: str = "Running", **kw: Any) -> PodFacts:
    return PodFacts(uid=f"u-{phase}", name=f"p-{phase}", trainjob="tj", phase=phase, **kw)


def now(**kw: Any) -> Now:
    fields: dict[str, Any] = {
        "deleting": False,
        "gate": GateState.OPEN,
        "suspended": False,
        "pods": (),
        "nodes": ("node-a",),
    }
    fields.update(kw)
    return Now(**fields)


# (row, the situation, phase, cause, nodes shown)
CASES = [
    (
        "deletionTimestamp set",
        now(deleting=True, gate=GateState.ADMIN_HELD, lost=LOST, lost_on=("node-b",)),
        ObjectPhase.STOPPING,
        LOST,
        ("node-a",),
    ),
    (
        "gate admin-held",
        now(gate=GateState.ADMIN_HELD, gate_words=HELD_WORDS, pods=(pod(),)),
        ObjectPhase.PENDING,
        Cause(kind=CauseKind.HELD, provenance=Provenance.SCHEDULER, detail=HELD_WORDS),
        (),
    ),
    ("gate closed", now(gate=GateState.CLOSED, pods=(pod(),)), ObjectPhase.PENDING, None, ()),
    (
        "a pod of the current execution on a lost node",
        now(lost=LOST, lost_on=("node-b",), pods=(pod(),)),
        ObjectPhase.RUNNING,
        LOST,
        ("node-a", "node-b"),
    ),
    (
        "a pod of the current execution Running, not deleting",
        now(pods=(pod(), pod("Failed"))),
        ObjectPhase.RUNNING,
        None,
        ("node-a",),
    ),
    (
        "pods of the current execution finishing or deleted",
        now(pods=(pod("Running", deleting=True),)),
        ObjectPhase.STOPPING,
        None,
        ("node-a",),
    ),
    (
        "otherwise (Kueue quota, JobSet or pods not there yet)",
        now(nodes=()),
        ObjectPhase.PENDING,
        None,
        (),
    ),
]


def test_the_table_has_one_case_per_row_in_order() -> None:
    assert [rule.when for rule in ALIVE_RULES] == [case[0] for case in CASES]


@pytest.mark.parametrize(("row", "situation", "phase", "cause", "nodes"), CASES)
def test_each_row(
    row: str,
    situation: Now,
    phase: ObjectPhase,
    cause: Cause | None,
    nodes: tuple[str, ...],
) -> None:
    rule = alive_rule(situation)
    assert rule.when == row
    assert (rule.phase, rule.cause(situation), rule.nodes(situation)) == (phase, cause, nodes)


def test_a_suspended_trainjob_with_finishing_pods_is_pending_not_stopping() -> None:
    # suspended by Kueue (quota taken back) without an eviction recorded: its pods go, it waits
    situation = now(suspended=True, pods=(pod("Failed"),))
    assert alive_rule(situation).phase is ObjectPhase.PENDING


def test_a_pod_gone_is_neither_running_nor_finishing() -> None:
    situation = now(pods=(pod("Running", deleted=True), pod("Failed", deleted=True)))
    assert alive_rule(situation).when.startswith("otherwise")


def test_the_last_row_always_applies() -> None:
    assert ALIVE_RULES[-1].applies(now())

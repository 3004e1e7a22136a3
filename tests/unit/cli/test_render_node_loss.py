"""How the CLI shows a node-loss window (seed 000, "The node-loss fence"): its beginning with
the scheduler's words, its end when the node came back (``node-loss.observed``, ``since``
null)."""

from __future__ import annotations

from datetime import UTC, datetime

from dispatch_cli.render import event_line
from dispatch_core import Cause, CauseKind, ObjectRef, Provenance
from dispatch_core.events import NodeLossObserved

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_node_loss_window_beginning_and_ending_reads_in_the_events() -> None:
    words = "NODE_FAIL: node n2 not responding"
    ref = ObjectRef(cluster="lab", id="41")
    began = NodeLossObserved(
        job_id="j",
        at=T0,
        ref=ref,
        restart=0,
        since=T0,
        cause=Cause(kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail=words),
    )
    line = event_line(7, began)
    assert "lab/41 on a lost node: node-lost" in line, line
    assert words in line, line
    ended = NodeLossObserved(job_id="j", at=T0, ref=ref, restart=0, since=None)
    line = event_line(8, ended)
    assert "lab/41 node back: no longer on a lost node" in line, line
    assert "node-lost" not in line, line

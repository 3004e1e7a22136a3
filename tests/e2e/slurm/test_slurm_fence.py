"""The node-loss fence on the real Slurm test cluster, through the services (seed 000, "The
node-loss fence").

A job runs on a node whose slurmd is killed (``kill -9``): the node stops answering, and the
job is running with cause ``node-lost`` for the declared window (8 s here). Past the window
the supervisor stops it (``scancel``) and applies the plan for ``node-lost``: a replacement is
submitted, excluding the lost node, but its gate isn't opened until Slurm shows the old job
ended (here when slurmctld marks the node down, ``SlurmdTimeout`` = 20 s after it last
answered). The slurmd is started again and the node resumed in a ``finally``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Final

import pytest

from dispatch_core import (
    Action,
    CauseKind,
    ExecutionEnded,
    JobSpec,
    NodeLossObserved,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
    StopRequested,
)
from tests.e2e.slurm.harness import CLUSTER, SlurmRuntime
from tests.integration.slurm.test_slurm_support import require_cluster, resume_node, run
from tests.servers.nats import NatsServer

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

REPO: Final = Path(__file__).resolve().parents[3]
LAB_DIR: Final = Path(os.environ.get("SLURM_LAB_DIR", "/tmp/dispatch-slurm"))
WINDOW_S: Final = 8.0


def _restart_slurmd() -> None:
    subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-cluster.sh"), "start"],
        capture_output=True,
        timeout=180,
        check=False,
    )


@pytest.mark.timeout(400)
async def test_a_node_that_stops_answering_is_fenced_after_the_window(
    slurm_nats: NatsServer, tmp_path: Path
) -> None:
    require_cluster()
    srt = SlurmRuntime(slurm_nats.url, tmp_path / "rt", node_loss_window_s=WINDOW_S)
    await srt.open()
    node = ""
    try:
        await srt.observer()
        await srt.supervisor()
        job_id = f"fence-{secrets.token_hex(3)}"
        spec = JobSpec(cluster=CLUSTER, command=("/bin/sh", "-c", "exec sleep 600"))
        policy = RecoveryPolicy(
            rules=(RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1),)
        )
        await srt.submit(job_id, spec, policy)

        def running(status: Status) -> None:
            assert status.state is State.RUNNING, status
            assert status.submission == 1, status

        await srt.wait_status(job_id, running)
        first = (await srt.job(job_id)).objects[0].ref
        observed = await srt.observed(job_id, first)
        assert observed is not None
        node = observed.nodes[0]
        pid = int((LAB_DIR / "run" / f"slurmd-{node}.pid").read_text())
        os.kill(pid, signal.SIGKILL)

        def lost(status: Status) -> None:
            assert status.state is State.RUNNING, status
            assert status.cause.kind is CauseKind.NODE_LOST, status

        status = await srt.wait_status(job_id, lost, timeout_s=90)
        assert "not_responding" in status.cause.detail, status.cause

        def replaced(status: Status) -> None:
            assert status.state is State.RUNNING, status
            assert status.submission == 2, status

        await srt.wait_status(job_id, replaced, timeout_s=180)
        events = await srt.events(job_id)
        (seen,) = [e for e in events if isinstance(e, NodeLossObserved)]
        (fence,) = [e for e in events if isinstance(e, StopRequested) and e.why == "fence"]
        (ended,) = [e for e in events if isinstance(e, ExecutionEnded)]
        assert seen.since is not None  # the window began (no flap: one fact)
        assert (fence.at - seen.since).total_seconds() >= WINDOW_S
        assert ended.fenced
        assert ended.cause.kind is CauseKind.NODE_LOST
        second = next(o.ref for o in (await srt.job(job_id)).objects if o.submission == 2)
        fields = run("scontrol", "-o", "show", "job", second.id).stdout
        assert f"ExcNodeList={node} " in fields, fields
        # the replacement started only after Slurm showed the old job ended
        rows = run(
            "sacct", "-n", "-P", "-X", "-j", f"{first.id},{second.id}", "-o", "JobID,Start,End"
        ).stdout.splitlines()
        times = {line.split("|")[0]: line.split("|")[1:] for line in rows}
        assert times[second.id][0] >= times[first.id][1], times
    finally:
        await srt.close()
        if node:
            await asyncio.to_thread(_restart_slurmd)
            resume_node(node)

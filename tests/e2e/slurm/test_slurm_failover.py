"""Failover to another cluster (issue 14 part 2), end to end on the real Slurm test cluster,
the real S3 server (SeaweedFS) and a real nats-server.

``examples/slurm/train.py`` runs on the Slurm test cluster (``lab``) with its checkpoint root
on S3 (``s3://<bucket>/<job>``), under a resubmit rule that lists two clusters,
``clusters = ["lab", "local"]``. Once it has published saves on S3, every node of the Slurm
cluster is set down (``scontrol update nodename=... state=down``): Slurm ends the job
``NODE_FAIL`` (dispatch: ``node-lost``) and has no capacity left. The next submission goes to
the local cluster (this machine, the local backend), with a higher epoch; it resumes from the
latest publication the Slurm execution made on S3, finishes, and its final loss equals that
of the same script run once without interruption (computed in the test, never written down).

The nodes are resumed in a ``finally`` whatever happens (later tests share the cluster).

A second test: Slurm refuses every launch of the job (``sbatch: error: invalid partition
specified``: its script asks for a partition the cluster doesn't have), and the rule covers
``launch-failed``: submission 2 runs on the local cluster (where ``#SBATCH`` lines are
comments) and finishes, instead of the job failing ``refused:1``.

A third: every node is down BEFORE the job is submitted, so Slurm never gives it capacity:
it pends (``Nodes required for job are DOWN, DRAINED ...``), which the Slurm backend reports
as cause ``no-capacity``. The rule covers ``no-capacity`` with ``wait_s = 15``: 15 s after the
supervisor first saw it so (a ``no-capacity.observed`` fact in the record), dispatch cancels
it, records submission 1's end as ``no-capacity`` (Slurm's words), and submission 2 runs on
the local cluster and finishes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sys
from datetime import timedelta
from pathlib import Path
from typing import Final

import pytest

import dispatch_backends
from dispatch_ckpt.names import Publication, parse_name
from dispatch_core import (
    Action,
    CauseKind,
    ExecutionEnded,
    Job,
    JobSpec,
    LaunchRefused,
    NoCapacityObserved,
    ProgressObserved,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
    StopRequested,
    SubmissionOpened,
    epoch,
)
from dispatch_core.state import ObjectRef
from tests.e2e.slurm.conftest import S3_BUCKET
from tests.e2e.slurm.harness import CLUSTER, LOCAL, SlurmRuntime, all_nodes_down
from tests.integration.slurm.test_slurm_support import run
from tests.servers.s3 import S3Server
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

REPO: Final = Path(__file__).resolve().parents[3]
TRAIN: Final = REPO / "examples" / "slurm" / "train.py"
_LIBS: Final = Path(dispatch_backends.__file__).resolve().parent.parent
PYTHONPATH: Final = os.pathsep.join([str(_LIBS), str(_LIBS / "ckpt")])
_RESUMED: Final = re.compile(r"^resumed (\S+) epoch=(\d+) step=(\d+)$", re.MULTILINE)
_FINAL: Final = re.compile(r"^final loss (\S+) ", re.MULTILINE)
EPOCHS: Final = 16
EPOCH_S: Final = 1.0
"""At least 16 s of training: the nodes go down after 2 saves, with 14 epochs to go."""
SAVES_BEFORE_DOWN: Final = 2
WAIT_S: Final = 300.0
"""The bound of each wait (generous: a loaded machine starts Python and torch slowly)."""

FAILOVER: Final = RecoveryPolicy(
    rules=(
        RecoveryRule(
            on=(CauseKind.NODE_LOST, CauseKind.NO_CAPACITY, CauseKind.LAUNCH_FAILED),
            action=Action.RESUBMIT,
            budget=2,
            clusters=(CLUSTER, LOCAL),
        ),
        RecoveryRule(on=(CauseKind.NON_ZERO_EXIT,), action=Action.HOLD),
    )
)
"""The example's policy (``examples/slurm/digits-failover.toml``), on the test's clusters."""


def _script(epochs: int = EPOCHS, epoch_s: float = EPOCH_S, sbatch: str = "") -> str:
    """The batch script: ``#SBATCH`` lines (comments on the local backend), then the
    training, by absolute paths (the two clusters run it in different directories)."""
    return (
        "#!/bin/sh\n"
        "#SBATCH --exclusive\n"
        "#SBATCH --mem=1G\n"
        f"{sbatch}"
        f"exec {sys.executable} {TRAIN} --epochs {epochs} --epoch-s {epoch_s}\n"
    )


def _spec(job_id: str, s3_env: dict[str, str], script: str) -> JobSpec:
    return JobSpec(
        cluster=CLUSTER,
        script=script,
        checkpoint=f"s3://{S3_BUCKET}/{job_id}",
        options={"time": "60"},  # minutes, far beyond the training; both backends read it
        env={"PYTHONPATH": PYTHONPATH, "PYTHONUNBUFFERED": "1", **s3_env},
    )


async def _reference(result: Path) -> float:
    """The same script run once, without dispatch, without checkpoints or interruption."""
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    env.pop("DISPATCH_CHECKPOINT", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TRAIN),
        "--epochs",
        str(EPOCHS),
        "--result",
        str(result),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    text = await asyncio.to_thread(result.read_text)
    return float(json.loads(text)["final_loss"])


def _publications(s3: S3Server, prefix: str) -> list[Publication]:
    """The job's ``pub/`` listing on S3, oldest first (epoch, then step)."""
    client = s3.client()
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=S3_BUCKET, Prefix=f"{prefix}/pub/"
    )
    names = [o["Key"].rsplit("/", 1)[1] for page in pages for o in page.get("Contents", ())]
    return sorted((parse_name(n) for n in names), key=lambda p: (p.epoch, p.step))


def _object_of(job: Job, submission: int) -> ObjectRef:
    for obj in job.objects:
        if obj.submission == submission and not obj.duplicate:
            return obj.ref
    raise AssertionError(f"{job.job_id}: no object of submission {submission}")


async def _running(srt: SlurmRuntime, job_id: str, submission: int) -> tuple[ObjectRef, Status]:
    """Wait until submission N runs; return its object and the status."""

    def check(status: Status) -> None:
        assert status.state is State.RUNNING, status
        assert status.submission == submission, status

    status = await srt.wait_status(job_id, check, timeout_s=WAIT_S)
    return _object_of(await srt.job(job_id), submission), status


async def _printed(srt: SlurmRuntime, ref: ObjectRef, pattern: re.Pattern[str]) -> list[str]:
    """Wait until ``ref``'s output has a line matching ``pattern``; return every such line."""

    def found() -> list[str]:
        text = srt.output(ref)
        matches = [m.group(0) for m in pattern.finditer(text)]
        assert matches, f"{ref}: no {pattern.pattern!r} in its output yet: {text!r}"
        return matches

    return await assert_eventually(found, timeout_s=WAIT_S, interval_s=0.5)


@pytest.mark.timeout(900)
async def test_a_job_whose_slurm_nodes_all_go_down_resumes_on_the_local_cluster_from_s3(
    srt_local: SlurmRuntime,
    slurm_s3: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srt = srt_local
    s3_env = slurm_s3.env()
    for key, value in s3_env.items():  # the observers list pub/ on S3 the usual boto3 way
        monkeypatch.setenv(key, value)
    reference = asyncio.create_task(_reference(tmp_path / "reference.json"))
    await srt.observer()
    await srt.observer(cluster=LOCAL)
    await srt.supervisor()
    job_id = f"digits-failover-{secrets.token_hex(3)}"
    await srt.submit(job_id, _spec(job_id, s3_env, _script()), FAILOVER)

    # 1. it runs on Slurm and publishes saves on S3
    ref1, status1 = await _running(srt, job_id, 1)
    assert (ref1.cluster, status1.cluster) == (CLUSTER, CLUSTER)
    assert status1.epoch == epoch(0, 1, 0)

    def published() -> None:
        own = [p for p in _publications(slurm_s3, job_id) if p.epoch == epoch(0, 1, 0)]
        assert len(own) >= SAVES_BEFORE_DOWN, own

    await assert_eventually(published, timeout_s=WAIT_S, interval_s=0.5)

    # 2. every Slurm node goes down: node-lost, and the next submission runs locally
    with all_nodes_down("dispatch failover test"):
        ref2, status2 = await _running(srt, job_id, 2)
    assert (ref2.cluster, status2.cluster) == (LOCAL, LOCAL), (ref2, status2)
    assert status2.epoch == epoch(0, 2, 0)  # the epoch keeps rising across clusters

    # it resumed from the Slurm execution's latest publication on S3
    latest = max(
        (p for p in _publications(slurm_s3, job_id) if p.epoch == epoch(0, 1, 0)),
        key=lambda p: p.step,
    )
    assert latest.step >= SAVES_BEFORE_DOWN
    (line,) = await _printed(srt, ref2, _RESUMED)
    assert line == f"resumed {latest.path} epoch={latest.epoch} step={latest.step}", line
    assert f"DISPATCH_EPOCH={epoch(0, 2, 0)}" in srt.output(ref2)

    # 3. it finishes there, with the uninterrupted run's loss
    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status

    status = await srt.wait_status(job_id, succeeded, timeout_s=WAIT_S)
    (final,) = _FINAL.findall(srt.output(ref2))
    expected = await reference
    assert abs(float(final) - expected) <= 1e-6, (final, expected)
    assert srt.output(ref1).count("final loss") == 0  # the Slurm execution never finished
    last = _publications(slurm_s3, job_id)[-1]  # the local execution published on S3 too
    assert (last.epoch, last.step) == (epoch(0, 2, 0), EPOCHS), last

    # the record: an execution on Slurm ended node-lost, then one on the local cluster
    endings = [e for e in await srt.events(job_id) if isinstance(e, ExecutionEnded)]
    assert [(e.submission, e.ref.cluster, e.cause.kind) for e in endings] == [
        (1, CLUSTER, CauseKind.NODE_LOST),
        (2, LOCAL, CauseKind.NONE),
    ], endings
    assert re.fullmatch(r"NODE_FAIL 0:(0|15) \(NodeDown\)", endings[0].cause.detail), endings
    job = await srt.job(job_id)
    assert [(o.submission, o.ref.cluster) for o in job.objects if not o.duplicate] == [
        (1, CLUSTER),
        (2, LOCAL),
    ]
    opened = [e for e in await srt.events(job_id) if isinstance(e, SubmissionOpened)]
    assert [(e.submission, e.cluster) for e in opened] == [(1, None), (2, LOCAL)], opened
    assert (status.submission, status.cluster) == (2, LOCAL)
    assert srt.escalations == []


@pytest.mark.timeout(600)
async def test_a_job_slurm_refuses_to_launch_runs_on_the_local_cluster(
    srt_local: SlurmRuntime,
    slurm_s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srt = srt_local
    s3_env = slurm_s3.env()
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    await srt.observer()
    await srt.observer(cluster=LOCAL)
    await srt.supervisor()
    job_id = f"digits-refused-{secrets.token_hex(3)}"
    script = _script(epochs=3, epoch_s=0.0, sbatch="#SBATCH --partition=no-such-partition\n")
    await srt.submit(job_id, _spec(job_id, s3_env, script), FAILOVER)

    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status

    status = await srt.wait_status(job_id, succeeded, timeout_s=WAIT_S)
    assert (status.submission, status.cluster) == (2, LOCAL), status
    events = await srt.events(job_id)
    refusals = [e for e in events if isinstance(e, LaunchRefused)]
    assert refusals, events
    assert {e.submission for e in refusals} == {1}, refusals
    assert all("invalid partition" in e.detail.lower() for e in refusals), refusals
    opened = [e for e in events if isinstance(e, SubmissionOpened)]
    assert [(e.submission, e.cluster) for e in opened] == [(1, None), (2, LOCAL)], opened
    job = await srt.job(job_id)
    (ref,) = [o.ref for o in job.objects if not o.duplicate]  # Slurm made none
    assert ref.cluster == LOCAL, ref
    output = srt.output(ref)
    assert f"DISPATCH_EPOCH={epoch(0, 2, 0)}" in output, output
    assert "fresh start" in output, output  # nothing was published before
    assert "final loss" in output, output
    assert [(p.epoch, p.step) for p in _publications(slurm_s3, job_id)] == [
        (epoch(0, 2, 0), step) for step in (1, 2, 3)
    ]
    assert srt.escalations == []


NO_CAPACITY_WAIT_S: Final = 15.0
"""The rule's ``wait_s`` in the no-capacity test: how long the Slurm job may wait."""


@pytest.mark.timeout(600)
async def test_a_job_slurm_has_no_capacity_for_is_cancelled_and_runs_on_the_local_cluster(
    srt_local: SlurmRuntime,
    slurm_s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srt = srt_local
    s3_env = slurm_s3.env()
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    await srt.observer()
    await srt.observer(cluster=LOCAL)
    await srt.supervisor()
    job_id = f"digits-no-capacity-{secrets.token_hex(3)}"
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(
                on=(CauseKind.NO_CAPACITY,),
                action=Action.RESUBMIT,
                budget=1,
                clusters=(CLUSTER, LOCAL),
                wait_s=NO_CAPACITY_WAIT_S,
            ),
        )
    )
    script = _script(epochs=3, epoch_s=0.0)
    with all_nodes_down("dispatch no-capacity test"):
        await srt.submit(job_id, _spec(job_id, s3_env, script), policy)

        # 1. it waits on Slurm for capacity; the status says so, in Slurm's words
        def waiting(status: Status) -> None:
            assert status.state is State.PENDING, status
            assert status.cause.kind is CauseKind.NO_CAPACITY, status
            assert (status.submission, status.cluster) == (1, CLUSTER), status

        waited = await srt.wait_status(job_id, waiting, timeout_s=WAIT_S)
        assert waited.cause.detail.startswith("PENDING ("), waited.cause
        assert "DOWN" in waited.cause.detail or "ReqNodeNotAvail" in waited.cause.detail

        # 2. past wait_s dispatch cancels it, and submission 2 runs on the local cluster
        def succeeded(status: Status) -> None:
            assert status.state is State.SUCCEEDED, status

        status = await srt.wait_status(job_id, succeeded, timeout_s=WAIT_S)
    assert (status.submission, status.cluster) == (2, LOCAL), status
    job = await srt.job(job_id)
    ref1, ref2 = _object_of(job, 1), _object_of(job, 2)
    assert (ref1.cluster, ref2.cluster) == (CLUSTER, LOCAL)
    record1 = job.object(ref1)
    assert record1 is not None
    assert record1.gate_opened_at is not None
    # the Slurm job is gone from the queue, cancelled (squeue keeps an ended job a while)
    shown = run("squeue", "-h", "-j", ref1.id, "-o", "%T", check=False).stdout.split()
    assert shown in ([], ["CANCELLED"]), shown
    assert "final loss" in srt.output(ref2)
    assert srt.output(ref1) == ""  # it never ran on Slurm

    # the record: submission 1 on lab ended no-capacity (not cancelled), 2 on local
    events = await srt.events(job_id)
    (stop,) = [e for e in events if isinstance(e, StopRequested) and e.why == "no-capacity"]
    assert stop.ref == ref1
    # the wait ran from the first no-capacity sighting, a fact in the record, not from the
    # gate's opening; the stop came wait_s after it
    waits = [e for e in events if isinstance(e, NoCapacityObserved) and e.ref == ref1]
    assert waits, events
    began = waits[-1]
    assert began.since is not None, waits
    assert began.cause is not None
    assert began.cause.kind is CauseKind.NO_CAPACITY, began
    assert began.since >= record1.gate_opened_at, (began, record1)
    assert stop.at - began.since >= timedelta(seconds=NO_CAPACITY_WAIT_S), (stop, began)
    endings = [e for e in events if isinstance(e, ExecutionEnded)]
    assert [(e.submission, e.ref.cluster, e.cause.kind) for e in endings] == [
        (1, CLUSTER, CauseKind.NO_CAPACITY),
        (2, LOCAL, CauseKind.NONE),
    ], endings
    assert endings[0].cause.detail == waited.cause.detail, endings
    opened = [e for e in events if isinstance(e, SubmissionOpened)]
    assert [(e.submission, e.cluster) for e in opened] == [(1, None), (2, LOCAL)], opened
    # a wait is not an execution: no progress fact for it
    assert not [e for e in events if isinstance(e, ProgressObserved) and e.ref == ref1]
    assert srt.escalations == []

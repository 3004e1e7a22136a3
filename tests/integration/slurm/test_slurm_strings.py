"""One test per row of the lab's strings table (``shared/slurm-lab/README.md``, "Observed
strings per scenario") that dispatch must classify, on the real Slurm test cluster.

Every job is started through the backend (``sbatch --hold``, then its gate opened) unless the
row is about something a person does with plain Slurm commands; what each test asserts is
what discovery reports: phase, gate, and the cause's kind, provenance, exit code and
Slurm's words verbatim. Rows the backend has nothing to classify in (``scontrol requeue`` of a
pending job or of a ``--no-requeue`` job: errors of a person's command) are left out.

Timings (KillWait 10 s, SlurmdTimeout 20 s, cred_expire 10 s on the test cluster): the time
limit row takes about 80 s, so its job is started when the module starts and checked last;
the slurmd rows about 40 s. Nodes put down are resumed in a ``finally``; a killed slurmd is
started again with ``scripts/slurm-cluster.sh start``. The cgroup OOM row switches the
cluster to ``SLURM_LAB_CGROUP=1`` and back (about 20 s; deselect with ``-k 'not cgroup'``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Final

import pytest

from dispatch_backends.slurm import SlurmBackend
from dispatch_backends.slurm.parse import parse_sinfo
from dispatch_core.state import (
    Cause,
    CauseKind,
    GateState,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)
from tests.contract.backend_contract import make_launch, new_job_id
from tests.integration.slurm.test_slurm_support import (
    CLUSTER,
    SlurmHarness,
    down_node,
    require_cluster,
    resume_node,
    run,
    sbatch,
)
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

REPO: Final = Path(__file__).resolve().parents[3]
CLUSTER_SCRIPT: Final = REPO / "scripts" / "slurm-cluster.sh"
LAB_DIR: Final = Path(os.environ.get("SLURM_LAB_DIR", "/tmp/dispatch-slurm"))
HOG: Final = (
    "import time\n"
    "blocks = []\n"
    "while len(blocks) < 40:\n"
    "    blocks.append(bytearray(25 * 2**20))\n"
    "    time.sleep(0.25)\n"
)
"""Grows by 25 MB every 0.25 s up to 1 GB (the recording's ``hog.sh``)."""


class Lab:
    """The backend on the test cluster, and the helpers the rows share."""

    def __init__(self, tmp: Path) -> None:
        self.harness = SlurmHarness(tmp, accounting_grace_s=20.0)
        self.backend: SlurmBackend = self.harness.backend
        self.tmp = tmp

    async def start(
        self,
        job: str,
        command: str,
        *,
        options: Mapping[str, str] | None = None,
        opened: bool = True,
    ) -> ObjectRef:
        spec = JobSpec(
            cluster=CLUSTER, command=("/bin/sh", "-c", command), options=dict(options or {})
        )
        ref = await self.backend.start(make_launch(job, spec))
        self.harness.started.append(ref)
        if opened:
            await self.backend.open_gate(ref)
        return ref

    async def wait(
        self,
        job: str,
        ref: ObjectRef,
        check: Callable[[ObservedObject], None],
        *,
        timeout_s: float = 90.0,
    ) -> ObservedObject:
        async def shown() -> ObservedObject:
            # expected: a job slurmctld forgot (MinJobAge, 30 s here) is found in accounting
            snapshot = await self.backend.discover(expected=[ref])
            found = [o for o in snapshot.objects.get(job, ()) if o.ref == ref]
            assert found, f"{ref} of {job} not shown"
            check(found[0])
            return found[0]

        return await assert_eventually(shown, timeout_s=timeout_s, interval_s=0.5)

    async def ended(self, job: str, ref: ObjectRef, *, timeout_s: float = 90.0) -> ObservedObject:
        def check(observed: ObservedObject) -> None:
            assert observed.phase is ObjectPhase.ENDED, observed

        return await self.wait(job, ref, check, timeout_s=timeout_s)

    async def phase(
        self, job: str, ref: ObjectRef, phase: ObjectPhase, *, timeout_s: float = 90.0
    ) -> ObservedObject:
        def check(observed: ObservedObject) -> None:
            assert observed.phase is phase, observed

        return await self.wait(job, ref, check, timeout_s=timeout_s)

    async def requeued(self, job: str, ref: ObjectRef, count: int = 1) -> ObservedObject:
        def check(observed: ObservedObject) -> None:
            assert len(observed.executions) >= count, observed

        return await self.wait(job, ref, check)


def assert_cause(
    cause: Cause | None,
    kind: CauseKind,
    provenance: Provenance,
    exit_code: int | None,
    detail: str,
) -> Cause:
    assert cause is not None
    assert (cause.kind, cause.provenance, cause.exit_code, cause.detail) == (
        kind,
        provenance,
        exit_code,
        detail,
    ), cause
    return cause


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    require_cluster()
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        await lab.harness.cleanup()


class _TimeLimit:
    job = new_job_id("tl")
    ref: ObjectRef | None = None


@pytest.fixture(scope="module", autouse=True)
def time_limit_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Starts the time-limit row's job (``--time=1``, ~80 s) when the module starts, so that
    it runs while the other rows do; :func:`test_time_limit` checks it last."""
    require_cluster()
    lab = Lab(tmp_path_factory.mktemp("time-limit"))

    async def start() -> ObjectRef:
        return await lab.start(
            _TimeLimit.job, "sleep 600", options={"time": "1", "nodelist": "node1"}
        )

    _TimeLimit.ref = asyncio.run(start())
    yield
    run("scancel", _TimeLimit.ref.id, check=False)


# -- rows ------------------------------------------------------------------------------------


async def test_just_submitted(lab: Lab) -> None:
    """PENDING, reason None -> Priority/Resources: pending, dispatch's gate closed until it
    opens it, then open (here with ``--begin`` so that it stays pending)."""
    job = new_job_id("sub")
    ref = await lab.start(job, "true", options={"begin": "now+3600"}, opened=False)
    held = await lab.phase(job, ref, ObjectPhase.PENDING)
    assert (held.gate, held.cause, held.submission, held.attempt) == (GateState.CLOSED, None, 1, 1)
    await lab.backend.open_gate(ref)

    def opened(observed: ObservedObject) -> None:
        assert (observed.phase, observed.gate, observed.cause) == (
            ObjectPhase.PENDING,
            GateState.OPEN,
            None,
        )

    await lab.wait(job, ref, opened)


async def test_exit_0(lab: Lab) -> None:
    job = new_job_id("e0")
    ref = await lab.start(job, "exit 0")
    observed = await lab.ended(job, ref)
    assert_cause(observed.cause, CauseKind.NONE, Provenance.APPLICATION, 0, "COMPLETED 0:0")


@pytest.mark.parametrize("code", [1, 3])
async def test_exit_1_and_3(lab: Lab, code: int) -> None:
    job = new_job_id(f"e{code}")
    ref = await lab.start(job, f"exit {code}")
    observed = await lab.ended(job, ref)
    assert_cause(
        observed.cause,
        CauseKind.NON_ZERO_EXIT,
        Provenance.APPLICATION,
        code,
        f"FAILED {code}:0 (NonZeroExitCode)",
    )


async def test_scancel_of_a_running_job(lab: Lab) -> None:
    """A person's ``scancel``: sacct names the uid (``CANCELLED by 0``), slurmctld the
    signal (``0:15``)."""
    job = new_job_id("sc")
    ref = await lab.start(job, "exec sleep 600")
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    run("scancel", ref.id)
    observed = await lab.ended(job, ref)
    cause = assert_cause(
        observed.cause, CauseKind.CANCELLED, Provenance.ACTOR, None, "CANCELLED by 0 0:15"
    )
    assert cause.actor is not None
    assert cause.actor.name == "root (uid 0)"


async def test_scancel_when_script_and_child_ignore_sigterm(lab: Lab) -> None:
    """COMPLETING for KillWait, then CANCELLED with ``0:9``."""
    job = new_job_id("si")
    ref = await lab.start(job, "trap '' TERM; sh -c \"trap '' TERM; sleep 600\"; sleep 600")
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    run("scancel", ref.id)
    await lab.phase(job, ref, ObjectPhase.STOPPING, timeout_s=8)
    observed = await lab.ended(job, ref, timeout_s=60)
    assert_cause(observed.cause, CauseKind.CANCELLED, Provenance.ACTOR, None, "CANCELLED by 0 0:9")


async def test_scancel_of_a_pending_job(lab: Lab) -> None:
    """The last pending reason stays: ``CANCELLED by 0 0:0 (BeginTime)``."""
    job = new_job_id("sp")
    ref = await lab.start(job, "true", options={"begin": "now+3600"})

    def begin_time(observed: ObservedObject) -> None:
        assert observed.phase is ObjectPhase.PENDING
        assert observed.gate is GateState.OPEN
        # after the release the reason is None until the next scheduler pass says BeginTime
        assert run("squeue", "-h", "-j", ref.id, "-o", "%r").stdout.strip() == "BeginTime"

    await lab.wait(job, ref, begin_time)
    run("scancel", ref.id)
    observed = await lab.ended(job, ref)
    assert_cause(
        observed.cause,
        CauseKind.CANCELLED,
        Provenance.ACTOR,
        None,
        "CANCELLED by 0 0:0 (BeginTime)",
    )
    assert observed.nodes == ()


async def test_scontrol_requeue_of_a_running_job(lab: Lab) -> None:
    """PENDING/BeginTime with Restarts=1 (the same as preemption and node failure); sacct's
    earlier row says ``REQUEUED``."""
    job = new_job_id("rq")
    ref = await lab.start(job, "sleep 600", options={"requeue": "yes", "exclude": "node1"})
    running = await lab.phase(job, ref, ObjectPhase.RUNNING)
    run("scontrol", "requeue", ref.id)
    observed = await lab.requeued(job, ref)
    assert observed.restarts == 1
    (execution,) = observed.executions
    assert (execution.restart, execution.nodes) == (0, running.nodes)
    assert_cause(execution.cause, CauseKind.REQUEUED, Provenance.SCHEDULER, None, "REQUEUED 0:0")


async def test_scontrol_requeue_of_a_failed_job(lab: Lab) -> None:
    """The old code stays: the run ended ``FAILED 1:0`` (what dispatch records when it sees
    the end); after ``scontrol requeue`` sacct rewrites that run's row as ``REQUEUED 1:0``,
    so the execution reads requeued, with the code in the words."""
    job = new_job_id("rf")
    ref = await lab.start(job, "exit 1", options={"requeue": "yes", "exclude": "node1"})
    ended = await lab.ended(job, ref)
    assert_cause(
        ended.cause,
        CauseKind.NON_ZERO_EXIT,
        Provenance.APPLICATION,
        1,
        "FAILED 1:0 (NonZeroExitCode)",
    )
    run("scontrol", "requeue", ref.id)
    observed = await lab.requeued(job, ref)
    assert observed.restarts == 1
    assert_cause(
        observed.executions[0].cause, CauseKind.REQUEUED, Provenance.SCHEDULER, None, "REQUEUED 1:0"
    )


async def test_scontrol_requeuehold(lab: Lab) -> None:
    """``job requeued in held state``: the earlier run requeued, the gate closed again."""
    job = new_job_id("rh")
    ref = await lab.start(job, "sleep 600", options={"requeue": "yes", "exclude": "node1"})
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    run("scontrol", "requeuehold", ref.id)

    def held_again(observed: ObservedObject) -> None:
        # briefly COMPLETING with Restarts=1 (stopping), then held
        assert (observed.phase, observed.gate) == (ObjectPhase.PENDING, GateState.CLOSED)
        assert observed.executions

    observed = await lab.wait(job, ref, held_again)
    assert_cause(
        observed.executions[0].cause, CauseKind.REQUEUED, Provenance.SCHEDULER, None, "REQUEUED 0:0"
    )


async def test_sbatch_hold(lab: Lab) -> None:
    """``JobHeldUser``: dispatch's own gate, closed; it never started: accounting has no
    row for it, or a PENDING one (slurmctld sends its pending jobs to slurmdbd too, e.g.
    after reconnecting to it; seen in CI)."""
    job = new_job_id("h")
    ref = await lab.start(job, "true", opened=False)
    observed = await lab.phase(job, ref, ObjectPhase.PENDING)
    assert (observed.gate, observed.cause) == (GateState.CLOSED, None)
    out = run("sacct", "-n", "-P", "-X", "-j", ref.id, "-o", "State").stdout
    assert out.strip() in ("", "PENDING"), out


async def test_scontrol_hold_by_root(lab: Lab) -> None:
    """``JobHeldAdmin``: admin-held, cause held with Slurm's words; dispatch never opens it."""
    job = new_job_id("ah")
    ref = await lab.start(job, "true", opened=False)
    await lab.phase(job, ref, ObjectPhase.PENDING)
    run("scontrol", "hold", ref.id)

    def admin(observed: ObservedObject) -> None:
        assert observed.gate is GateState.ADMIN_HELD, observed

    observed = await lab.wait(job, ref, admin)
    assert_cause(
        observed.cause, CauseKind.HELD, Provenance.SCHEDULER, None, "PENDING (JobHeldAdmin)"
    )
    from dispatch_backends.slurm import AdminHeldError

    with pytest.raises(AdminHeldError):
        await lab.backend.open_gate(ref)
    again = await lab.phase(job, ref, ObjectPhase.PENDING)
    assert again.gate is GateState.ADMIN_HELD


async def test_scontrol_uhold_by_root(lab: Lab) -> None:
    """``JobHeldUser`` again: a closed gate (indistinguishable from dispatch's own)."""
    job = new_job_id("uh")
    ref = await lab.start(job, "true", options={"begin": "now+3600"})
    await lab.phase(job, ref, ObjectPhase.PENDING)
    run("scontrol", "uhold", ref.id)

    def closed(observed: ObservedObject) -> None:
        assert (observed.phase, observed.gate, observed.cause) == (
            ObjectPhase.PENDING,
            GateState.CLOSED,
            None,
        )

    await lab.wait(job, ref, closed)


async def test_dependency_on_a_running_job(lab: Lab) -> None:
    """``Dependency``: pending, gate open, nothing to say yet."""
    parent = sbatch(
        "--job-name=parent", "--output=/dev/null", "--exclude=node1", "--wrap", "sleep 120"
    )
    try:
        job = new_job_id("dep")
        ref = await lab.start(job, "true", options={"dependency": f"afterok:{parent}"})

        def waiting(observed: ObservedObject) -> None:
            assert (observed.phase, observed.gate, observed.cause) == (
                ObjectPhase.PENDING,
                GateState.OPEN,
                None,
            )
            # None right after the release, Dependency from the next scheduler pass
            reason = run("squeue", "-h", "-j", ref.id, "-o", "%r").stdout.strip()
            assert reason == "Dependency"

        await lab.wait(job, ref, waiting)
    finally:
        run("scancel", parent, check=False)


async def test_dependency_never_satisfied(lab: Lab) -> None:
    """``DependencyNeverSatisfied``: still pending (it never runs until cancelled)."""
    parent = sbatch("--job-name=parent", "--output=/dev/null", "--wrap", "exit 1")
    job = new_job_id("dns")
    ref = await lab.start(job, "true", options={"dependency": f"afterok:{parent}"})

    def never(observed: ObservedObject) -> None:
        assert (observed.phase, observed.cause) == (ObjectPhase.PENDING, None)
        reason = run("squeue", "-h", "-j", ref.id, "-o", "%r").stdout.strip()
        assert reason == "DependencyNeverSatisfied"

    await lab.wait(job, ref, never)


async def test_requeueable_job_that_exits_1_is_not_requeued(lab: Lab) -> None:
    """``--requeue`` applies to node failure, preemption and ``scontrol requeue`` only."""
    job = new_job_id("rx")
    ref = await lab.start(job, "exit 1", options={"requeue": "yes"})
    observed = await lab.ended(job, ref)
    assert (observed.submission, observed.attempt, observed.restarts) == (1, 1, 0)
    assert_cause(
        observed.cause,
        CauseKind.NON_ZERO_EXIT,
        Provenance.APPLICATION,
        1,
        "FAILED 1:0 (NonZeroExitCode)",
    )


async def test_node_state_fail_while_a_job_runs(lab: Lab) -> None:
    """``failing``: the job goes on; dispatch sees it running, not on a lost node."""
    job = new_job_id("nf")
    ref = await lab.start(job, "sleep 600", options={"nodelist": "node3"})
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    try:
        run("scontrol", "update", "nodename=node3", "state=fail", "reason=dispatch test")
        print(
            run("scontrol", "show", "node", "node3").stdout[:400],
            run("squeue", "-t", "all", "-w", "node3").stdout,
        )
        out = run("sinfo", "-h", "-N", "-n", "node3", "-O", "NodeList:|,StateComplete:|,Reason:|")
        node = parse_sinfo(out.stdout)["node3"]
        # sinfo %T said "failing" once and "fail" the next time; StateComplete: mixed+fail
        assert "fail" in node.parts[1:], node
        assert not node.lost
        observed = await lab.phase(job, ref, ObjectPhase.RUNNING)
        assert observed.cause is None
    finally:
        run("scancel", ref.id, check=False)
        await asyncio.sleep(1)
        resume_node("node3")


async def test_node_state_down_requeueable_job(lab: Lab) -> None:
    """Slurm requeues it; sacct's earlier row says ``NODE_FAIL``; the run's node is kept."""
    job = new_job_id("nd")
    ref = await lab.start(job, "sleep 600", options={"requeue": "yes", "nodelist": "node3"})
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    with down_node("node3"):
        observed = await lab.requeued(job, ref)
        (execution,) = observed.executions
        assert execution.nodes == ("node3",)
        assert_cause(
            execution.cause, CauseKind.NODE_LOST, Provenance.SCHEDULER, None, "NODE_FAIL 0:0"
        )
        assert observed.phase is ObjectPhase.PENDING
        run("scancel", ref.id, check=False)


async def test_node_state_down_no_requeue_job(lab: Lab) -> None:
    """dispatch's default (``--no-requeue``): the job ends ``NODE_FAIL`` (NodeDown)."""
    job = new_job_id("nn")
    ref = await lab.start(job, "sleep 600", options={"nodelist": "node3"})
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    with down_node("node3"):
        observed = await lab.ended(job, ref)
    cause = observed.cause
    assert cause is not None
    assert (cause.kind, cause.provenance, cause.exit_code) == (
        CauseKind.NODE_LOST,
        Provenance.SCHEDULER,
        None,
    )
    # the exit status is 0:0, becoming 0:15 once the node's slurmd has killed the job
    assert cause.detail in ("NODE_FAIL 0:0 (NodeDown)", "NODE_FAIL 0:15 (NodeDown)")
    assert observed.nodes == ("node3",)


async def test_three_node_job_one_node_down(lab: Lab) -> None:
    """The whole job is requeued: one execution node-lost, on all three nodes."""
    job = new_job_id("n3")
    ref = await lab.start(job, "srun sleep 600", options={"requeue": "yes", "nodes": "3"})
    running = await lab.phase(job, ref, ObjectPhase.RUNNING)
    assert len(running.nodes) == 3
    with down_node("node2"):
        observed = await lab.requeued(job, ref)
        run("scancel", ref.id, check=False)
    (execution,) = observed.executions
    assert execution.nodes == running.nodes
    assert_cause(execution.cause, CauseKind.NODE_LOST, Provenance.SCHEDULER, None, "NODE_FAIL 0:0")


async def test_preempted_requeue_mode(lab: Lab) -> None:
    """Partition ``low`` (PreemptMode=REQUEUE): squeue shows PENDING/BeginTime only; sacct's
    earlier row says ``PREEMPTED``."""
    job = new_job_id("pr")
    ref = await lab.start(
        job,
        "sleep 600",
        options={"requeue": "yes", "partition": "low", "nodelist": "node2", "exclusive": ""},
    )
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    preemptor = sbatch(
        "-p", "high", "-w", "node2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 5"
    )
    try:
        observed = await lab.requeued(job, ref)
        (execution,) = observed.executions
        assert_cause(
            execution.cause, CauseKind.PREEMPTED, Provenance.SCHEDULER, None, "PREEMPTED 0:0"
        )
        assert execution.nodes == ("node2",)
    finally:
        run("scancel", preemptor, ref.id, check=False)


async def test_preempted_cancel_mode(lab: Lab) -> None:
    """Partition ``lowcancel`` (PreemptMode=CANCEL): the job ends ``PREEMPTED``."""
    job = new_job_id("pc")
    ref = await lab.start(
        job, "sleep 600", options={"partition": "lowcancel", "nodelist": "node2", "exclusive": ""}
    )
    await lab.phase(job, ref, ObjectPhase.RUNNING)
    preemptor = sbatch(
        "-p", "high", "-w", "node2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 5"
    )
    try:
        observed = await lab.ended(job, ref)
    finally:
        run("scancel", preemptor, check=False)
    assert_cause(observed.cause, CauseKind.PREEMPTED, Provenance.SCHEDULER, None, "PREEMPTED 0:15")


async def test_high_job_waits_for_debug_jobs(lab: Lab) -> None:
    """``debug`` (PreemptMode=OFF) is never preempted: a ``high`` job waits (Resources)."""
    blocker = sbatch("-w", "node2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 120")
    try:

        def blocking() -> None:  # else the high job, of a higher tier, would get node2 first
            assert run("squeue", "-h", "-j", blocker, "-o", "%T").stdout.strip() == "RUNNING"

        await assert_eventually(blocking, timeout_s=60, interval_s=0.5)
        job = new_job_id("hi")
        ref = await lab.start(
            job, "true", options={"partition": "high", "nodelist": "node2", "exclusive": ""}
        )

        def waits(observed: ObservedObject) -> None:
            assert (observed.phase, observed.gate, observed.cause) == (
                ObjectPhase.PENDING,
                GateState.OPEN,
                None,
            )
            reason = run("squeue", "-h", "-j", ref.id, "-o", "%r").stdout.strip()
            assert reason == "Resources"

        await lab.wait(job, ref, waits)
    finally:
        run("scancel", blocker, check=False)


async def test_memory_over_limit_with_overmemorykill(lab: Lab) -> None:
    """Without cgroups: ``FAILED 0:9`` with reason ``JobLaunchFailure`` (the lab's trap): a
    SIGKILL whose cause Slurm's state doesn't say; the batch step's MaxRSS, read in the same
    sacct call, reached its memory request, so it is out-of-memory with both figures (issue
    15), never a guess."""
    job = new_job_id("om")
    ref = await lab.start(job, f"exec python3 -c '{HOG}'", options={"mem": "100M"})
    observed = await lab.ended(job, ref)
    cause = observed.cause
    assert cause is not None
    assert (cause.kind, cause.provenance, cause.exit_code) == (
        CauseKind.OUT_OF_MEMORY,
        Provenance.SCHEDULER,
        None,
    )
    assert re.fullmatch(
        r"FAILED 0:9 \(JobLaunchFailure\); batch CANCELLED by 0 0:9: MaxRSS \d+K reached its "
        r"memory request 100M",
        cause.detail,
    ), cause.detail


# -- slurmd killed ------------------------------------------------------------------------------


def _cluster_start(**env: str) -> subprocess.CompletedProcess[str]:
    """``scripts/slurm-cluster.sh start`` (starts what isn't running, applies ``env``'s
    settings, resumes down nodes); ``SLURM_LAB_CGROUP`` is 0 unless given."""
    full = {k: v for k, v in os.environ.items() if k != "SLURM_LAB_CGROUP"}
    full.update(env)
    return subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "start"],
        env=full,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _slurmd_pid(node: str) -> int:
    return int((LAB_DIR / "run" / f"slurmd-{node}.pid").read_text().strip())


async def test_slurmd_killed_requeueable_and_no_requeue_jobs(lab: Lab) -> None:
    """``kill -9`` of node3's slurmd under two jobs: while the node doesn't answer
    (``allocated*``, then ``down*`` with ``Not responding``) both are running with cause
    node-lost (the node-loss window's case); when slurmctld gives up on the node the
    requeueable one lives on with a ``NODE_FAIL`` execution and the other ends ``NODE_FAIL``.
    Both are cancelled before slurmd is started again (the lab's relaunch race)."""
    requeueable, plain = new_job_id("kr"), new_job_id("kn")
    ref_r = await lab.start(
        requeueable, "sleep 600", options={"requeue": "yes", "nodelist": "node3"}
    )
    ref_p = await lab.start(plain, "sleep 600", options={"nodelist": "node3"})
    await lab.phase(requeueable, ref_r, ObjectPhase.RUNNING)
    await lab.phase(plain, ref_p, ObjectPhase.RUNNING)
    try:
        os.kill(_slurmd_pid("node3"), signal.SIGKILL)

        def lost(observed: ObservedObject) -> None:
            assert observed.phase is ObjectPhase.RUNNING, observed
            assert observed.cause is not None, observed

        seen = await lab.wait(plain, ref_p, lost, timeout_s=90)
        cause = seen.cause
        assert cause is not None
        assert (cause.kind, cause.provenance, cause.exit_code) == (
            CauseKind.NODE_LOST,
            Provenance.SCHEDULER,
            None,
        )
        assert cause.detail.startswith("node node3 "), cause.detail
        assert "not_responding" in cause.detail, cause.detail
        assert cause.at is not None
        again = await lab.phase(plain, ref_p, ObjectPhase.RUNNING)
        assert again.cause is None or again.cause.at == cause.at  # the window doesn't move

        requeued = await lab.requeued(requeueable, ref_r)
        assert_cause(
            requeued.executions[0].cause,
            CauseKind.NODE_LOST,
            Provenance.SCHEDULER,
            None,
            "NODE_FAIL 0:0",
        )
        ended = await lab.ended(plain, ref_p)
        assert ended.cause is not None
        assert (ended.cause.kind, ended.cause.exit_code) == (CauseKind.NODE_LOST, None)
        assert ended.cause.detail.startswith("NODE_FAIL 0:")
        assert ended.cause.detail.endswith("(NodeDown)")
    finally:
        run("scancel", ref_r.id, ref_p.id, check=False)
        await asyncio.sleep(1)
        await asyncio.to_thread(_cluster_start)
        resume_node("node3")


# -- the cgroup OOM row (switches the cluster's mode and back) ------------------------------------


async def test_memory_over_limit_with_cgroup(lab: Lab) -> None:
    """With ``SLURM_LAB_CGROUP=1``: ``OUT_OF_MEMORY 0:125 (OutOfMemory)`` -> out-of-memory."""
    switched = await asyncio.to_thread(_cluster_start, SLURM_LAB_CGROUP="1")
    try:
        if switched.returncode != 0:
            reason = f"the cluster can't run with cgroups here: {switched.stderr[-400:]}"
            if os.environ.get("DISPATCH_REQUIRE_SERVICES") == "1":
                pytest.fail(reason)  # CI's machines have cgroup v1: a skip would hide a gap
            pytest.skip(reason)
        job = new_job_id("oc")
        ref = await lab.start(job, f"exec python3 -c '{HOG}'", options={"mem": "100M"})
        observed = await lab.ended(job, ref)
        assert_cause(
            observed.cause,
            CauseKind.OUT_OF_MEMORY,
            Provenance.SCHEDULER,
            None,
            "OUT_OF_MEMORY 0:125 (OutOfMemory); batch OUT_OF_MEMORY 0:125",  # with its step
        )
    finally:
        await asyncio.to_thread(_cluster_start)


# -- last: the time limit started with the module -----------------------------------------------


@pytest.mark.timeout(240)
async def test_time_limit(lab: Lab) -> None:
    """``--time=1``: TIMEOUT after about 80 s; the exit status is racy (``0:15`` or
    ``143:0``), so the kind comes from the State alone. By the time this row is checked
    slurmctld may have forgotten the job (``MinJobAge``): then sacct's job row says it,
    ``TIMEOUT 0:0``."""
    ref = _TimeLimit.ref
    assert ref is not None
    observed = await lab.ended(_TimeLimit.job, ref, timeout_s=200)
    cause = observed.cause
    assert cause is not None
    assert (cause.kind, cause.provenance, cause.exit_code) == (
        CauseKind.TIME_LIMIT,
        Provenance.SCHEDULER,
        None,
    )
    assert cause.detail in ("TIMEOUT 0:15 (TimeLimit)", "TIMEOUT 143:0 (TimeLimit)", "TIMEOUT 0:0")

"""The local backend beyond the contract: restarts, limits, kill waits, causes, cessation."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from dispatch_backends import LaunchRefusedError, local_runner, object_name
from dispatch_backends.local import LocalBackend, ObjectNotFound, parse_time_limit
from dispatch_core.errors import EpochOutOfRange
from dispatch_core.state import (
    CauseKind,
    GateState,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)
from tests.contract.backend_contract import Program, make_launch, new_job_id
from tests.integration.backends.local_harness import CLUSTER, LocalHarness, shell
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

TRAP_TERM = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
"""A job that ignores SIGTERM (its sleeps inherit the ignored signal) and says when it does."""


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[LocalHarness]:
    harness = LocalHarness(tmp_path / "data", kill_wait_s=0.5)
    try:
        yield harness
    finally:
        await harness.cleanup()


async def start(
    harness: LocalHarness, job: str, command: tuple[str, ...], **options: str
) -> ObjectRef:
    spec = JobSpec(cluster=CLUSTER, command=command, options=options)
    ref = await harness.backend.start(make_launch(job, spec))
    harness.started.append(ref)
    return ref


async def run(
    harness: LocalHarness, job: str, command: tuple[str, ...], **options: str
) -> ObjectRef:
    """Start and open the gate."""
    ref = await start(harness, job, command, **options)
    await harness.backend.open_gate(ref)
    return ref


async def wait_output(harness: LocalHarness, ref: ObjectRef, text: str) -> None:
    async def printed() -> None:
        assert text in await harness.output(ref), f"{ref} has not printed {text!r}"

    await assert_eventually(printed, timeout_s=harness.settle_timeout_s)


def read_json(path: Path) -> dict[str, object]:
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


# -- restarts ---------------------------------------------------------------------------------


async def test_objects_survive_a_restart_of_the_backend(harness: LocalHarness) -> None:
    running_job, pending_job = new_job_id(), new_job_id()
    running = await harness.start(running_job, Program.SLEEP, submission=4, attempt=2)
    pending = await harness.start(pending_job, Program.SUCCEED)
    await harness.backend.open_gate(running)
    await harness.wait_phase(running_job, running, ObjectPhase.RUNNING)

    # A new backend (as after a restart of the observer or supervisor) on the same directory.
    again = LocalBackend(CLUSTER, harness.data_dir, kill_wait_s=0.5)
    snapshot = await again.discover()
    (seen_running,) = snapshot.objects[running_job]
    (seen_pending,) = snapshot.objects[pending_job]
    assert seen_running.ref == running
    assert seen_running.phase is ObjectPhase.RUNNING
    assert (seen_running.name, seen_running.submission, seen_running.attempt) == (
        object_name(running_job),
        4,
        2,
    )
    assert seen_pending.phase is ObjectPhase.PENDING
    assert seen_pending.gate is GateState.CLOSED

    # ... which can act on them.
    await again.stop(running)
    await again.open_gate(pending)
    stopped = await harness.wait_phase(running_job, running, ObjectPhase.ENDED)
    assert stopped.cause is not None
    assert stopped.cause.kind is CauseKind.CANCELLED
    finished = await harness.wait_phase(pending_job, pending, ObjectPhase.ENDED)
    assert finished.cause is not None
    assert finished.cause.kind is CauseKind.NONE

    # Ids keep counting across instances: nothing is ever reused.
    other = await again.start(make_launch(new_job_id(), harness.spec(Program.SUCCEED)))
    harness.started.append(other)
    assert int(other.id) > max(int(running.id), int(pending.id))


# -- time limit -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5", 300),
        ("0:03", 3),
        ("1:30", 90),
        ("1:00:05", 3605),
        ("2-0", 172800),
        ("1-2:03", 93780),
        ("1-0:0:7", 86407),
        ("0", None),
        ("0:00", None),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_time_limit_uses_slurms_format(value: str, seconds: int | None) -> None:
    assert parse_time_limit(value) == seconds


@pytest.mark.parametrize("value", ["", "soon", "1:2:3:4", "-5", "1.5", "1-", "a-1", "1:-2"])
def test_time_limit_that_does_not_parse_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="invalid time limit"):
        parse_time_limit(value)


async def test_time_limit_ends_the_object(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await run(harness, job, shell("exec sleep 60"), time="0:01")
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.TIME_LIMIT
    assert observed.cause.provenance is Provenance.SCHEDULER
    assert observed.cause.detail == "time limit 1 s reached"
    assert observed.cause.at is not None


async def test_an_invalid_time_limit_is_a_refused_launch(harness: LocalHarness) -> None:
    job = new_job_id()
    with pytest.raises(LaunchRefusedError, match="invalid time limit 'soon'"):
        await start(harness, job, shell("exit 0"), time="soon")
    assert job not in (await harness.discover()).objects


# -- stop and the kill wait -------------------------------------------------------------------


async def test_stop_sends_sigterm_and_a_job_that_exits_on_it_is_cancelled(
    harness: LocalHarness,
) -> None:
    job = new_job_id()
    ref = await run(harness, job, shell("trap 'exit 0' TERM; echo ready; while :; do :; done"))
    await wait_output(harness, ref, "ready")
    await harness.backend.stop(ref)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.CANCELLED
    assert observed.cause.provenance is Provenance.SCHEDULER
    assert observed.cause.detail == "stopped by dispatch (SIGTERM)"
    assert observed.cause.exit_code == 0  # its own exit, kept


async def test_kill_wait_is_honoured_before_sigkill(tmp_path: Path) -> None:
    harness = LocalHarness(tmp_path / "data", kill_wait_s=1.5)
    try:
        job = new_job_id()
        ref = await run(harness, job, shell(TRAP_TERM))
        await wait_output(harness, ref, "ready")
        stopped_at = time.monotonic()
        await harness.backend.stop(ref)
        assert time.monotonic() - stopped_at < 1.0, "stop must return without the kill wait"
        stopping = await harness.find(job, ref)
        assert stopping is not None
        # (Ended is only acceptable if this machine stalled for the whole kill wait.)
        assert stopping.phase is ObjectPhase.STOPPING or time.monotonic() - stopped_at >= 1.5
        observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
        assert time.monotonic() - stopped_at >= 1.5 - 0.1, "SIGKILL came before the kill wait"
        assert observed.cause is not None
        assert observed.cause.kind is CauseKind.CANCELLED
        assert observed.cause.detail == "stopped by dispatch (SIGKILL after kill wait 1.5 s)"
        assert observed.cause.exit_code is None
    finally:
        await harness.cleanup()


async def test_stop_of_an_unknown_object_is_harmless_and_open_gate_is_an_error(
    harness: LocalHarness,
) -> None:
    ghost = ObjectRef(cluster=CLUSTER, id="999")
    await harness.backend.stop(ghost)
    await harness.backend.emergency_stop(ghost)
    with pytest.raises(ObjectNotFound):
        await harness.backend.open_gate(ghost)
    with pytest.raises(ObjectNotFound):
        await harness.backend.open_gate(ObjectRef(cluster="elsewhere", id="1"))


async def test_emergency_stop_kills_at_once(tmp_path: Path) -> None:
    harness = LocalHarness(tmp_path / "data", kill_wait_s=60.0)
    try:
        job = new_job_id()
        ref = await run(harness, job, shell(TRAP_TERM))
        await wait_output(harness, ref, "ready")
        await harness.backend.emergency_stop(ref)

        async def ended() -> ObservedObject:
            observed = await harness.find(job, ref)
            assert observed is not None
            assert observed.phase is ObjectPhase.ENDED
            return observed

        # Well inside the 60 s kill wait.
        observed = await assert_eventually(ended, timeout_s=20.0)
        assert observed.cause is not None
        assert observed.cause.kind is CauseKind.CANCELLED
        assert observed.cause.detail == "emergency stop by dispatch (SIGKILL)"
        answer = await harness.backend.cessation(ref, observed.nodes)
        assert answer.ceased, answer
    finally:
        await harness.cleanup()


async def test_emergency_stop_of_a_pending_object_ends_it_unrun(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SUCCEED)
    await harness.backend.emergency_stop(ref)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.CANCELLED
    assert await harness.execution_env(ref) is None


# -- causes -----------------------------------------------------------------------------------


async def test_a_process_killed_by_a_signal_is_unknown_with_the_signal_in_words(
    harness: LocalHarness,
) -> None:
    job = new_job_id()
    ref = await run(harness, job, shell("kill -KILL $$"))
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.UNKNOWN
    assert observed.cause.provenance is Provenance.SCHEDULER
    assert observed.cause.detail == "killed by signal 9 (SIGKILL)"
    assert observed.cause.exit_code is None


async def test_a_command_that_cannot_run_is_launch_failed(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await run(harness, job, ("/nonexistent/train",))
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.LAUNCH_FAILED
    assert observed.cause.detail.startswith("cannot execute '/nonexistent/train'")

    elsewhere = new_job_id()  # the program exists; the working directory doesn't
    ref = await run(harness, elsewhere, ("/bin/true",), chdir="/nonexistent/run")
    observed = await harness.wait_phase(elsewhere, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.LAUNCH_FAILED
    assert observed.cause.detail.startswith("cannot enter the working directory '/nonexistent/run'")


async def test_scripts_env_and_working_directory(harness: LocalHarness, tmp_path: Path) -> None:
    job = new_job_id()
    workdir = tmp_path / "work"
    workdir.mkdir()
    spec = JobSpec(
        cluster=CLUSTER,
        script='#!/bin/sh\necho "$GREETING from $(pwd)"\nexit 4\n',
        env={"GREETING": "hello", "DISPATCH_JOB": "spoofed"},
        options={"chdir": str(workdir), "partition": "ignored-here"},
    )
    ref = await harness.backend.start(make_launch(job, spec))
    harness.started.append(ref)
    await harness.backend.open_gate(ref)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.exit_code == 4
    assert (await harness.output(ref)).strip() == f"hello from {workdir}"

    plain = new_job_id()  # no "#!": run by /bin/sh; dispatch's variables win over spec.env
    spec = JobSpec(cluster=CLUSTER, script='echo "$DISPATCH_JOB"', env={"DISPATCH_JOB": "x"})
    ref = await harness.backend.start(make_launch(plain, spec))
    harness.started.append(ref)
    await harness.backend.open_gate(ref)
    await harness.wait_phase(plain, ref, ObjectPhase.ENDED)
    assert (await harness.output(ref)).strip() == plain


async def test_a_spec_with_nothing_to_run_is_refused(harness: LocalHarness) -> None:
    with pytest.raises(LaunchRefusedError, match="nothing to run"):
        await harness.backend.start(make_launch(new_job_id(), JobSpec(cluster=CLUSTER)))


async def test_start_refuses_when_the_runner_cannot_start(tmp_path: Path) -> None:
    harness = LocalHarness(tmp_path / "data", python="/nonexistent/python3")
    job = new_job_id()
    with pytest.raises(LaunchRefusedError, match="cannot start the runner"):
        await harness.start(job, Program.SUCCEED)
    assert job not in (await harness.discover()).objects


# -- cessation --------------------------------------------------------------------------------


async def test_cessation_waits_for_every_process_of_the_group(tmp_path: Path) -> None:
    """The object ends when its command exits, but a child left in its process group keeps
    it from having ceased until the runner's clean-up kills it (seed 004)."""
    harness = LocalHarness(tmp_path / "data", kill_wait_s=5.0)
    try:
        job = new_job_id()
        # The command exits once its child ignores SIGTERM, leaving it in the group.
        child = "(trap '' TERM; touch trapped; while :; do sleep 0.05; done) &"
        wait = "while [ ! -e trapped ]; do sleep 0.01; done"
        ref = await run(harness, job, shell(f"{child} {wait}"), chdir=str(tmp_path))
        observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
        assert observed.cause is not None
        assert observed.cause.kind is CauseKind.NONE
        answer = await harness.backend.cessation(ref, observed.nodes)
        assert not answer.ceased, answer
        assert "alive" in answer.detail

        async def ceased() -> None:
            answer = await harness.backend.cessation(ref, observed.nodes)
            assert answer.ceased, answer

        await assert_eventually(ceased, timeout_s=harness.settle_timeout_s)
    finally:
        await harness.cleanup()


async def test_cessation_of_running_and_never_run_objects(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SLEEP)
    answer = await harness.backend.cessation(ref, ())
    assert answer.ceased, "an object that never ran has no process"
    await harness.backend.open_gate(ref)
    running = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
    assert not (await harness.backend.cessation(ref, running.nodes)).ceased
    await harness.backend.stop(ref)
    await harness.wait_phase(job, ref, ObjectPhase.ENDED)

    async def ceased() -> None:
        assert (await harness.backend.cessation(ref, running.nodes)).ceased

    await assert_eventually(ceased, timeout_s=harness.settle_timeout_s)
    with pytest.raises(ObjectNotFound):
        await harness.backend.cessation(ObjectRef(cluster=CLUSTER, id="999"), ())


# -- ended objects and vanished runners ------------------------------------------------------


async def test_ended_objects_are_archived_after_the_retention(tmp_path: Path) -> None:
    harness = LocalHarness(tmp_path / "data", retain_ended_s=0.0)
    try:
        job = new_job_id()
        ref = await harness.start(job, Program.SUCCEED)
        await harness.backend.open_gate(ref)

        async def gone() -> None:
            assert job not in (await harness.discover()).objects

        await assert_eventually(gone, timeout_s=harness.settle_timeout_s)
        assert (tmp_path / "data" / "archive" / ref.id / "status.json").exists()
        assert (await harness.backend.cessation(ref, ())).ceased
        assert harness.backend.object_dir(ref).parent.name == "archive"
    finally:
        await harness.cleanup()


def kill_runner(harness: LocalHarness, ref: ObjectRef) -> None:
    runner = read_json(harness.backend.object_dir(ref) / "runner.json")
    pid = runner["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)


async def test_a_pending_object_whose_runner_vanished_has_ended(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SUCCEED)
    kill_runner(harness, ref)
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.UNKNOWN
    assert observed.cause.detail == "runner vanished before the gate opened"


async def test_a_running_object_whose_runner_vanished_can_still_be_stopped(
    harness: LocalHarness,
) -> None:
    job = new_job_id()
    ref = await run(harness, job, shell(TRAP_TERM))
    await wait_output(harness, ref, "ready")
    kill_runner(harness, ref)
    await asyncio.sleep(0.2)  # give a wrongly-ended object time to show; it must not
    still = await harness.find(job, ref)
    assert still is not None
    assert still.phase is ObjectPhase.RUNNING, "the command still runs without its runner"
    await harness.backend.stop(ref)  # SIGTERM is ignored: SIGKILL after the kill wait
    observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert observed.cause is not None
    assert observed.cause.kind is CauseKind.UNKNOWN
    assert observed.cause.detail == "runner vanished; exit status lost"
    assert (await harness.backend.cessation(ref, observed.nodes)).ceased


async def test_start_does_not_block_the_event_loop(harness: LocalHarness) -> None:
    """Runner spawns and scans run in worker threads: the loop keeps ticking meanwhile."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    try:
        await asyncio.gather(*(harness.start(new_job_id(), Program.SLEEP) for _ in range(10)))
        await harness.discover()
    finally:
        stop.set()
        await task
    assert ticks >= 5, f"the loop ticked {ticks} times while 10 objects started"


# -- the zygote -------------------------------------------------------------------------------


def proc_file(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace")


def runner_pid(harness: LocalHarness, ref: ObjectRef) -> int:
    pid = read_json(harness.backend.object_dir(ref) / "runner.json")["pid"]
    assert isinstance(pid, int)
    return pid


async def test_runners_come_from_the_zygote_once_it_is_up(harness: LocalHarness) -> None:
    first = await harness.start(new_job_id(), Program.SLEEP)  # no zygote yet: direct, starts one

    async def forked() -> ObjectRef:
        ref = await harness.start(new_job_id(), Program.SLEEP)
        cmdline = proc_file(runner_pid(harness, ref), "cmdline")
        assert "zygote" in cmdline, "the runner was not forked by the zygote"
        return ref

    ref = await assert_eventually(forked, timeout_s=harness.settle_timeout_s)
    for each in (first, ref):
        assert proc_file(runner_pid(harness, each), "comm").strip() == "dj-runner"
    await harness.backend.open_gate(ref)
    await harness.wait_phase(ref_job(harness, ref), ref, ObjectPhase.RUNNING)


def ref_job(harness: LocalHarness, ref: ObjectRef) -> str:
    name = read_json(harness.backend.object_dir(ref) / "meta.json")["name"]
    assert isinstance(name, str)
    return name.removeprefix("dj-")


async def test_a_zygote_that_quit_or_idled_out_is_replaced(tmp_path: Path) -> None:
    harness = LocalHarness(tmp_path / "data", zygote_idle_s=0.5)
    try:
        await harness.start(new_job_id(), Program.SUCCEED)
        store = harness.backend._store
        for _ in range(3):
            # Gone (idle, or told to quit): the next start spawns its runner directly.
            await asyncio.to_thread(store.quit_zygote)
            job = new_job_id()
            ref = await harness.start(job, Program.SUCCEED)
            await harness.backend.open_gate(ref)
            await harness.wait_phase(job, ref, ObjectPhase.ENDED)
            await asyncio.sleep(0.6)
    finally:
        await harness.cleanup()


async def test_a_second_runner_for_an_object_leaves_it_alone(harness: LocalHarness) -> None:
    job = new_job_id()
    ref = await harness.start(job, Program.SUCCEED)
    path = harness.backend.object_dir(ref)
    with pytest.raises(RuntimeError, match="the runner failed to start"):
        await asyncio.to_thread(harness.backend._store._launch_directly, path, None, 10.0)
    assert path.is_dir(), "the object of the first runner was removed"
    await harness.backend.open_gate(ref)
    await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert (await harness.output(ref)).count("DISPATCH_JOB=") == 1, "the command ran twice"


async def test_an_epoch_out_of_bounds_makes_nothing(harness: LocalHarness) -> None:
    job = new_job_id()
    launch = make_launch(job, harness.spec(Program.SUCCEED), submission=1_000_000)
    with pytest.raises(EpochOutOfRange):
        await harness.backend.start(launch)
    assert not any((harness.data_dir / "objects").iterdir()), "a refused epoch left an object"


# -- launches that survive the launcher (issue 15) -------------------------------------------


async def test_a_second_start_of_a_launch_returns_its_object_wherever_it_is(
    tmp_path: Path,
) -> None:
    """A start is idempotent per launch (job, N, a): pending, running, ended or archived,
    a second start returns the object the first made and never runs the command again."""
    harness = LocalHarness(tmp_path / "data", retain_ended_s=0.0)
    try:
        backend = harness.backend
        assert backend.declarations().idempotent_start
        job = new_job_id()
        launch = make_launch(job, harness.spec(Program.SUCCEED), submission=2, attempt=1)
        ref = await backend.start(launch)
        harness.started.append(ref)
        assert await backend.start(launch) == ref  # pending
        other = await backend.start(
            make_launch(job, harness.spec(Program.SUCCEED), submission=2, attempt=2)
        )
        harness.started.append(other)
        assert other != ref, "another attempt is another object"
        await backend.open_gate(ref)

        async def archived() -> None:
            await harness.discover()  # archives what ended
            assert (tmp_path / "data" / "archive" / ref.id / "status.json").exists()

        await assert_eventually(archived, timeout_s=harness.settle_timeout_s)
        assert await backend.start(launch) == ref  # ended and archived
        again = LocalBackend(CLUSTER, harness.data_dir, kill_wait_s=0.5)  # another process
        assert await again.start(launch) == ref
        objects = sorted(p.name for p in (tmp_path / "data" / "objects").iterdir())
        assert objects == [other.id], "a second start made an object"
        out = (backend.object_dir(ref) / "stdout").read_text()
        assert out.count("DISPATCH_JOB=") == 1, "the command ran twice"
    finally:
        await harness.cleanup()


async def test_a_start_cut_off_before_its_runner_is_completed_by_the_next(
    harness: LocalHarness,
) -> None:
    """The launcher died after writing the object's ``meta.json`` and before its runner
    started: discovery does not show an object nothing can run, and the next start of the
    same launch gives it its runner, so it runs once, like any other."""
    backend = harness.backend
    job = new_job_id()
    launch = make_launch(job, harness.spec(Program.SUCCEED))
    original = backend._store.launch

    def die_before_the_runner(path: Path, meta: object, **kwargs: object) -> None:
        (path / "meta.json").write_bytes(msgspec.json.encode(meta))
        raise TimeoutError("the launcher died here")

    backend._store.launch = die_before_the_runner  # type: ignore[method-assign]
    try:
        with pytest.raises(Exception, match="the launcher died here"):
            await backend.start(launch)
    finally:
        backend._store.launch = original  # type: ignore[method-assign]
    (made,) = (harness.data_dir / "objects").iterdir()
    assert (made / "meta.json").exists()
    assert not (made / "runner.json").exists()
    assert job not in (await harness.discover()).objects, "an object no runner owns is shown"

    ref = await backend.start(launch)
    harness.started.append(ref)
    assert ref.id == made.name
    await harness.wait_phase(job, ref, ObjectPhase.PENDING)
    await backend.open_gate(ref)
    ended = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert ended.cause is not None
    assert ended.cause.kind is CauseKind.NONE
    assert (await harness.output(ref)).count("DISPATCH_JOB=") == 1


def _run_runner_nobody_reads(path: Path) -> int:
    """Start ``local_runner run`` on ``path`` with its "ready" going to a pipe whose reader
    is already closed (the launcher was killed); return the exit status of its first
    process (which forks the runner and exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with open(path / "runner.log", "ab") as runner_log:
            runner = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(Path(local_runner.__file__).resolve()),
                    "run",
                    str(path),
                ],
                stdout=write_end,
                stderr=runner_log,
                start_new_session=True,
            )
    finally:
        os.close(write_end)
    return runner.wait(timeout=30)


async def test_the_runner_outlives_a_launcher_gone_before_it_said_ready(
    harness: LocalHarness,
) -> None:
    """The runner's "ready" goes to a pipe nobody reads any more (the launcher was killed):
    the runner runs on (it used to die of BrokenPipeError and the object ended unknown)."""
    backend = harness.backend
    job = new_job_id()
    object_id, path = backend._store.allocate()
    meta = {
        "id": object_id,
        "name": object_name(job),
        "submission": 1,
        "attempt": 1,
        "command": list(shell("echo DISPATCH_JOB=ran")),
        "env": {},
        "cwd": str(harness.data_dir),
        "time_limit_s": None,
        "kill_wait_s": 0.5,
        "node": "local",
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    (path / "meta.json").write_text(json.dumps(meta))
    assert await asyncio.to_thread(_run_runner_nobody_reads, path) == 0
    ref = ObjectRef(cluster=CLUSTER, id=object_id)
    harness.started.append(ref)
    await harness.wait_phase(job, ref, ObjectPhase.PENDING)
    await backend.open_gate(ref)
    ended = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert ended.cause is not None
    assert ended.cause.kind is CauseKind.NONE, ended.cause
    assert "the launcher is gone" in (path / "runner.log").read_text()


async def test_a_backend_without_idempotent_starts_makes_a_second_object(
    tmp_path: Path,
) -> None:
    """``idempotent_start=False`` stands for a scheduler that can't find a launch's object:
    it says so in its declarations, and a second start is a second object."""
    harness = LocalHarness(tmp_path / "data", idempotent_start=False)
    try:
        assert not harness.backend.declarations().idempotent_start
        launch = make_launch(new_job_id(), harness.spec(Program.SUCCEED))
        first = await harness.backend.start(launch)
        harness.started.append(first)
        second = await harness.backend.start(launch)
        harness.started.append(second)
        assert first != second
    finally:
        await harness.cleanup()


async def test_an_execution_does_not_inherit_the_services_credentials(
    harness: LocalHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend runs inside a service whose environment holds its NATS identity; a job
    that inherited ``SUPERVISOR_NATS_PASSWORD`` could write the record as the supervisor."""
    monkeypatch.setenv("SUPERVISOR_NATS_PASSWORD", "s3cret")
    monkeypatch.setenv("NOTIFIER_WEBHOOK_SECRET", "hook")
    monkeypatch.setenv("SITE_SCRATCH", "/scratch")
    job = new_job_id()
    script = (
        'echo "${SUPERVISOR_NATS_PASSWORD:-none} ${NOTIFIER_WEBHOOK_SECRET:-none} $SITE_SCRATCH"'
    )
    ref = await run(harness, job, ("/bin/sh", "-c", script))
    await harness.wait_phase(job, ref, ObjectPhase.ENDED)
    assert (await harness.output(ref)).strip() == "none none /scratch"


def test_concurrent_claims_share_the_lock_and_keep_ids_dense(tmp_path: Path) -> None:
    """Threads claiming at once (a mass preemption's starts) get one object per launch,
    consecutive ids with no hole, and concurrent claims of one launch agree on one object."""
    from concurrent.futures import ThreadPoolExecutor

    from dispatch_backends.local.store import _Store

    store = _Store(tmp_path / "data")
    keys = [f"job-{i}.1.1" for i in range(64)] + ["same.1.1"] * 16
    with ThreadPoolExecutor(32) as pool:
        claimed = list(pool.map(store.claim, keys))
    by_key: dict[str, set[str]] = {}
    for key, (object_id, path, made) in zip(keys, claimed, strict=True):
        assert not made
        assert path == store.objects / object_id
        by_key.setdefault(key, set()).add(object_id)
    assert len(by_key["same.1.1"]) == 1
    ids = {int(object_id) for v in by_key.values() for object_id in v}
    assert len(ids) == 65
    # No hole: an id a losing claim gave back is the next one this process hands out.
    spare = {int(object_id) for object_id, _path in store._spare}
    upto = int((tmp_path / "data" / "next-id").read_text())
    assert ids | spare == set(range(1, upto))
    assert not ids & spare

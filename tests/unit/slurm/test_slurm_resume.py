"""A repeated start of a Slurm launch whose sbatch was cut off (issue 15, "Launches survive
the launcher"; ``dispatch_backends.slurm.resume``): the job it made is found by its tag in
the recorded squeue outputs (tests/data/slurm/dj-comment), never submitted twice, and left
unknown when squeue can no longer tell."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from dispatch_backends import LaunchUnknownError
from dispatch_backends.slurm.backend import SlurmBackend
from dispatch_backends.slurm.commands import CommandResult, Runner
from dispatch_backends.slurm.resume import ResumeStep, find_launch, resume_step
from dispatch_backends.slurm.settings import SlurmSettings
from dispatch_core.state import JobSpec, ObjectRef
from dispatch_core.steps import Launch
from tests.contract.backend_contract import make_launch
from tests.unit.slurm.recorded import RECORDED, load

NOW = datetime(2026, 11, 30, 9, 40, tzinfo=UTC)
RUNNING = (RECORDED / "dj-comment" / "running" / "squeue-O.txt").read_text()
"""The recorded squeue line of job 10, ``dj-abc``, comment ``dj:job=abc sub=1 att=1``."""


def test_the_step_follows_the_age_of_the_intent() -> None:
    ages = {10.0: ResumeStep.WAIT, 120.0: ResumeStep.LOOK_THEN_SUBMIT, 300.0: ResumeStep.LOOK_ONLY}
    for age, step in ages.items():
        assert resume_step(age, sbatch_settle_s=120.0, min_job_age_s=300.0) is step


def test_the_launch_is_found_by_its_tag_in_the_recorded_squeue() -> None:
    phase = load("dj-comment", "running")
    for jobs in (phase.text_jobs, phase.json_jobs):
        assert find_launch(jobs, "abc", 1, 1) == "10"
        assert find_launch(jobs, "abc", 1, 2) is None  # another attempt
        assert find_launch(jobs, "abc", 2, 1) is None  # another submission
        assert find_launch(jobs, "abd", 1, 1) is None  # another job


class _Runner(Runner):
    """Answers ``squeue`` with the recorded job (in the backend's own ``-O`` fields) or
    nothing, and ``sbatch`` with job 11; keeps the commands run."""

    def __init__(self, *, listed: bool) -> None:
        super().__init__("c1")
        self.listed = listed
        self.argv: list[tuple[str, ...]] = []

    async def run(
        self,
        name: str,
        *args: str,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        as_user: str | None = None,
    ) -> CommandResult:
        assert as_user is None  # no owners here
        self.argv.append((name, *args))
        self.calls += 1
        out = ""
        if name == "squeue" and self.listed:
            # The recorded values of job 10, in the backend's QUEUE_FIELDS order.
            values = RUNNING.strip().split("|")
            fields = [*values[0:5], values[5], values[7], values[8], "0", values[12]]
            fields += [values[13], *values[14:17], "root", values[17]]
            out = "|".join(fields) + "|\n"
        elif name == "sbatch":
            out = "11\n"
        return CommandResult(argv=(name, *args), returncode=0, stdout=out, stderr="", duration_s=0)


def _resumed(age_s: float) -> Launch:
    launch = make_launch("abc", JobSpec(cluster="c1", command=("true",)))
    intent = msgspec.structs.replace(launch.intent, at=NOW - timedelta(seconds=age_s))
    return msgspec.structs.replace(launch, intent=intent, resume=True)


def _backend(runner: _Runner) -> SlurmBackend:
    return SlurmBackend("c1", SlurmSettings(user="root"), clock=lambda: NOW, runner=runner)


def _ran(runner: _Runner) -> list[str]:
    return [argv[0] for argv in runner.argv]


async def test_a_repeated_start_returns_the_job_the_cut_off_sbatch_made() -> None:
    runner = _Runner(listed=True)
    backend = _backend(runner)
    assert backend.declarations().idempotent_start
    assert await backend.start(_resumed(150.0)) == ObjectRef(cluster="c1", id="10")
    assert _ran(runner) == ["squeue"]  # never a second sbatch


async def test_a_repeated_start_waits_while_an_earlier_sbatch_may_still_run() -> None:
    runner = _Runner(listed=False)
    with pytest.raises(LaunchUnknownError, match="may still be running"):
        await _backend(runner).start(_resumed(30.0))
    assert _ran(runner) == []


async def test_a_repeated_start_submits_when_squeue_would_list_any_job_made() -> None:
    runner = _Runner(listed=False)
    assert await _backend(runner).start(_resumed(150.0)) == ObjectRef(cluster="c1", id="11")
    assert _ran(runner) == ["squeue", "sbatch"]


async def test_past_min_job_age_a_launch_squeue_does_not_list_stays_unknown() -> None:
    runner = _Runner(listed=False)
    with pytest.raises(LaunchUnknownError, match="MinJobAge"):
        await _backend(runner).start(_resumed(400.0))
    assert _ran(runner) == ["squeue"]


async def test_a_first_start_does_not_look() -> None:
    runner = _Runner(listed=True)
    first = make_launch("abc", JobSpec(cluster="c1", command=("true",)))
    assert await _backend(runner).start(first) == ObjectRef(cluster="c1", id="11")
    assert _ran(runner) == ["sbatch"]

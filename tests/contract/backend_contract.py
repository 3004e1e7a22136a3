"""The backend contract: what every scheduler backend must do (DESIGN.md section 7).

One set of tests, run on every backend (the eventsourcing library's pattern: a contract suite
per port). A backend plugs in with a :class:`BackendHarness` (a factory for its backend plus a
few backend-specific hooks) and a test class::

    class SlurmHarness(BackendHarness):
        settle_timeout_s = 60.0                     # sbatch/squeue are slower than local
        @property
        def backend(self) -> Backend: ...
        def spec(self, program: Program, *, checkpoint: str | None = None) -> JobSpec: ...
        async def execution_env(self, ref: ObjectRef) -> Mapping[str, str] | None: ...
        async def inject_foreign(self, job_id: str) -> None: ...
        def unreachable(self) -> AbstractAsyncContextManager[None]: ...

    class TestSlurmContract(BackendContract):
        @pytest.fixture
        async def harness(self) -> AsyncIterator[BackendHarness]:
            harness = SlurmHarness(...)
            try:
                yield harness
            finally:
                await harness.cleanup()

Hooks, and what they are for:

* ``spec(program)``: a :class:`JobSpec` that behaves as ``program`` says on this backend
  (a shell command, a batch script, a container).
* ``execution_env(ref)``: the ``DISPATCH_*`` variables the execution of ``ref`` saw, or ``None``
  while it has not run (the local backend reads the job's stdout; Slurm its output file; a
  Kubeflow fake the pod template).
* ``inject_foreign(job_id)``: make an object named ``dj-<job_id>`` whose submission and
  attempt can't be read, the way a person would on that scheduler.
* ``unreachable()``: a context in which the scheduler can't be asked.
* ``tick()``: called between polls; a fake scheduler advances here (default: nothing).
* ``forget(ref)``: make the scheduler stop listing an ended object, the way it does by
  itself later (local: archive it; Slurm: MinJobAge; Kubeflow: the TrainJob deleted by a
  TTL or a person). Default: nothing (the scheduler still lists it).
* ``never_made()``: a ref of this cluster the scheduler never had (default: id
  ``999999999``).
* ``cleanup()``: remove everything the test made (default: stop every object started).
* Settings: ``settle_timeout_s`` (how long a state change may take), ``gate_watch_s`` (how
  long a closed gate is watched to see the command does not run), ``poll_interval_s``,
  ``reports_nodes`` (running objects name their nodes), ``stop_cause`` (the cause a stopped
  object ends with, or ``None`` when a stopped object may simply disappear).

Job ids are random, so the suite can run on a shared cluster: it only looks at its own jobs.
Assertions carry their own messages (this module is not rewritten by pytest).
"""

from __future__ import annotations

import abc
import asyncio
import enum
import secrets
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager, suppress
from datetime import UTC, datetime
from typing import ClassVar, Final

import pytest

from dispatch_backends import (
    Backend,
    BackendError,
    CessationSignal,
    EmergencyStopper,
    Snapshot,
    Unreachable,
    object_name,
)
from dispatch_core.epoch import epoch
from dispatch_core.events import LaunchIntended
from dispatch_core.state import (
    CauseKind,
    GateState,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)
from dispatch_core.steps import Launch
from tests.util import assert_eventually

__all__ = [
    "FAIL_EXIT_CODE",
    "BackendContract",
    "BackendHarness",
    "Program",
    "make_launch",
    "new_job_id",
]

FAIL_EXIT_CODE: Final = 3
"""The exit code of :attr:`Program.FAIL`."""


class Program(enum.Enum):
    """What a contract job does once its gate opens. Each prints (or otherwise exposes) its
    ``DISPATCH_*`` environment first, for :meth:`BackendHarness.execution_env`."""

    SUCCEED = "succeed"
    """Exit 0 at once."""
    FAIL = "fail"
    """Exit with :data:`FAIL_EXIT_CODE`."""
    SLEEP = "sleep"
    """Run until stopped."""


def new_job_id(prefix: str = "ct") -> str:
    """Return a fresh job id (random, so runs on a shared cluster don't collide)."""
    return f"{prefix}-{secrets.token_hex(5)}"


def make_launch(
    job_id: str,
    spec: JobSpec,
    *,
    generation: int = 0,
    submission: int = 1,
    attempt: int = 1,
) -> Launch:
    """Build the :class:`Launch` step the planner would give the supervisor."""
    return Launch(
        key=f"{job_id}:launch:{submission}/{attempt}",
        intent=LaunchIntended(
            job_id=job_id, at=datetime.now(UTC), submission=submission, attempt=attempt
        ),
        name=object_name(job_id),
        spec=spec,
        generation=generation,
        submission=submission,
        attempt=attempt,
    )


class BackendHarness(abc.ABC):
    """A backend under test plus the hooks the contract needs (see the module docstring)."""

    settle_timeout_s: ClassVar[float] = 30.0
    gate_watch_s: ClassVar[float] = 1.0
    poll_interval_s: ClassVar[float] = 0.05
    reports_nodes: ClassVar[bool] = True
    stop_cause: ClassVar[CauseKind | None] = CauseKind.CANCELLED

    def __init__(self) -> None:
        self.started: list[ObjectRef] = []

    # -- hooks ------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def backend(self) -> Backend:
        """The backend under test."""

    @abc.abstractmethod
    def spec(self, program: Program, *, checkpoint: str | None = None) -> JobSpec:
        """Return a spec that runs ``program`` on this backend, with ``checkpoint`` as its
        checkpoint root."""

    @abc.abstractmethod
    async def execution_env(self, ref: ObjectRef) -> Mapping[str, str] | None:
        """Return the ``DISPATCH_*`` variables ``ref``'s execution saw, or ``None`` if it has
        not run."""

    @abc.abstractmethod
    async def inject_foreign(self, job_id: str) -> None:
        """Make an object named ``dj-<job_id>`` whose submission and attempt can't be read."""

    @abc.abstractmethod
    def unreachable(self) -> AbstractAsyncContextManager[None]:
        """Return a context inside which the scheduler can't be asked."""

    async def tick(self) -> None:
        """Advance a fake scheduler between polls (default: only yield to the loop)."""
        await asyncio.sleep(0)

    async def forget(self, ref: ObjectRef) -> None:
        """Make the scheduler stop listing the ended object ``ref`` (default: nothing)."""
        del ref

    def never_made(self) -> ObjectRef:
        """Return a ref of this cluster the scheduler never had."""
        return ObjectRef(cluster=self.backend.cluster, id="999999999")

    async def cleanup(self) -> None:
        """Remove what the test made (default: stop every object it started)."""
        for ref in self.started:
            with suppress(BackendError):
                await self.backend.stop(ref)

    # -- helpers the tests use ------------------------------------------------------------

    async def start(
        self,
        job_id: str,
        program: Program,
        *,
        generation: int = 0,
        submission: int = 1,
        attempt: int = 1,
        checkpoint: str | None = None,
    ) -> ObjectRef:
        """Start an object for ``job_id`` (gate closed) and remember it for clean-up."""
        launch = make_launch(
            job_id,
            self.spec(program, checkpoint=checkpoint),
            generation=generation,
            submission=submission,
            attempt=attempt,
        )
        ref = await self.backend.start(launch)
        self.started.append(ref)
        return ref

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        await self.tick()
        return await self.backend.discover(expected=expected)

    async def find(self, job_id: str, ref: ObjectRef) -> ObservedObject | None:
        """Return what discovery shows of ``ref`` now, or ``None`` if it is not shown."""
        snapshot = await self.discover()
        return next((o for o in snapshot.objects.get(job_id, ()) if o.ref == ref), None)

    async def wait_for(
        self, job_id: str, ref: ObjectRef, check: Callable[[ObservedObject], None]
    ) -> ObservedObject:
        """Poll discovery until ``ref`` is shown and passes ``check`` (which asserts)."""

        async def shown() -> ObservedObject:
            observed = await self.find(job_id, ref)
            assert observed is not None, f"{ref} of job {job_id} is not in the snapshot"
            check(observed)
            return observed

        return await assert_eventually(
            shown, timeout_s=self.settle_timeout_s, interval_s=self.poll_interval_s
        )

    async def wait_phase(self, job_id: str, ref: ObjectRef, phase: ObjectPhase) -> ObservedObject:
        def check(observed: ObservedObject) -> None:
            assert observed.phase is phase, f"{ref}: phase {observed.phase}, expected {phase}"

        return await self.wait_for(job_id, ref, check)

    async def wait_gone_or_ended(self, job_id: str, ref: ObjectRef) -> ObservedObject | None:
        """Poll until ``ref`` is ended (returned) or no longer shown (``None``: gone)."""

        async def finished() -> ObservedObject | None:
            observed = await self.find(job_id, ref)
            assert observed is None or observed.phase is ObjectPhase.ENDED, (
                f"{ref}: still shown as {observed}"
            )
            return observed

        return await assert_eventually(
            finished, timeout_s=self.settle_timeout_s, interval_s=self.poll_interval_s
        )

    async def wait_env(self, ref: ObjectRef) -> Mapping[str, str]:
        async def seen() -> Mapping[str, str]:
            env = await self.execution_env(ref)
            assert env is not None, f"{ref} has not run (no DISPATCH_* environment seen)"
            return env

        return await assert_eventually(
            seen, timeout_s=self.settle_timeout_s, interval_s=self.poll_interval_s
        )


class BackendContract:
    """The contract tests. Subclass as ``Test<Backend>Contract`` and define a ``harness``
    fixture giving a :class:`BackendHarness` (see the module docstring)."""

    async def test_declarations_match_the_optional_interfaces(
        self, harness: BackendHarness
    ) -> None:
        backend = harness.backend
        assert isinstance(backend, Backend), f"{backend!r} does not implement Backend"
        declared = backend.declarations()
        assert declared.node_loss_window_s > 0, f"node-loss window {declared.node_loss_window_s}"
        assert declared.cessation_signal == isinstance(backend, CessationSignal), (
            "declarations.cessation_signal must say whether the backend is a CessationSignal"
        )
        assert declared.emergency_stop == isinstance(backend, EmergencyStopper), (
            "declarations.emergency_stop must say whether the backend is an EmergencyStopper"
        )

    async def test_start_makes_a_named_object_with_its_gate_closed(
        self, harness: BackendHarness
    ) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.SLEEP, submission=2, attempt=3)
        assert ref.cluster == harness.backend.cluster, f"{ref} is not on the backend's cluster"

        def pending(observed: ObservedObject) -> None:
            assert observed.phase is ObjectPhase.PENDING, f"{ref}: phase {observed.phase}"
            assert observed.gate is GateState.CLOSED, f"{ref}: gate {observed.gate}"

        observed = await harness.wait_for(job, ref, pending)
        assert observed.name == object_name(job), f"{ref} is named {observed.name!r}"
        assert (observed.submission, observed.attempt) == (2, 3), (
            f"{ref}: N/a read as {observed.submission}/{observed.attempt}, expected 2/3"
        )
        assert not observed.foreign
        # The command must not run while the gate is closed.
        deadline = asyncio.get_running_loop().time() + harness.gate_watch_s
        while asyncio.get_running_loop().time() < deadline:
            again = await harness.find(job, ref)
            assert again is not None, f"{ref} disappeared while its gate was closed"
            pending(again)
            assert await harness.execution_env(ref) is None, f"{ref} ran with its gate closed"
            await asyncio.sleep(harness.poll_interval_s)

    async def test_open_gate_runs_the_command(self, harness: BackendHarness) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.SLEEP)
        await harness.wait_phase(job, ref, ObjectPhase.PENDING)
        await harness.backend.open_gate(ref)
        observed = await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
        assert observed.gate is GateState.OPEN, f"{ref}: gate {observed.gate} while running"
        assert observed.cause is None, f"{ref}: running with cause {observed.cause}"
        if harness.reports_nodes:
            assert observed.nodes, f"{ref}: running on no node"
        env = await harness.wait_env(ref)
        assert env.get("DISPATCH_JOB") == job, f"DISPATCH_JOB is {env.get('DISPATCH_JOB')!r}"
        # Opening an open gate again is harmless.
        await harness.backend.open_gate(ref)

    async def test_exit_zero_ends_with_cause_none(self, harness: BackendHarness) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.SUCCEED)
        await harness.backend.open_gate(ref)
        observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
        assert observed.cause is not None, f"{ref} ended without a cause"
        assert observed.cause.kind is CauseKind.NONE, f"{ref}: cause {observed.cause}"
        assert observed.cause.exit_code in (0, None), f"{ref}: cause {observed.cause}"

    async def test_non_zero_exit_keeps_the_exit_code(self, harness: BackendHarness) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.FAIL)
        await harness.backend.open_gate(ref)
        observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
        cause = observed.cause
        assert cause is not None, f"{ref} ended without a cause"
        assert cause.kind is CauseKind.NON_ZERO_EXIT, f"{ref}: cause {cause}"
        assert cause.exit_code == FAIL_EXIT_CODE, f"{ref}: exit code {cause.exit_code}"
        assert cause.provenance is Provenance.APPLICATION, f"{ref}: cause {cause}"

    async def test_stop_ends_a_running_object_and_stopping_again_is_harmless(
        self, harness: BackendHarness
    ) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.SLEEP)
        await harness.backend.open_gate(ref)
        await harness.wait_phase(job, ref, ObjectPhase.RUNNING)
        await harness.backend.stop(ref)
        observed = await harness.wait_gone_or_ended(job, ref)
        if observed is not None and harness.stop_cause is not None:
            assert observed.cause is not None, f"{ref} ended without a cause"
            assert observed.cause.kind is harness.stop_cause, f"{ref}: cause {observed.cause}"
        await harness.backend.stop(ref)  # an ended object: not an error
        again = await harness.find(job, ref)
        assert again is None or again.phase is ObjectPhase.ENDED, f"{ref}: {again}"

    async def test_stop_ends_a_pending_object_without_running_it(
        self, harness: BackendHarness
    ) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.SUCCEED)
        await harness.wait_phase(job, ref, ObjectPhase.PENDING)
        await harness.backend.stop(ref)
        observed = await harness.wait_gone_or_ended(job, ref)
        if observed is not None:
            assert observed.cause is not None, f"{ref} ended without a cause"
            assert observed.cause.kind is not CauseKind.NONE, f"{ref}: ended {observed.cause}"
        assert await harness.execution_env(ref) is None, f"{ref} ran after a stop at the gate"

    async def test_discover_is_one_batched_query_however_many_jobs(
        self, harness: BackendHarness
    ) -> None:
        jobs = [new_job_id() for _ in range(20)]
        refs: dict[str, ObjectRef] = {}

        async def start(job: str) -> None:
            refs[job] = await harness.start(job, Program.SLEEP)

        await asyncio.gather(*(start(job) for job in jobs[:2]))
        few = await harness.discover()
        await asyncio.gather(*(start(job) for job in jobs[2:]))

        def all_shown(snapshot: Snapshot, expected: list[str]) -> None:
            for job in expected:
                shown = [o.ref for o in snapshot.objects.get(job, ())]
                assert shown == [refs[job]], f"job {job}: shown {shown}, expected [{refs[job]}]"

        all_shown(few, jobs[:2])

        async def many_shown() -> Snapshot:
            snapshot = await harness.discover()
            all_shown(snapshot, jobs)
            return snapshot

        many = await assert_eventually(many_shown, timeout_s=harness.settle_timeout_s)
        assert many.cluster == harness.backend.cluster
        assert few.calls == many.calls, (
            f"discover took {few.calls} calls for 2 jobs but {many.calls} for 20: "
            "it must be one batched query, never one call per job"
        )
        assert many.seen_at.tzinfo is not None, "seen_at must be timezone-aware"

    async def test_each_execution_gets_its_own_attempt_and_the_epoch(
        self, harness: BackendHarness
    ) -> None:
        job = new_job_id()
        generation, checkpoint = 3, "/checkpoints/contract"
        launches = [(1, 1), (1, 2), (2, 1)]  # (N, a): a second attempt, a second submission
        refs = [
            await harness.start(
                job,
                Program.SUCCEED,
                generation=generation,
                submission=n,
                attempt=a,
                checkpoint=checkpoint,
            )
            for n, a in launches
        ]
        for ref in refs:
            await harness.backend.open_gate(ref)
        attempts = set()
        for ref, (n, a) in zip(refs, launches, strict=True):
            observed = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
            assert (observed.submission, observed.attempt) == (n, a), f"{ref}: {observed}"
            env = await harness.wait_env(ref)
            expected = str(epoch(generation, n, observed.restarts))
            assert env.get("DISPATCH_EPOCH") == expected, (
                f"{ref}: DISPATCH_EPOCH {env.get('DISPATCH_EPOCH')!r}, expected {expected} "
                f"= epoch({generation}, {n}, {observed.restarts})"
            )
            assert env.get("DISPATCH_SUBMISSION") == str(n), f"{ref}: {env}"
            assert env.get("DISPATCH_JOB") == job, f"{ref}: {env}"
            assert env.get("DISPATCH_CHECKPOINT") == checkpoint, f"{ref}: {env}"
            assert env.get("DISPATCH_ATTEMPT"), f"{ref}: no DISPATCH_ATTEMPT"
            attempts.add(env["DISPATCH_ATTEMPT"])
        assert len(attempts) == len(launches), f"DISPATCH_ATTEMPT repeats: {attempts}"
        snapshot = await harness.discover()
        shown = {o.ref for o in snapshot.objects.get(job, ())}
        assert shown >= set(refs), f"job {job}: shown {shown}, expected all of {refs}"

    async def test_foreign_objects_are_shown_without_submission_and_attempt(
        self, harness: BackendHarness
    ) -> None:
        job = new_job_id()
        await harness.inject_foreign(job)

        async def foreign_shown() -> ObservedObject:
            snapshot = await harness.discover()
            objects = snapshot.objects.get(job, ())
            assert len(objects) == 1, f"job {job}: objects {objects}"
            return objects[0]

        observed = await assert_eventually(foreign_shown, timeout_s=harness.settle_timeout_s)
        assert observed.name == object_name(job), f"foreign object named {observed.name!r}"
        assert observed.submission is None, f"{observed}"
        assert observed.attempt is None, f"{observed}"
        assert observed.foreign

    async def test_unreachable_is_an_error_never_a_state(self, harness: BackendHarness) -> None:
        job = new_job_id()
        ref = await harness.start(job, Program.SLEEP)
        before = await harness.wait_phase(job, ref, ObjectPhase.PENDING)
        async with harness.unreachable():
            with pytest.raises(Unreachable) as raised:
                await harness.backend.discover()
        assert isinstance(raised.value, BackendError)
        assert raised.value.retryable, "Unreachable must be retryable"
        assert raised.value.cluster == harness.backend.cluster
        after = await harness.find(job, ref)
        assert after == before, f"{ref} changed across the outage: {before} -> {after}"

    # -- gone is not ended (issue 15) -------------------------------------------------------

    async def test_an_expected_object_no_longer_listed_is_reported_ended_with_its_cause(
        self, harness: BackendHarness
    ) -> None:
        """Issue 15, "gone is not ended": an object the observer expects (it last saw it
        alive) that the scheduler no longer lists is looked up where the scheduler keeps
        ends and reported ended with its real cause, never vanished."""
        job = new_job_id()
        ref = await harness.start(job, Program.SUCCEED)
        await harness.backend.open_gate(ref)
        ended = await harness.wait_phase(job, ref, ObjectPhase.ENDED)
        assert ended.cause is not None, f"{ref} ended without a cause"
        assert ended.cause.kind is CauseKind.NONE, f"{ref} ended with {ended.cause}"
        await harness.forget(ref)
        snapshot = await harness.discover(expected=[ref])
        shown = [o for o in snapshot.objects.get(job, ()) if o.ref == ref]
        assert len(shown) == 1, f"{ref} expected but not reported once: {snapshot}"
        assert shown[0].phase is ObjectPhase.ENDED, f"{ref}: {shown[0]}"
        assert shown[0].cause is not None, f"{ref}: no cause: {shown[0]}"
        assert shown[0].cause.kind is CauseKind.NONE, f"{ref}: {shown[0].cause}"
        assert ref not in snapshot.vanished, f"{ref} reported vanished: {snapshot.vanished}"

    async def test_an_expected_object_the_scheduler_has_no_record_of_is_vanished(
        self, harness: BackendHarness
    ) -> None:
        """Issue 15: only an object the scheduler has no word for is listed in
        ``Snapshot.vanished``; a live expected object is shown, and a ref of another
        cluster is not this backend's to speak for.

        A backend may owe its scheduler's accounting a grace before it calls an object
        vanished (Slurm: ``accounting_grace_s``, since sacct lags behind a fresh job), so
        discovery is asked until the answer comes, within ``settle_timeout_s``; no answer
        on the way may list anything else as vanished or show the unknown ref as an object.
        """
        job = new_job_id()
        live = await harness.start(job, Program.SLEEP)
        nowhere = harness.never_made()
        elsewhere = ObjectRef(cluster=f"{harness.backend.cluster}-other", id=nowhere.id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + harness.settle_timeout_s
        while True:
            snapshot = await harness.discover(expected=[live, nowhere, elsewhere])
            assert set(snapshot.vanished) <= {nowhere}, f"vanished: {snapshot.vanished}"
            listed = {o.ref for objs in snapshot.objects.values() for o in objs}
            assert nowhere not in listed, f"{nowhere} reported as an object: {snapshot}"
            if snapshot.vanished or loop.time() > deadline:
                break
            await asyncio.sleep(1.0)
        assert snapshot.vanished == (nowhere,), f"vanished: {snapshot.vanished}"
        assert any(o.ref == live for o in snapshot.objects.get(job, ())), snapshot
        plain = await harness.discover()
        assert plain.vanished == (), f"vanished without expected objects: {plain.vanished}"

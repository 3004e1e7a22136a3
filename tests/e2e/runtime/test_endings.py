"""Gone is not ended, end to end (issue 15, item 1, "Local, through the services"): a real
nats-server, the observer and a supervisor replica in-process, on the local backend with a
short archive time (``retain_ended_s``; ``dispatch up``'s local cluster is the same backend
with an hour).

A job that completes while the observer can't see the scheduler (cut off, or stopped), and
is archived meanwhile, ends ``succeeded``: the observer, once it sees again, still expects
the object it last saw running and the backend finds its end in the archive. The same when
it is the supervisor that was down: the observer keeps showing the archived end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from dispatch_backends import Snapshot, Unreachable
from dispatch_backends.local import LocalBackend
from dispatch_core import (
    Action,
    CauseKind,
    Declarations,
    ExecutionEnded,
    GateOpened,
    GateState,
    Job,
    ObjectRef,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
)
from dispatch_core.steps import Launch
from services.notifier.config import NotifierConfig
from services.notifier.service import run as notifier_run
from tests.e2e.runtime.conftest import MakeRuntime
from tests.e2e.runtime.harness import Runtime, until_flag
from tests.integration.notifier.support import Receiver
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

ARCHIVE_S = 1.0
"""The local backend's ``retain_ended_s`` here: an ended object is archived a second on."""


class CutOff:
    """The observer's way to the scheduler, which the test can cut (a network partition):
    while cut, every call raises ``Unreachable``, as a scheduler out of reach does."""

    def __init__(self, backend: LocalBackend) -> None:
        self.inner = backend
        self.cut = False
        self.refused_discovers = 0

    async def cut_off(self) -> None:
        """Cut the way, and wait until the observer's next discover is refused.

        A discover already under way when the way is cut still gets its answer (it got
        past the cut), and a slow one may see what happens after the cut. The observer
        polls one discover at a time, so once one is refused no earlier one is in flight:
        from then on the observer sees nothing of the scheduler."""
        self.cut = True
        refused = self.refused_discovers

        def refused_one() -> None:
            assert self.refused_discovers > refused, "no discover refused since the cut"

        await assert_eventually(refused_one, timeout_s=30)

    @property
    def cluster(self) -> str:
        return self.inner.cluster

    def declarations(self) -> Declarations:
        return self.inner.declarations()

    def _check(self) -> None:
        if self.cut:
            raise Unreachable(self.cluster, "network partition (test)")

    async def start(self, launch: Launch) -> ObjectRef:
        self._check()
        return await self.inner.start(launch)

    async def open_gate(self, ref: ObjectRef) -> None:
        self._check()
        await self.inner.open_gate(ref)

    async def stop(self, ref: ObjectRef) -> None:
        self._check()
        await self.inner.stop(ref)

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        if self.cut:
            self.refused_discovers += 1
        self._check()
        return await self.inner.discover(expected=expected)


def _state(state: State) -> object:
    def check(status: Status) -> None:
        assert status.state is state, status

    return check


async def _running(rt: Runtime, job_id: str) -> ObjectRef:
    await rt.submit(job_id, rt.spec(until_flag()), RecoveryPolicy())
    await rt.wait_status(job_id, _state(State.RUNNING))  # type: ignore[arg-type]
    job = await rt.job(job_id)
    (record,) = job.objects
    return record.ref


async def _completed_and_archived(rt: Runtime, ref: ObjectRef) -> None:
    """Let the job exit 0, and wait until the scheduler archives it (the runtime's own
    backend on the same data directory scans, as the local scheduler does)."""
    rt.release()

    async def archived() -> None:
        await rt.objects()  # a scan archives what ended ARCHIVE_S ago
        assert (rt.data_dir / "archive" / ref.id).is_dir(), f"{ref} not archived yet"

    await assert_eventually(archived, timeout_s=60)


async def _succeeded(rt: Runtime, job_id: str, ref: ObjectRef) -> None:
    await rt.wait_status(job_id, _state(State.SUCCEEDED), timeout_s=60)  # type: ignore[arg-type]
    ended = [e for e in await rt.events(job_id) if isinstance(e, ExecutionEnded)]
    assert [(e.ref, e.cause.kind) for e in ended] == [(ref, CauseKind.NONE)], ended


async def test_a_job_that_completes_while_the_observer_is_cut_off_succeeds(
    make_runtime: MakeRuntime,
) -> None:
    """Issue 15: "A job that succeeded while the scheduler was out of sight fails" (it was
    recorded ``unknown`` as soon as the observer saw it no more). The observer is cut off
    from the scheduler while the job completes and is archived; once it reaches the
    scheduler again, the job is ``succeeded``."""
    rt = await make_runtime(retain_ended_s=ARCHIVE_S)
    way = CutOff(rt.backend)
    await rt.observer(backend=way)
    await rt.supervisor()
    ref = await _running(rt, "cut-off")
    await way.cut_off()
    await _completed_and_archived(rt, ref)
    status = await rt.status("cut-off")
    assert status is not None
    assert status.state is State.RUNNING, status  # an unreachable scheduler changes nothing
    way.cut = False
    await _succeeded(rt, "cut-off", ref)


async def test_a_job_that_completes_while_the_observer_is_stopped_succeeds(
    make_runtime: MakeRuntime,
) -> None:
    """The observer is down while the job completes and is archived; restarted, it reads
    what it expects from its last Discoveries and finds the end in the archive."""
    rt = await make_runtime(retain_ended_s=ARCHIVE_S)
    observer = await rt.observer()
    await rt.supervisor()
    ref = await _running(rt, "observer-down")
    await observer.stop()
    await _completed_and_archived(rt, ref)
    await observer.start()
    await _succeeded(rt, "observer-down", ref)


async def test_a_supervisor_restarted_after_a_long_outage_finds_the_job_succeeded(
    make_runtime: MakeRuntime,
) -> None:
    """Issue 15: "The same for the supervisor restarting after a long outage": the job
    completes and is archived while no supervisor runs, and the observer polls on; the
    Discovery keeps showing the end, so the restarted supervisor records ``succeeded``."""
    rt = await make_runtime(retain_ended_s=ARCHIVE_S)
    await rt.observer()
    supervisor = await rt.supervisor()
    ref = await _running(rt, "supervisor-down")
    await supervisor.stop()
    await _completed_and_archived(rt, ref)

    async def still_shown_ended() -> None:
        discovery = await rt.discovery("supervisor-down")
        assert discovery is not None
        assert [(o.ref, o.alive) for o in discovery.objects] == [(ref, False)], discovery

    await assert_eventually(still_shown_ended, timeout_s=30)
    await supervisor.start()
    await _succeeded(rt, "supervisor-down", ref)


async def test_a_fence_whose_old_object_never_ends_escalates_stop_overdue_once(
    make_runtime: MakeRuntime,
) -> None:
    """Issue 15, item 5: "A fence whose old object never ends: one stop-overdue escalation
    after the deadline, delivered once, gate still closed." The old execution ignores
    SIGTERM and the kill wait is an hour, so the local scheduler shows it stopping long
    after dispatch fenced it; the notifier (a real webhook) delivers the escalation once."""
    rt = await make_runtime(node_loss_window_s=2.0, kill_wait_s=3600.0)
    receiver = Receiver()
    await receiver.start()
    stop = asyncio.Event()
    notifier: asyncio.Task[None] | None = None
    try:  # the receiver is stopped whatever fails, or its listening socket leaks
        cfg = msgspec.convert(
            {
                "nats_url": [rt.nats_url],
                "namespace": rt.layout.namespace,
                "http_port": 0,
                "webhook_url": receiver.url("/hook"),
                "retry_base_s": 0.2,
                "retry_max_s": 1.0,
            },
            NotifierConfig,
        )
        notifier = asyncio.create_task(notifier_run(cfg, stop, registry=CollectorRegistry()))
        await rt.observer()
        await rt.supervisor()
        policy = RecoveryPolicy(
            rules=(RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1),)
        )
        command = until_flag(
            "if [ \"$DISPATCH_SUBMISSION\" = 1 ]; then trap '' TERM; "
            "while :; do sleep 0.2; done; fi;"
        )
        await rt.submit("stuck", rt.spec(command, stop_overdue_s=4.0), policy)
        old = await _running_first(rt, "stuck")
        await rt.node_lost(old)
        escalation_id = f"stop-overdue:{old.id}"

        def delivered(job: Job) -> None:
            escalation = job.escalation(escalation_id)
            assert escalation is not None, job.escalations
            assert escalation.delivered is not None, escalation

        job = await rt.wait_job("stuck", delivered, timeout_s=90)
        assert [r.esc_id for r in receiver.accepted("/hook")].count(escalation_id) == 1
        assert [r.esc_id for r in receiver.requests].count(escalation_id) == 1
        body = next(r.json for r in receiver.requests if r.esc_id == escalation_id)
        assert body["severity"] == "critical"
        assert str(old) in body["detail"]
        ids = [e.id for e in job.escalations]
        assert ids.count(escalation_id) == 1, ids
        # The replacement was launched, and its gate is still closed: the old object lives.
        (replacement,) = [o for o in job.objects if o.submission == 2]
        assert replacement.gate_opened_at is None, replacement
        shown = {o.ref: o for o in (await rt.objects())["stuck"]}
        assert shown[old].alive, shown[old]
        assert shown[replacement.ref].gate is GateState.CLOSED, shown[replacement.ref]
        events = await rt.events("stuck")
        assert not [e for e in events if isinstance(e, GateOpened) and e.ref != old]
    finally:
        stop.set()
        if notifier is not None:
            await asyncio.wait_for(notifier, 30)
        await receiver.stop()


async def _running_first(rt: Runtime, job_id: str) -> ObjectRef:
    def running(status: Status) -> None:
        assert status.state is State.RUNNING, status
        assert status.submission == 1, status

    await rt.wait_status(job_id, running)
    job = await rt.job(job_id)
    (record,) = job.objects
    env = await rt.execution_env(record.ref)
    assert env["DISPATCH_SUBMISSION"] == "1"
    return record.ref

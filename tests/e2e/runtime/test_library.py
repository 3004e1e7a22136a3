"""Library use (seed 002's ``supervise.New(backend, store, WithDeliver(...))`` and ``Run``):
``Supervisor(...).run_job(job)`` supervises one job until it settles and delivers its
escalations in-process, the last look included; and the service with an in-process deliver
behaves the same way."""

from __future__ import annotations

import pytest

from dispatch_core import (
    CauseKind,
    Escalation,
    EscalationDelivered,
    RecoveryPolicy,
    State,
    Status,
)
from services.supervisor.service import JobNotFound, Supervisor
from tests.e2e.runtime.harness import PRINT_ENV, Runtime, shell

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


class Pager:
    """Records what it was asked to deliver."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def __call__(self, job_id: str, escalation: Escalation) -> None:
        self.sent.append((job_id, escalation.id))


async def test_run_job_returns_once_settled_after_the_last_look(runtime: Runtime) -> None:
    rt = runtime
    await rt.observer()
    pager = Pager()
    supervisor = Supervisor(rt.nc, [rt.backend], layout=rt.layout, deliver=pager)
    try:
        await rt.submit("lib", rt.spec(shell(f"{PRINT_ENV}; exit 3")), RecoveryPolicy())
        status = await supervisor.run_job("lib")
        assert status.state is State.FAILED
        assert status.cause.kind is CauseKind.NON_ZERO_EXIT
        assert status.settled
        # Committed by the settling pass, delivered by its last look, before run_job returned.
        assert pager.sent == [("lib", "failed:non-zero-exit")]
        delivered = [e for e in await rt.events("lib") if isinstance(e, EscalationDelivered)]
        assert [(e.id, e.channel) for e in delivered] == [("failed:non-zero-exit", "in-process")]
        with pytest.raises(JobNotFound):
            await supervisor.run_job("nobody")
    finally:
        await supervisor.aclose()


async def test_the_service_delivers_in_process_when_given_deliver(runtime: Runtime) -> None:
    rt = runtime
    await rt.observer()
    pager = Pager()
    await rt.supervisor(deliver=pager)
    await rt.submit("svc", rt.spec(shell(f"{PRINT_ENV}; exit 3")), RecoveryPolicy())

    def failed(status: Status) -> None:
        assert status.state is State.FAILED, status
        assert status.settled, status

    await rt.wait_status("svc", failed)

    def delivered(job: object) -> None:
        assert pager.sent == [("svc", "failed:non-zero-exit")], pager.sent

    await rt.wait_job("svc", delivered)
    job = await rt.job("svc")
    escalation = job.escalation("failed:non-zero-exit")
    assert escalation is not None
    assert escalation.delivered is not None

"""Per-job scheduling within one supervisor replica.

Passes of one job never overlap: a job has one worker at a time; a message that arrives
while its pass runs marks it dirty, and one more pass runs after. A pass that appended
events is followed by another when planning again on them gives steps to carry out (seed
002: an escalation it committed is delivered after the next pass). The messages that woke a
worker are acked once it is done (follow-ups included); see "the echo rule" in
:class:`Scheduler` for record appends. A pass whose action failed (scheduler unreachable)
requests another pass ``retry_s`` later; a pass that failed on the store naks its messages
with that delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Final, Literal

from dispatch_core import (
    MalformedRecord,
    UndecodableEvent,
    WriterRefused,
)
from dispatch_nats import (
    Delivery,
    NatsStoreError,
)
from services.common.clock import utcnow
from services.supervisor.deadlines import Deadlines
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassError, PassOutcome, PoisonRecord

__all__ = ["Scheduler", "Source"]

log = logging.getLogger("dispatch.supervisor")

Source = Literal["record", "discovery", "work"]
"""Which consumer a delivery came from (or "work" for a wake with none)."""

_MAX_ROUNDS: Final = 50
"""Most passes one worker runs in a row (a pass that appends is followed by another)."""


class _Slot:
    """One job's worker state in this replica."""

    __slots__ = ("dirty", "parked", "planned", "running", "woke")

    def __init__(self) -> None:
        self.running = False
        self.dirty = False
        """A wake came while the worker ran: run one more pass."""
        self.woke: list[Delivery] = []
        """Deliveries that asked for a pass: settled with the verdict of the pass after them."""
        self.parked: list[Delivery] = []
        """Record deliveries that came while a pass ran (it may have read or appended their
        events): decided when it ends."""
        self.planned = 0
        """The record seq the last completed pass here planned from."""


class Scheduler:
    """Runs each woken job's passes, one worker per job, a bounded number at once.

    **The echo rule.** A supervisor's appends (decisions and facts, ``supervisor`` the
    last token of their subject) wake no pass anywhere: the replica's record consumer does
    not even receive them. The replica that appended them plans again on them itself (a
    pass that appended is followed by another while that would do something), and it acks
    the deliveries that woke the job only once the job's worker is done, follow-ups
    included: if it dies in between, they are redelivered to another replica, which passes
    the job (failover needs no echo). Appends by other writers (the API, the notifier) wake
    the job, except one a pass here already planned from (acked at once); one that comes
    while the job's pass runs waits for that pass to end, then is acked if the pass
    planned from it and wakes the job otherwise.
    """

    def __init__(
        self,
        run_pass: Callable[[str], Awaitable[PassOutcome]],
        *,
        deadlines: Deadlines,
        metrics: SupervisorMetrics,
        max_concurrent: int,
        retry_s: float,
        clock: Callable[[], datetime] = utcnow,
        on_settled: Callable[[str], None] | None = None,
    ) -> None:
        """Prepare; :meth:`run` starts it. ``run_pass(job_id)`` runs one pass (raising
        :class:`PassError` or a store error as :meth:`PassExecutor.run_pass` does);
        ``on_settled(job_id)`` is called when a job's worker ends with the job settled (its
        slot here is dropped then)."""
        self._run_pass = run_pass
        self._on_settled = on_settled
        self._deadlines = deadlines
        self._metrics = metrics
        self._slots_sem = asyncio.Semaphore(max_concurrent)
        self._retry_s = retry_s
        self._clock = clock
        self._jobs: dict[str, _Slot] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._stopping = False

    @property
    def stopping(self) -> bool:
        """Whether the scheduler stopped taking work (it changes while a pass runs)."""
        return self._stopping

    @property
    def busy(self) -> int:
        """Jobs whose worker is running."""
        return sum(1 for s in self._jobs.values() if s.running)

    def jobs(self) -> frozenset[str]:
        """The jobs this scheduler holds state for."""
        return frozenset(self._jobs)

    def forget(self, job_id: str) -> bool:
        """Drop the job's state (it settled) unless its worker runs or deliveries wait;
        return whether it holds none now."""
        slot = self._jobs.get(job_id)
        if slot is not None and (slot.running or slot.woke or slot.parked):
            return False
        self._jobs.pop(job_id, None)
        return True

    async def wake(self, job_id: str, delivery: Delivery | None, source: Source) -> None:
        """A message for ``job_id`` came: run a pass (or mark the running one dirty)."""
        slot = self._jobs.setdefault(job_id, _Slot())
        if delivery is not None and source == "record":
            if delivery.seq <= slot.planned:
                await _settle(delivery, "ack")  # an echo of what a pass here planned from
                return
            if slot.running:
                slot.parked.append(delivery)
                return
        if delivery is not None:
            slot.woke.append(delivery)
        if slot.running:
            slot.dirty = True
            return
        if self._tg is None or self._stopping:
            slot.woke.clear()
            if delivery is not None:
                await _settle(delivery, "nak")
            return
        slot.running = True
        self._tg.create_task(self._work(job_id, slot), name=f"job:{job_id}")

    async def _work(self, job_id: str, slot: _Slot) -> None:
        done: list[Delivery] = []  # acked once the worker ends with no pass left to run
        settled = False
        try:
            for _ in range(_MAX_ROUNDS):
                slot.dirty = False
                covered, slot.woke = slot.woke, []
                async with self._slots_sem:
                    if self._stopping:
                        slot.woke[:0] = covered
                        break
                    outcome, verdict = await self._pass(job_id)
                if outcome is None:
                    covered = [*done, *covered]
                    done = []
                    await _settle_all(covered, verdict, self._retry_s)
                    if verdict == "nak" and not covered:
                        self._deadlines.retry(
                            job_id, self._clock() + timedelta(seconds=self._retry_s)
                        )
                    break
                done.extend(covered)
                settled = outcome.settled
                slot.planned = max(slot.planned, outcome.planned_seq)
                parked, slot.parked = slot.parked, []
                slot.woke.extend(d for d in parked if d.seq > slot.planned)
                done.extend(d for d in parked if d.seq <= slot.planned)
                if outcome.retry:
                    self._deadlines.retry(job_id, self._clock() + timedelta(seconds=self._retry_s))
                if self.stopping or not (outcome.follow_up or slot.dirty or slot.woke):
                    break
            else:
                # Still more to do after _MAX_ROUNDS: give other jobs a turn, come back soon.
                self._deadlines.retry(job_id, self._clock())
            await _settle_all(done, "ack")
        finally:
            slot.running = False
            leftover = [*slot.woke, *slot.parked]
            slot.woke, slot.parked = [], []
            if self._stopping:
                await _settle_all(leftover, "nak")
            elif leftover or slot.dirty:
                slot.woke = leftover
                await self.wake(job_id, None, "work")  # arrived after the last round
            elif settled:
                self.forget(job_id)
                if self._on_settled is not None:
                    self._on_settled(job_id)

    async def _pass(self, job_id: str) -> tuple[PassOutcome | None, Literal["ack", "nak", "term"]]:
        try:
            outcome = await self._run_pass(job_id)
        except PassError as err:
            if err.retryable:
                self._metrics.passes.labels("retry").inc()
                log.warning("supervisor.pass_retry", extra={"job_id": job_id, "error": str(err)})
                return None, "nak"
            self._metrics.passes.labels("poison").inc()
            extra: dict[str, object] = {"job_id": job_id, "error": str(err)}
            if isinstance(err, PoisonRecord):
                # The job is left alone: its messages are terminated (never redelivered), no
                # Status is published, so no deadline wakes it again (issue 10).
                self._metrics.poison.labels(_poison_kind(err.error)).inc()
                extra["seq"] = err.seq
            log.error("supervisor.pass_poison", extra=extra)
            return None, "term"
        except NatsStoreError as err:
            self._metrics.passes.labels("retry").inc()
            log.warning("supervisor.pass_store_error", extra={"job_id": job_id, "error": str(err)})
            return None, "nak"
        except Exception:  # the loop boundary: log, count, carry on with other jobs
            self._metrics.passes.labels("error").inc()
            log.exception("supervisor.pass_crashed", extra={"job_id": job_id})
            return None, "nak"
        self._metrics.passes.labels("ok").inc()
        return outcome, "ack"

    async def run(self, stop: asyncio.Event) -> None:
        """Accept wakes until ``stop``; then let running passes finish (the caller bounds
        how long) and nak what waits."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            await stop.wait()
            self._stopping = True
            waiting = [d for s in self._jobs.values() if not s.running for d in s.woke]
            for slot in self._jobs.values():
                if not slot.running:
                    slot.woke = []
            await _settle_all(waiting, "nak")
        self._tg = None


def _poison_kind(err: MalformedRecord) -> str:
    """The ``why`` label of an unreadable record."""
    if isinstance(err, UndecodableEvent):
        return "undecodable"
    if isinstance(err, WriterRefused):
        return "writer"
    return "malformed"


async def _settle_all(
    deliveries: list[Delivery],
    verdict: Literal["ack", "nak", "term"],
    delay_s: float | None = None,
) -> None:
    """Settle each of ``deliveries``, in turn: an ack, nak or term is one publish that waits
    for no reply, so a task per message (``asyncio.gather``) would only cost its making
    (issue 11: most workers end with one or two deliveries to ack)."""
    for delivery in deliveries:
        await _settle(delivery, verdict, delay_s)


async def _settle(
    delivery: Delivery, verdict: Literal["ack", "nak", "term"], delay_s: float | None = None
) -> None:
    try:
        if verdict == "ack":
            await delivery.ack()
        elif verdict == "nak":
            await delivery.nak(delay_s)
        else:
            await delivery.term()
    except NatsStoreError as err:
        # Unacked, it is redelivered after the ack wait: at worst one more pass.
        log.debug("supervisor.settle_failed", extra={"verdict": verdict, "error": str(err)})

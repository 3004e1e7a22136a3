"""What one supervisor pass needs from the core besides the planner's steps (docs/runtime.md,
"One pass"; docs/core-semantics.md, "Where each rule lives").

The supervisor is a shell: it reads the record, asks :func:`plan_pass`, commits the
:attr:`PassPlan.decisions`, carries the steps out, appends the facts this module makes of
what the actions found (:func:`launch_fact`, :func:`gate_opened`, :func:`cessation_observed`,
:func:`escalation_delivered`, each skipped when :func:`is_redundant`), offers the
:func:`last_look` deliveries, and asks :func:`conclude` whether another pass is needed.
Every rule of the pass (seed 002's deliveries and last look, when a failing start becomes
unknown, which fact a launch outcome commits, when a follow-up pass runs) is here; nothing
here does I/O or reads a clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal, TypeAlias, assert_never

import msgspec

from dispatch_core.backoff import Backoff
from dispatch_core.events import (
    CessationObserved,
    EscalationDelivered,
    GateOpened,
    JobEvent,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
)
from dispatch_core.job import Escalation, Job
from dispatch_core.plan import next_steps, planned
from dispatch_core.project import settled
from dispatch_core.state import Declarations, Discovery, ObjectRef, UtcDatetime
from dispatch_core.steps import (
    AnyStep,
    AskCessation,
    Commit,
    Deliver,
    Launch,
    OpenGate,
    Stop,
)

__all__ = [
    "Conclusion",
    "Decision",
    "Fact",
    "LaunchWord",
    "PassPlan",
    "StartFailed",
    "StartOutcome",
    "StartRefused",
    "StartRetry",
    "StartUnknown",
    "StartUnreachable",
    "Started",
    "cessation_observed",
    "conclude",
    "decisions",
    "escalation_delivered",
    "gate_opened",
    "is_redundant",
    "last_look",
    "launch_fact",
    "plan_pass",
]


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """An event a pass decides, committed (all of a pass's decisions or none) before any
    action is carried out.

    Attributes:
        key: the step's idempotency key (the shell adds its writer token for the msg id).
        event: the event.
    """

    key: str
    event: JobEvent


class Fact(msgspec.Struct, frozen=True, kw_only=True):
    """An event recording what an action found, appended over whatever the record holds.

    Attributes:
        key: its ``Nats-Msg-Id``: the same fact always has the same key, so two writers of
            it store it once.
        event: the event.
    """

    key: str
    event: JobEvent


class PassPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one supervisor pass does, decided before any of it is carried out.

    Attributes:
        steps: what to carry out, in order (see :class:`~dispatch_core.steps.Pass`); no
            ``Deliver`` for a shell that does not deliver, nor for a job that was settled
            when the pass began and gets nothing else (seed 002: "once the job has
            settled, Run returns after one attempt").
        decisions: the events to commit first, all or none, over ``planned_seq``: each
            ``Commit``'s event, then the intents of ``Stop`` and of fresh ``Launch`` steps,
            in step order.
        after: the job as it will be once ``decisions`` are committed (``seq`` is
            ``planned_seq`` plus one per decision).
        planned_seq: the record seq the pass was planned from.
        delivers: whether the shell delivers escalations itself.
        last_look: after the actions, re-read the record and offer, once, what is left
            undelivered (:func:`last_look`): this pass settles a job that was not settled
            when it began, and the shell delivers (seed 002).
        settled: whether the job, after ``decisions``, has settled.
        wake_at: the job's next deadline as the pass saw it, or None (:func:`conclude`
            gives the deadline of the job once the pass's appends are in).
    """

    steps: tuple[AnyStep, ...]
    decisions: tuple[Decision, ...]
    after: Job
    planned_seq: int
    delivers: bool
    last_look: bool
    settled: bool
    wake_at: UtcDatetime | None


class Conclusion(msgspec.Struct, frozen=True, kw_only=True):
    """What a pass leaves to do once its actions' facts are appended.

    Attributes:
        follow_up: another pass should run at once (planning on what this pass appended
            gives steps the shell carries out).
        settled: whether the job is settled.
        wake_at: the job's next deadline, or None.
        covered_seq: the record seq the pass's plan covers: the one its decisions were
            planned from, or, when nothing is left to do, the record's last seq.
    """

    follow_up: bool
    settled: bool
    wake_at: UtcDatetime | None
    covered_seq: int


def decisions(steps: tuple[AnyStep, ...]) -> tuple[Decision, ...]:
    """The events a pass decides, in step order: commits, stop intents, fresh launch
    intents (a resumed launch's intent is already in the record)."""
    out: list[Decision] = []
    for step in steps:
        match step:
            case Commit():
                out.append(Decision(key=step.key, event=step.event))
            case Stop():
                out.append(Decision(key=step.key, event=step.intent))
            case Launch():
                if not step.resume:
                    out.append(Decision(key=step.key, event=step.intent))
            case OpenGate() | AskCessation() | Deliver():
                pass
            case _:
                assert_never(step)
    return tuple(out)


def _acts(steps: tuple[AnyStep, ...], *, delivers: bool) -> bool:
    """Whether a shell would carry out any of ``steps`` (``Deliver`` only if it delivers)."""
    return any(delivers or not isinstance(s, Deliver) for s in steps)


def plan_pass(
    job: Job,
    discovery: Discovery | None,
    declarations: Declarations,
    now: datetime,
    *,
    delivers: bool,
) -> PassPlan:
    """Plan one supervisor pass of ``job`` (:func:`~dispatch_core.plan.next_steps`) with
    everything the shell needs to carry it out.

    Args:
        job: the job's folded record.
        discovery: the latest Discovery of the job's cluster, or None.
        declarations: what the job's backend declares now.
        now: the time of the pass (timezone-aware).
        delivers: whether the shell delivers escalations (an in-process ``Deliver``
            function); without it, ``Deliver`` steps are left to the notifier.

    Returns:
        The plan (see :class:`PassPlan`).

    Raises:
        ValueError: ``discovery`` is another job's.
    """
    the_pass, after = planned(job, discovery, declarations, now)
    steps = the_pass.steps
    already = settled(job, discovery)
    if not delivers or (already and all(isinstance(s, Deliver) for s in steps)):
        # Settled when the pass began: supervision of it is over, its last look happened
        # when it settled (seed 002).
        steps = tuple(s for s in steps if not isinstance(s, Deliver))
    decided = decisions(steps)
    return PassPlan(
        steps=steps,
        decisions=decided,
        after=after,
        planned_seq=job.seq,
        delivers=delivers,
        last_look=delivers and the_pass.settled and not already,
        settled=the_pass.settled,
        wake_at=the_pass.wake_at,
    )


def conclude(
    plan: PassPlan,
    job: Job,
    discovery: Discovery | None,
    declarations: Declarations,
    now: datetime,
    *,
    appended: int,
) -> Conclusion:
    """Whether another pass is needed once the pass's decisions and facts are appended.

    A pass that appended nothing needs no follow-up (a delivery that failed is offered
    after the next pass, not at once). Otherwise the job is planned again (no I/O) with the
    same Discovery: another pass is needed if it would carry something out (seed 002: an
    escalation this pass committed is delivered after the next pass; a refused launch is
    retried at once), except deliveries to a settled job; its deadline is the job's next
    one (a launch intent committed brings the resume deadline nearer than the pass saw).

    Args:
        plan: the pass's plan.
        job: the job as the record holds it now (this pass's appends folded in).
        discovery: the Discovery the pass was planned with.
        declarations: the backend's declarations the pass was planned with.
        now: the time now.
        appended: how many events this pass appended (decisions and facts).
    """
    if not appended:
        return Conclusion(
            follow_up=False,
            settled=plan.settled,
            wake_at=plan.wake_at,
            covered_seq=plan.planned_seq,
        )
    again = next_steps(job, discovery, declarations, now)
    follow_up = _acts(again.steps, delivers=plan.delivers) and not (
        settled(job, discovery) and all(isinstance(s, Deliver) for s in again.steps)
    )
    return Conclusion(
        follow_up=follow_up,
        settled=again.settled,
        wake_at=again.wake_at,
        covered_seq=plan.planned_seq if follow_up else job.seq,
    )


def last_look(job: Job, offered: frozenset[str] | set[str]) -> tuple[Escalation, ...]:
    """Seed 002: "when that pass settled the job, the supervisor's last look, which finds
    the record settled, delivers it before Run returns": the escalations ``job`` (the
    record re-read after the settling pass) holds undelivered that the pass did not offer.
    Offered once: a failure is not offered again."""
    return tuple(e for e in job.escalations if e.delivered is None and e.id not in offered)


def is_redundant(job: Job, event: JobEvent) -> bool:
    """Whether the record already holds what the fact ``event`` says (another writer, a
    replica or the notifier, appended it): an opened gate, a delivered escalation. Such a
    fact is not appended."""
    match event:
        case GateOpened():
            obj = job.object(event.ref)
            return obj is not None and obj.gate_opened_at is not None
        case EscalationDelivered():
            esc = job.escalation(event.id)
            return esc is not None and esc.delivered is not None
        case _:
            return False


# -- launch outcomes ----------------------------------------------------------------------------


class Started(msgspec.Struct, frozen=True, kw_only=True):
    """The backend's start made ``ref``."""

    ref: ObjectRef


class StartRefused(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler refused the launch (nothing was made)."""

    detail: str


class StartUnknown(msgspec.Struct, frozen=True, kw_only=True):
    """The start's outcome is unknown: an object may exist (the backend said so, or the
    start failed in a way it did not classify: DESIGN.md section 5, never assumed failed)."""

    detail: str


class StartUnreachable(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler could not be reached, and nothing was created (the Backend Protocol's
    promise), for as long as :class:`StartRetry` allowed."""

    detail: str


StartOutcome: TypeAlias = Started | StartRefused | StartUnknown | StartUnreachable
"""What one call of a backend's start came to, as the shell classifies it."""

StartFailed: TypeAlias = StartRefused | StartUnknown | StartUnreachable
"""A start that made nothing known."""


class StartRetry(msgspec.Struct, frozen=True, kw_only=True):
    """The unknown-launch policy of a start the scheduler could not be reached for: the
    same start is tried again (nothing was created) with ``backoff`` between tries, until
    ``retry_s`` seconds have passed since the first; then its outcome is recorded unknown
    (a person decides, seed 002 ``all-unknown:<N>``).

    Attributes:
        retry_s: seconds of tries before the outcome is unknown.
        backoff: the pauses between tries.
    """

    retry_s: float = 30.0
    backoff: Backoff = Backoff(base_s=0.25, max_s=5.0, jitter=0.0)

    def delay(self, tries: int, elapsed_s: float) -> float | None:
        """The pause before trying an unreachable start again, or None to record it unknown.

        Args:
            tries: how many tries were unreachable so far (1 or more).
            elapsed_s: seconds since the first try began.
        """
        pause = self.backoff.delay(tries, 0.0)
        return pause if elapsed_s + pause < self.retry_s else None

    def detail(self, detail: str) -> str:
        """The ``LaunchUnknown`` detail of a start unreachable for the whole ``retry_s``."""
        return f"scheduler unreachable for {self.retry_s:g} s: {detail}"


_DEFAULT_RETRY: Final = StartRetry()

LaunchWord: TypeAlias = Literal["recorded", "refused", "unknown"]
"""A launch outcome's word, in its fact's key."""


def launch_fact(
    step: Launch, outcome: StartOutcome, at: datetime, *, retry: StartRetry = _DEFAULT_RETRY
) -> tuple[LaunchWord, Fact]:
    """The fact a launch's start commits (DESIGN.md section 5): ``LaunchRecorded`` for an
    object made, ``LaunchRefused`` for a refusal, ``LaunchUnknown`` otherwise (an unknown
    outcome, or an unreachable scheduler once ``retry`` gave up, with its detail).

    Args:
        step: the launch carried out.
        outcome: what its start came to.
        at: when the outcome was known.
        retry: the unknown-launch policy that gave up on an unreachable scheduler.

    Returns:
        The outcome's word (``recorded``, ``refused`` or ``unknown``: the supervisor's
        launch metric labels it so) and the fact, keyed ``<step key>:<word>``.
    """
    job_id, n, a = step.intent.job_id, step.submission, step.attempt
    event: JobEvent
    label: LaunchWord
    match outcome:
        case Started():
            event = LaunchRecorded(job_id=job_id, at=at, submission=n, attempt=a, ref=outcome.ref)
            label = "recorded"
        case StartRefused():
            event = LaunchRefused(
                job_id=job_id, at=at, submission=n, attempt=a, detail=outcome.detail
            )
            label = "refused"
        case StartUnknown():
            event = LaunchUnknown(
                job_id=job_id, at=at, submission=n, attempt=a, detail=outcome.detail
            )
            label = "unknown"
        case StartUnreachable():
            event = LaunchUnknown(
                job_id=job_id, at=at, submission=n, attempt=a, detail=retry.detail(outcome.detail)
            )
            label = "unknown"
        case _:
            assert_never(outcome)
    return label, Fact(key=f"{step.key}:{label}", event=event)


# -- the other facts --------------------------------------------------------------------------


def gate_opened(step: OpenGate, job_id: str, at: datetime) -> Fact:
    """The fact of ``step``'s gate found open by the backend."""
    return Fact(key=f"{step.key}:opened", event=GateOpened(job_id=job_id, at=at, ref=step.ref))


def cessation_observed(
    step: AskCessation, job_id: str, at: datetime, *, ceased: bool, detail: str
) -> Fact:
    """The fact of the cessation signal's answer to ``step`` (seed 004)."""
    event = CessationObserved(job_id=job_id, at=at, ref=step.ref, ceased=ceased, detail=detail)
    return Fact(key=f"{step.key}:answer", event=event)


def escalation_delivered(job_id: str, escalation_id: str, at: datetime, *, channel: str) -> Fact:
    """The fact of an escalation a channel accepted (seed 002: "records it as delivered
    when your function returns nil"); one key per escalation, whoever delivered it."""
    event = EscalationDelivered(job_id=job_id, at=at, id=escalation_id, channel=channel)
    return Fact(key=f"{job_id}:delivered:{escalation_id}", event=event)

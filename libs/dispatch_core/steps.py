"""What one supervisor pass should do: the planner's output (sans-I/O, h11's shape).

``next_steps`` returns a :class:`Pass`; :func:`dispatch_core.supervision.plan_pass` wraps it
with everything else a supervisor pass needs (the decisions to commit, the job after them,
the follow-up, the last look), so the supervisor carries the steps out in order and never
decides anything itself. A :class:`Commit` appends its event to the record. An action step
that carries an ``intent`` event has that event committed *before* the action is carried out
(a launch's intent before the scheduler is called, DESIGN.md section 5), and its result
committed after, as the step's docstring says. Every step has a ``key``: the same decision
always has the same key, which the shell reuses as ``Nats-Msg-Id`` so that carrying out a
plan twice after a crash does no harm.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from dispatch_core.events import JobEvent, LaunchIntended, StopRequested
from dispatch_core.job import Escalation
from dispatch_core.state import JobSpec, ObjectRef, UtcDatetime

__all__ = [
    "AnyStep",
    "AskCessation",
    "Commit",
    "Deliver",
    "Launch",
    "OpenGate",
    "Pass",
    "Step",
    "Stop",
]


class Step(msgspec.Struct, frozen=True, kw_only=True, tag_field="step"):
    """Base of every step.

    Attributes:
        key: idempotency key of the decision (``<job>:<what>:<which>``).
    """

    key: str


class Commit(Step, frozen=True, kw_only=True, tag="commit"):
    """Append ``event`` to the record: an execution's end, a recovery, an outcome, a hold
    placed or lifted, an escalation, a node loss first seen, a launch found by discovery."""

    event: JobEvent


class Launch(Step, frozen=True, kw_only=True, tag="launch"):
    """Start the next launch of a submission with its start gate closed.

    Commit ``intent`` first; then call the backend's start; then commit
    ``LaunchRecorded`` (an object was made), ``LaunchRefused`` (the scheduler said no) or
    ``LaunchUnknown`` (the outcome is unknown).

    Attributes:
        intent: the ``LaunchIntended`` to commit before calling the scheduler.
        name: the object's name, ``dj-<job id>``.
        spec: what to run.
        generation, submission, attempt: G, N and a; the backend computes
            ``DISPATCH_EPOCH`` from G, N and its own restart count R.
        exclude_nodes: nodes lost by earlier executions, which a backend may avoid.
        resume: the intent is already in the record (a launch whose outcome a crash lost,
            or that came back unknown, on a backend whose start is idempotent per attempt):
            commit nothing first, call the backend's start again (it returns the object
            the earlier start made, if any), then commit the result as for any launch.
    """

    intent: LaunchIntended
    name: str
    spec: JobSpec
    generation: int
    submission: int
    attempt: int
    exclude_nodes: tuple[str, ...] = ()
    resume: bool = False


class OpenGate(Step, frozen=True, kw_only=True, tag="open-gate"):
    """Open dispatch's start gate of ``ref``; commit ``GateOpened`` once it is open."""

    ref: ObjectRef


class Stop(Step, frozen=True, kw_only=True, tag="stop"):
    """Stop ``ref`` (an emergency stop when ``intent.emergency``).

    Commit ``intent`` (a ``StopRequested``) first, then ask the backend.
    """

    intent: StopRequested

    @property
    def ref(self) -> ObjectRef:
        """The object to stop."""
        return self.intent.ref


class AskCessation(Step, frozen=True, kw_only=True, tag="ask-cessation"):
    """Ask the backend's cessation signal whether ``ref``'s processes are gone (seed 004);
    commit its answer as ``CessationObserved``."""

    ref: ObjectRef
    nodes: tuple[str, ...] = ()


class Deliver(Step, frozen=True, kw_only=True, tag="deliver"):
    """Deliver the escalations the record held, undelivered, when the pass began (seed 002);
    commit ``EscalationDelivered`` for each one the channel accepts."""

    escalations: tuple[Escalation, ...]


AnyStep: TypeAlias = Commit | Launch | OpenGate | Stop | AskCessation | Deliver
"""Every planner step, as a closed tagged union: a shell's ``match`` over a step ends in
``typing.assert_never`` (``Step`` is their base class, which msgspec can't decode into a
subclass, and which mypy can't check for exhaustiveness)."""


class Pass(msgspec.Struct, frozen=True, kw_only=True):
    """The steps of one supervisor pass.

    Attributes:
        steps: in the order to carry them out: commits first, then actions, then ``Deliver``.
        wake_at: the job's next deadline (node-loss window, unresolved age, hold deadline,
            cleanup deadline, cessation interval), or ``None`` when only a change of the
            record or the Discovery can make a difference.
        settled: whether the job has an outcome and nothing of it can still act.
    """

    steps: tuple[AnyStep, ...]
    wake_at: UtcDatetime | None
    settled: bool

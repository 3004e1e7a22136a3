"""A simulated scheduler for the stateful test of the pure core (tests/unit/core/test_stateful.py).

It behaves like a real scheduler as far as the core can tell (seeds 000, 002, 004):

* a launch makes an object *pending with dispatch's gate closed*; the call may instead be
  refused, or end with an unknown outcome, having made an object (shown at once, or only
  later: the controller processed the request after the client gave up) or not;
* an object whose gate dispatch opened runs; an administrator may hold a closed gate
  (``admin-held``) and release it again;
* an object ends with a cause (preempted, time limit, out of memory, exit 1, success, a
  node failure, a cancel by an administrator, a state nobody can map), or lives on after a
  *native requeue* (``restarts + 1`` and an ``executions`` entry), when the sim allows it;
* a lost node leaves the object *running* with cause ``node-lost`` until it is stopped or the
  scheduler ends it itself;
* a stop request ends a running object only after a kill wait, and a stopped or ended
  object's processes outlive the scheduler's word by some seconds more (seed 004: "old
  processes outlived their job every time it was measured"), which is what the cessation
  signal answers;
* an ended object stays visible for a while (Slurm's ``MinJobAge``), then vanishes (gone);
  the scheduler keeps its end in accounting, but a live object whose state it lost has no
  record at all;
* :meth:`SimScheduler.discover` is the backend and the observer together (issue 15, "gone
  is not ended"): objects the last discover showed alive are *expected*; one the scheduler
  no longer lists is looked up in accounting (shown ended with its cause) or, with no
  record of it, listed in ``Discovery.vanished``; an object once shown ended keeps being
  shown ended after the scheduler forgets it (the observer's memory). The scheduler only
  forgets objects the observer has seen: an object made and forgotten between two polls
  (or while the observer is down) is an end no observer can report, left out here;
* objects named for the job that dispatch can't read (foreign) may appear.

The sim is the *truth*; a :class:`~dispatch_core.state.Discovery` is a snapshot of what it
shows at one time, and may be stale by the time a pass uses it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from dispatch_core.events import JobEvent, LaunchRecorded, LaunchRefused, LaunchUnknown
from dispatch_core.state import (
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Discovery,
    Execution,
    GateState,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)
from dispatch_core.steps import Launch

__all__ = ["ENDINGS", "LaunchAnswer", "SimObject", "SimScheduler"]


class LaunchAnswer(enum.StrEnum):
    """What the scheduler does with one launch call."""

    RECORDED = "recorded"
    """The call returns the new object's id."""
    REFUSED = "refused"
    """The scheduler says no (``sbatch: error: ...``); nothing is made."""
    UNKNOWN_MADE = "unknown-made"
    """The call times out, but the object was made and is shown at once."""
    UNKNOWN_LATE = "unknown-late"
    """The call times out; the object was made and is shown only later (:meth:`reveal`)."""
    UNKNOWN_NONE = "unknown-none"
    """The call times out and nothing was made."""
    DOUBLED = "doubled"
    """The call returns an object's id, but a retry inside the client made a second object
    for the same launch (a duplicate dispatch must stop)."""


SLURM_USER: Final = Actor(name="root", kind=ActorKind.HUMAN)

ENDINGS: Final[dict[str, Cause]] = {
    "preempted": Cause(
        kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED"
    ),
    "time-limit": Cause(
        kind=CauseKind.TIME_LIMIT, provenance=Provenance.SCHEDULER, detail="TIMEOUT"
    ),
    "out-of-memory": Cause(
        kind=CauseKind.OUT_OF_MEMORY, provenance=Provenance.SCHEDULER, detail="OUT_OF_MEMORY"
    ),
    "exit-1": Cause(
        kind=CauseKind.NON_ZERO_EXIT,
        provenance=Provenance.APPLICATION,
        detail="FAILED",
        exit_code=1,
    ),
    "success": Cause(
        kind=CauseKind.NONE, provenance=Provenance.APPLICATION, detail="COMPLETED", exit_code=0
    ),
    "node-fail": Cause(
        kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail="NODE_FAIL"
    ),
    "admin-cancel": Cause(
        kind=CauseKind.CANCELLED,
        provenance=Provenance.SCHEDULER,
        actor=SLURM_USER,
        detail="CANCELLED by 0",
    ),
    "unmapped": Cause(kind=CauseKind.UNKNOWN, provenance=Provenance.SCHEDULER, detail="BOOT_FAIL"),
}
"""How the sim's scheduler ends an object, by name (the scheduler's words in ``detail``)."""

STOPPED: Final = Cause(
    kind=CauseKind.CANCELLED, provenance=Provenance.SCHEDULER, detail="CANCELLED by dispatch"
)
"""The cause of an object that ended because dispatch asked it to stop."""


@dataclass
class SimObject:
    """One object on the simulated scheduler: what it shows, and what only the sim knows."""

    ref: ObjectRef
    name: str
    submission: int | None
    attempt: int | None
    created_at: datetime
    phase: ObjectPhase = ObjectPhase.PENDING
    gate: GateState = GateState.CLOSED
    cause: Cause | None = None
    restarts: int = 0
    executions: list[Execution] = field(default_factory=list)
    nodes: tuple[str, ...] = ("n1", "n2")
    gate_before_admin: GateState = GateState.CLOSED
    """The gate an administrator's hold replaced, restored on release."""
    visible: bool = True
    """False while an object made by a launch that timed out isn't shown yet."""
    kill_at: datetime | None = None
    """When a stop request will have ended it (the kill wait)."""
    ended_at: datetime | None = None
    gone_at: datetime | None = None
    """When the scheduler stops showing it (an ended object lingers, then vanishes)."""
    ceased_at: datetime | None = None
    """When its processes are really gone (after the end: seed 004)."""
    seen: bool = False
    """Whether a discover has shown it (only such objects are forgotten: see above)."""
    lost: bool = False
    """Whether the scheduler lost it alive (no record of its end anywhere)."""

    @property
    def alive(self) -> bool:
        """Whether the scheduler holds it in a phase other than ended."""
        return self.phase is not ObjectPhase.ENDED

    @property
    def foreign(self) -> bool:
        """Whether its submission and attempt can't be read from it."""
        return self.submission is None or self.attempt is None

    def shown(self) -> ObservedObject:
        """What an adapter reports of it."""
        return ObservedObject(
            ref=self.ref,
            name=self.name,
            submission=self.submission,
            attempt=self.attempt,
            phase=self.phase,
            cause=self.cause,
            gate=self.gate,
            restarts=self.restarts,
            executions=tuple(self.executions),
            nodes=self.nodes,
        )


class SimScheduler:
    """The simulated scheduler of one cluster, for one job's objects.

    Args:
        cluster: the cluster's name.
        job_id: the job the objects are named for.
        now: the scheduler's clock at creation.
        linger_s: seconds an ended object stays shown before it vanishes (Slurm's
            ``MinJobAge``, 300 s by default).
        outlive_s: seconds an ended object's processes outlive the end (seed 004 measured
            24 s after a cancel, 29 after a preemption, 140 after a partition).
        kill_wait_s: seconds a stopped running object takes to end (Slurm's ``KillWait``,
            30 s by default; longer for a trainer that saves a checkpoint on SIGTERM).
        lost_node_kill_wait_s: seconds a stopped object on a lost node takes to end (until
            the node answers or is declared down: Slurm's ``SlurmdTimeout``, 300 s).
        idempotent: whether a start is idempotent per attempt
            (``Declarations.idempotent_start``): a launch of an attempt that already has an
            object makes none but returns it, and a client retry never makes a second one.
    """

    def __init__(
        self,
        cluster: str,
        job_id: str,
        now: datetime,
        *,
        linger_s: float = 300.0,
        outlive_s: float = 24.0,
        kill_wait_s: float = 30.0,
        lost_node_kill_wait_s: float = 300.0,
        idempotent: bool = False,
    ) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.now = now
        self.linger = timedelta(seconds=linger_s)
        self.outlive = timedelta(seconds=outlive_s)
        self.kill_wait = timedelta(seconds=kill_wait_s)
        self.lost_node_kill_wait = timedelta(seconds=lost_node_kill_wait_s)
        self.idempotent = idempotent
        self.objects: dict[ObjectRef, SimObject] = {}
        self.vanished: dict[ObjectRef, SimObject] = {}
        self._next_id = 100
        self._expected: set[ObjectRef] = set()
        self._carried: dict[ObjectRef, ObservedObject] = {}
        self._no_record: list[ObjectRef] = []

    # -- the clock --------------------------------------------------------------------------

    def advance(self, now: datetime) -> None:
        """Let time pass: kill waits run out, opened gates start, ended objects vanish."""
        self.now = now
        for obj in list(self.objects.values()):
            if obj.alive and obj.kill_at is not None and obj.kill_at <= now:
                self._end(obj, STOPPED, at=obj.kill_at)
            if obj.alive and obj.phase is ObjectPhase.PENDING and obj.gate is GateState.OPEN:
                obj.phase = ObjectPhase.RUNNING
            if obj.gone_at is not None and obj.gone_at <= now and obj.seen:
                self.vanish(obj.ref)

    # -- what it shows ----------------------------------------------------------------------

    def discover(self) -> Discovery:
        """A snapshot of the objects shown now (the observer's Discovery), with what the
        backend found of the expected objects the scheduler no longer lists, and what the
        observer remembers of ended ones (see the module docstring)."""
        shown: dict[ObjectRef, ObservedObject] = {}
        for obj in self.objects.values():
            if obj.visible:
                obj.seen = True
                shown[obj.ref] = obj.shown()
        for ref in sorted(self._expected - shown.keys(), key=lambda r: int(r.id)):
            gone = self.vanished.get(ref)
            if gone is not None and not gone.lost:
                self._carried[ref] = gone.shown()  # its end, from accounting
            elif ref not in self._no_record:
                self._no_record.append(ref)
        for ref, obs in shown.items():
            if not obs.alive:
                self._carried[ref] = obs
        self._expected = {ref for ref, obs in shown.items() if obs.alive}
        carried = [obs for ref, obs in self._carried.items() if ref not in shown]
        return Discovery(
            cluster=self.cluster,
            job_id=self.job_id,
            seen_at=self.now,
            objects=(*shown.values(), *carried),
            vanished=tuple(self._no_record),
        )

    def own(self, *, alive: bool = True) -> list[SimObject]:
        """The job's own objects (not foreign), oldest first; only live ones by default."""
        return [o for o in self.objects.values() if not o.foreign and (o.alive or not alive)]

    def foreign(self) -> list[SimObject]:
        """Live foreign objects, oldest first."""
        return [o for o in self.objects.values() if o.foreign and o.alive]

    def find(self, submission: int, attempt: int | None = None) -> list[SimObject]:
        """Objects (shown or not yet, live or ended) made for a submission, or one attempt."""
        return [
            o
            for o in self.objects.values()
            if o.submission == submission and (attempt is None or o.attempt == attempt)
        ]

    def ceased(self, ref: ObjectRef) -> bool:
        """The cessation signal: whether the object's processes are really gone."""
        obj = self.objects.get(ref) or self.vanished.get(ref)
        return obj is not None and obj.ceased_at is not None and obj.ceased_at <= self.now

    # -- dispatch's calls -------------------------------------------------------------------

    def launch(self, step: Launch, answer: LaunchAnswer) -> JobEvent:
        """Carry out a launch; return the fact the supervisor commits for it."""
        job_id, now, n, a = self.job_id, self.now, step.submission, step.attempt
        if self.idempotent:
            made = [
                o
                for o in (*self.objects.values(), *self.vanished.values())
                if (o.submission, o.attempt) == (n, a)
            ]
            if made:  # the object an earlier start of this launch made, wherever it is now
                if answer.startswith("unknown"):
                    return self._timed_out(n, a)
                ref = made[0].ref
                return LaunchRecorded(job_id=job_id, at=now, submission=n, attempt=a, ref=ref)
            if answer is LaunchAnswer.DOUBLED:
                answer = LaunchAnswer.RECORDED
        if answer is LaunchAnswer.REFUSED:
            words = "sbatch: error: Batch job submission failed: Job violates accounting policy"
            return LaunchRefused(job_id=job_id, at=now, submission=n, attempt=a, detail=words)
        if answer is LaunchAnswer.UNKNOWN_NONE:
            return self._timed_out(n, a)
        obj = self.make(step.name, n, a, visible=answer is not LaunchAnswer.UNKNOWN_LATE)
        if answer is LaunchAnswer.DOUBLED:
            self.make(step.name, n, a)
        if answer in (LaunchAnswer.RECORDED, LaunchAnswer.DOUBLED):
            return LaunchRecorded(job_id=job_id, at=now, submission=n, attempt=a, ref=obj.ref)
        return self._timed_out(n, a)

    def _timed_out(self, n: int, a: int) -> JobEvent:
        words = "sbatch: error: Socket timed out on send/recv operation"
        return LaunchUnknown(job_id=self.job_id, at=self.now, submission=n, attempt=a, detail=words)

    def make(
        self, name: str, submission: int | None, attempt: int | None, *, visible: bool = True
    ) -> SimObject:
        """Make an object, pending with its gate closed (running, for a foreign one)."""
        ref = ObjectRef(cluster=self.cluster, id=str(self._next_id))
        self._next_id += 1
        obj = SimObject(
            ref=ref,
            name=name,
            submission=submission,
            attempt=attempt,
            created_at=self.now,
            visible=visible,
        )
        if obj.foreign:
            obj.phase, obj.gate = ObjectPhase.RUNNING, GateState.OPEN
        self.objects[ref] = obj
        return obj

    def open_gate(self, ref: ObjectRef) -> bool:
        """Open dispatch's gate; the object runs. False when there is no closed gate to open
        (gone, ended, or an administrator holds it)."""
        obj = self.objects.get(ref)
        if obj is None or not obj.alive or obj.gate is not GateState.CLOSED:
            return False
        obj.gate = GateState.OPEN
        if obj.phase is ObjectPhase.PENDING:
            obj.phase = ObjectPhase.RUNNING
        return True

    def stop(self, ref: ObjectRef, *, emergency: bool) -> None:
        """Ask the object to stop: one that never ran ends at once; a running one after the
        kill wait, or, on a lost node, once the node answers or is declared down (at once for
        an emergency stop). Asking again never delays it."""
        obj = self.objects.get(ref)
        if obj is None or not obj.alive:
            return
        if obj.phase is ObjectPhase.PENDING or emergency:
            self._end(obj, STOPPED, at=self.now)
            return
        lost = obj.cause is not None and obj.cause.kind is CauseKind.NODE_LOST
        kill_at = self.now + (self.lost_node_kill_wait if lost else self.kill_wait)
        if obj.kill_at is None or kill_at < obj.kill_at:
            obj.kill_at = kill_at
        obj.phase = ObjectPhase.STOPPING
        if obj.kill_at <= self.now:
            self._end(obj, STOPPED, at=self.now)

    # -- what happens on the scheduler by itself --------------------------------------------

    def end(self, ref: ObjectRef, cause: Cause | None) -> None:
        """The object's current execution ends with ``cause`` (``None``: the scheduler
        shows it ended and says nothing of why)."""
        self._end(self.objects[ref], cause, at=self.now)

    def _end(self, obj: SimObject, cause: Cause | None, *, at: datetime) -> None:
        obj.phase = ObjectPhase.ENDED
        obj.cause = cause
        obj.kill_at = None
        obj.ended_at = at
        obj.gone_at = at + self.linger
        obj.ceased_at = at + self.outlive

    def requeue(self, ref: ObjectRef, cause: Cause) -> None:
        """A native requeue: the execution ends with ``cause``, the object lives on (R + 1),
        pending again, and runs again since its gate is open."""
        obj = self.objects[ref]
        obj.executions.append(Execution(restart=obj.restarts, cause=cause, nodes=obj.nodes))
        obj.restarts += 1
        obj.phase, obj.cause = ObjectPhase.PENDING, None
        obj.nodes = (f"n{2 * obj.restarts + 1}", f"n{2 * obj.restarts + 2}")

    def lose_node(self, ref: ObjectRef) -> None:
        """A node of the running object is lost: it keeps running with cause node-lost."""
        obj = self.objects[ref]
        obj.cause = Cause(
            kind=CauseKind.NODE_LOST,
            provenance=Provenance.SCHEDULER,
            detail=f"NodeNotResponding {obj.nodes[0]}",
            at=self.now,
        )

    def admin_hold(self, ref: ObjectRef) -> None:
        """An administrator holds a pending object (Slurm ``JobHeldAdmin``): one whose gate
        dispatch hasn't opened, or one requeued and waiting to run again."""
        obj = self.objects[ref]
        obj.gate_before_admin = obj.gate
        obj.gate = GateState.ADMIN_HELD
        obj.cause = Cause(
            kind=CauseKind.HELD,
            provenance=Provenance.SCHEDULER,
            actor=SLURM_USER,
            detail="JobHeldAdmin",
            at=self.now,
        )

    def admin_release(self, ref: ObjectRef) -> None:
        """The administrator releases their hold; the gate is as it was before (dispatch's
        own gate still closed, or open for a requeued object, which then runs)."""
        obj = self.objects[ref]
        obj.gate, obj.cause = obj.gate_before_admin, None

    def state_unmappable(self, ref: ObjectRef) -> None:
        """The scheduler shows the live object in a state the adapter can't map (phase
        ``unknown``, the scheduler's words kept)."""
        obj = self.objects[ref]
        obj.phase = ObjectPhase.UNKNOWN
        obj.cause = Cause(
            kind=CauseKind.UNKNOWN,
            provenance=Provenance.SCHEDULER,
            detail="REQUEUE_HOLD",
            at=self.now,
        )

    def state_mappable(self, ref: ObjectRef) -> None:
        """The object's state maps again: running if its gate is open, else pending."""
        obj = self.objects[ref]
        running = obj.gate is GateState.OPEN
        obj.phase = ObjectPhase.RUNNING if running else ObjectPhase.PENDING
        obj.cause = None

    def reveal(self) -> None:
        """Objects made by launches that timed out are shown at last."""
        for obj in self.objects.values():
            obj.visible = True

    def vanish(self, ref: ObjectRef) -> None:
        """The scheduler stops showing the object (purged, or its state lost)."""
        obj = self.objects.pop(ref)
        if obj.alive:  # a live object whose state the scheduler lost: its processes die
            obj.phase, obj.ended_at, obj.ceased_at = ObjectPhase.ENDED, self.now, self.now
            obj.lost = True
        self.vanished[ref] = obj

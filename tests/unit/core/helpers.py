"""Test helpers for the planner: carry a :class:`~dispatch_core.steps.Pass` out on a record,
the way the supervisor does (docs/runtime.md, "One pass"), and re-fold.

* :func:`decisions`: what the supervisor appends before any action (each ``Commit``'s event,
  then each ``Launch``'s and ``Stop``'s intent, in step order).
* :func:`facts`: what it appends after carrying the actions out (a gate opened, a cessation
  answer, deliveries, a launch's result), as the test chooses them.
* :class:`Record`: a record being written, with its sequence numbers (gaps included, as in
  a stream shared by many jobs), folded on demand.
* :class:`Sim`: a small scheduler-and-supervisor harness for example tests: it holds the
  record, the clock and what the scheduler shows, plans a pass, and carries it out.

The stateful test reuses :func:`decisions`, :func:`facts` and :func:`apply_pass`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, overload

import msgspec

from dispatch_core.commands import OperatorCommand
from dispatch_core.decide import decide
from dispatch_core.events import (
    CessationObserved,
    EscalationCommitted,
    EscalationDelivered,
    Event,
    GateOpened,
    JobCreated,
    JobEvent,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
)
from dispatch_core.failover import discovery_clusters
from dispatch_core.failover import merge_discoveries as merge
from dispatch_core.fold import fold
from dispatch_core.job import Job, Status
from dispatch_core.plan import next_steps
from dispatch_core.policy import make_plan
from dispatch_core.project import project
from dispatch_core.state import (
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Declarations,
    Discovery,
    Execution,
    GateState,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    Publications,
    RecoveryPolicy,
    RecoveryRule,
)
from dispatch_core.steps import (
    AskCessation,
    Commit,
    Deliver,
    Launch,
    OpenGate,
    Pass,
    Step,
    Stop,
)
from tests.util import written

__all__ = [
    "ALICE",
    "CLUSTER",
    "T0",
    "LaunchResult",
    "Record",
    "Sim",
    "actions",
    "apply_pass",
    "cause",
    "committed",
    "decisions",
    "escalation_ids",
    "facts",
    "rule",
    "start",
]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CLUSTER = "c1"
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)

E = TypeVar("E", bound=Event)
S = TypeVar("S", bound=Step)

LaunchResult = Callable[[Launch], JobEvent | None]
"""What the scheduler answered a launch: a ``LaunchRecorded``/``Refused``/``Unknown``
event, or ``None`` for a supervisor that crashed between intent and call."""


def cause(
    kind: CauseKind,
    detail: str = "",
    *,
    provenance: Provenance = Provenance.SCHEDULER,
    exit_code: int | None = None,
    at: datetime | None = None,
) -> Cause:
    """A cause as an adapter reports it."""
    return Cause(kind=kind, provenance=provenance, detail=detail, exit_code=exit_code, at=at)


def rule(
    *on: CauseKind, action: Action = Action.RESUBMIT, budget: int = 3, **kw: object
) -> RecoveryRule:
    """A recovery rule."""
    return msgspec.convert({"on": list(on), "action": action, "budget": budget, **kw}, RecoveryRule)


def decisions(the_pass: Pass) -> list[JobEvent]:
    """The events the supervisor appends before any action: every ``Commit``'s event, then
    the intents of ``Launch`` and ``Stop`` steps, in step order (a resumed launch's intent
    is already in the record)."""
    commits = [s.event for s in the_pass.steps if isinstance(s, Commit)]
    intents: list[JobEvent] = []
    for step in the_pass.steps:
        if isinstance(step, Launch | Stop) and not (isinstance(step, Launch) and step.resume):
            intents.append(step.intent)
    return commits + intents


def facts(
    the_pass: Pass,
    now: datetime,
    *,
    launch: LaunchResult | None = None,
    gates: bool = True,
    ceased: bool | None = False,
    delivered: bool = False,
) -> list[JobEvent]:
    """The results of a pass's actions, as the test chooses them.

    Args:
        the_pass: the pass carried out.
        now: when the results are committed.
        launch: what the scheduler answered each launch (default: no answer committed, as
            if the call were still in flight).
        gates: whether each ``OpenGate`` succeeded (``GateOpened``).
        ceased: the cessation signal's answer to each ``AskCessation``, or ``None`` for no
            answer.
        delivered: whether the channel accepted each delivered escalation.
    """
    out: list[JobEvent] = []
    for step in the_pass.steps:
        match step:
            case Launch():
                if launch is not None:
                    result = launch(step)
                    if result is not None:
                        out.append(result)
            case OpenGate():
                if gates:
                    out.append(GateOpened(job_id=_job_of(the_pass), at=now, ref=step.ref))
            case AskCessation():
                if ceased is not None:
                    out.append(
                        CessationObserved(
                            job_id=_job_of(the_pass), at=now, ref=step.ref, ceased=ceased
                        )
                    )
            case Deliver():
                if delivered:
                    out.extend(
                        EscalationDelivered(job_id=_job_of(the_pass), at=now, id=e.id)
                        for e in step.escalations
                    )
            case _:
                pass
    return out


def _job_of(the_pass: Pass) -> str:
    return the_pass.steps[0].key.split(":", 1)[0]


class Record:
    """A job's record being written: ``(seq, event)`` pairs with gaps between sequences."""

    def __init__(self, created: JobCreated) -> None:
        self.events: list[tuple[int, JobEvent]] = [(1, created)]

    def append(self, events: Iterable[JobEvent]) -> None:
        """Append events, each two sequences after the previous (another job's between)."""
        for event in events:
            self.events.append((self.events[-1][0] + 2, event))

    def job(self, now: datetime = T0) -> Job:
        """Fold the record."""
        return fold(written(self.events), now)


def apply_pass(
    record: Record,
    the_pass: Pass,
    now: datetime,
    *,
    launch: LaunchResult | None = None,
    gates: bool = True,
    ceased: bool | None = False,
    delivered: bool = False,
) -> Job:
    """Append a pass's decisions, then the results of its actions (see :func:`facts`; by
    default gates open, launches stay in flight, cessation answers "not yet", nothing is
    delivered), and re-fold."""
    record.append(decisions(the_pass))
    record.append(
        facts(the_pass, now, launch=launch, gates=gates, ceased=ceased, delivered=delivered)
    )
    return record.job(now)


class Sim:
    """A scheduler and a supervisor for example tests.

    The scheduler is a dict of :class:`ObservedObject` the test edits (``show``, ``end``,
    ``update``); a launch the supervisor carries out makes an object with a closed gate
    (``refuse`` or ``unknown`` make the next launches fail instead). ``step`` plans one pass
    at the sim's clock, carries it out and returns it.
    """

    def __init__(
        self,
        *rules: RecoveryRule,
        spec: JobSpec | None = None,
        declarations: Declarations | None = None,
        job_id: str = "j1",
    ) -> None:
        self.job_id = job_id
        self.spec = spec or JobSpec(cluster=CLUSTER)
        self.declarations = declarations or Declarations(node_loss_window_s=300.0)
        policy = RecoveryPolicy(rules=rules)
        created = JobCreated(
            job_id=job_id,
            at=T0,
            spec=self.spec,
            policy=policy,
            plan=make_plan(self.spec, policy, self.declarations),
            declarations=self.declarations,
            by=ALICE,
        )
        self.record = Record(created)
        self.now = T0
        self.objects: dict[ObjectRef, ObservedObject] = {}
        self.next_id = 100
        self.launch_answer = "recorded"  # or "refused", "unknown", "lost" (no answer)
        self.passes: list[Pass] = []
        self.stopped: list[Stop] = []
        self.seen_at: datetime | None = None
        self.vanished: list[ObjectRef] = []
        self.publications: Publications | None = None  # what pub/ shows (issue 14)

    # -- the clock and the scheduler --------------------------------------------------------

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @property
    def job(self) -> Job:
        return self.record.job(self.now)

    def discovery(self) -> Discovery:
        """What the supervisor reads: the Discovery of each cluster the job's pass reads
        (``discovery_clusters``: one, ``CLUSTER``, unless a failover moved the job), merged
        as the supervisor merges them. The scheduler's objects and vanished refs go to the
        Discovery of their own cluster; those of a cluster the pass doesn't read are unseen.
        """
        job = self.job
        clusters = discovery_clusters(job)
        merged = merge(
            [
                Discovery(
                    cluster=c,
                    job_id=self.job_id,
                    seen_at=self.seen_at or self.now,
                    objects=tuple(o for o in self.objects.values() if o.ref.cluster == c),
                    vanished=tuple(r for r in self.vanished if r.cluster == c),
                    publications=self.publications,
                )
                for c in clusters
            ]
        )
        assert merged is not None  # the current cluster's, at least
        return merged

    def show(self, obj: ObservedObject) -> ObservedObject:
        self.objects[obj.ref] = obj
        return obj

    def update(self, ref: ObjectRef, **changes: object) -> ObservedObject:
        obj = msgspec.structs.replace(self.objects[ref], **changes)
        self.objects[ref] = obj
        return obj

    def end(self, ref: ObjectRef, why: Cause) -> ObservedObject:
        return self.update(ref, phase=ObjectPhase.ENDED, cause=why)

    def requeue(
        self, ref: ObjectRef, why: Cause, *, phase: ObjectPhase = ObjectPhase.PENDING
    ) -> ObservedObject:
        """The backend runs the object again natively: its execution ends with ``why`` and
        a new one (R + 1) starts."""
        obj = self.objects[ref]
        return self.update(
            ref,
            executions=(
                *obj.executions,
                Execution(restart=obj.restarts, cause=why, nodes=obj.nodes),
            ),
            restarts=obj.restarts + 1,
            phase=phase,
            cause=None,
        )

    def vanish(self, ref: ObjectRef) -> None:
        """The scheduler has no record of the object any more (the observer lists it
        vanished: it saw it alive, then found no word of it in a full poll)."""
        del self.objects[ref]
        self.vanished.append(ref)

    def forget(self, ref: ObjectRef) -> None:
        """The object is merely absent from the Discovery (it proves nothing: issue 15)."""
        del self.objects[ref]

    def foreign(self, object_id: str, phase: ObjectPhase = ObjectPhase.RUNNING) -> ObservedObject:
        return self.show(
            ObservedObject(
                ref=ObjectRef(cluster=CLUSTER, id=object_id),
                name=f"dj-{self.job_id}-rewritten",
                submission=None,
                attempt=None,
                phase=phase,
            )
        )

    def own(
        self,
        submission: int,
        attempt: int,
        *,
        object_id: str | None = None,
        phase: ObjectPhase = ObjectPhase.PENDING,
        gate: GateState = GateState.CLOSED,
        cluster: str = CLUSTER,
    ) -> ObservedObject:
        """Show an object of the job's (one the test made appear, e.g. a late launch), on
        ``cluster``."""
        if object_id is None:
            object_id = str(self.next_id)
            self.next_id += 1
        return self.show(
            ObservedObject(
                ref=ObjectRef(cluster=cluster, id=object_id),
                name=f"dj-{self.job_id}",
                submission=submission,
                attempt=attempt,
                phase=phase,
                gate=gate,
                nodes=("n1", "n2"),
            )
        )

    def _launch(self, step: Launch) -> JobEvent | None:
        job_id, at, n, a = self.job_id, self.now, step.submission, step.attempt
        match self.launch_answer:
            case "refused":
                words = "sbatch: error: Batch job submission failed"
                return LaunchRefused(job_id=job_id, at=at, submission=n, attempt=a, detail=words)
            case "unknown":
                words = "timeout after 30 s"
                return LaunchUnknown(job_id=job_id, at=at, submission=n, attempt=a, detail=words)
            case "lost":
                return None
            case _:
                ref = self._made(n, a) or self.own(n, a, cluster=step.spec.cluster).ref
                return LaunchRecorded(job_id=job_id, at=at, submission=n, attempt=a, ref=ref)

    def _made(self, submission: int, attempt: int) -> ObjectRef | None:
        """On a backend whose start is idempotent per attempt, the object an earlier start
        of (N, a) made (a second start returns it); else ``None``."""
        if not self.declarations.idempotent_start:
            return None
        job = self.job
        for obj in self.objects.values():
            if (
                (obj.submission, obj.attempt) == (submission, attempt)
                and not obj.foreign
                # One the record already holds (a duplicate a test made appear before the
                # attempt existed) would be a moot fact the supervisor drops.
                and job.object(obj.ref) is None
            ):
                return obj.ref
        return None

    # -- the supervisor ---------------------------------------------------------------------

    def plan(self, *, discovery: bool = True) -> Pass:
        """Plan a pass at the sim's clock, without carrying it out."""
        return next_steps(
            self.job, self.discovery() if discovery else None, self.declarations, self.now
        )

    def step(
        self, *, discovery: bool = True, ceased: bool | None = False, delivered: bool = False
    ) -> Pass:
        """Plan one pass and carry it out: decisions, then actions and their results (a
        launch makes an object, a gate opens, a stop ends the object as cancelled)."""
        the_pass = self.plan(discovery=discovery)
        self.passes.append(the_pass)
        self.record.append(decisions(the_pass))
        for step in the_pass.steps:
            if isinstance(step, OpenGate) and step.ref in self.objects:
                self.update(step.ref, gate=GateState.OPEN, phase=ObjectPhase.RUNNING)
            if isinstance(step, Stop):
                self.stopped.append(step)
        self.record.append(
            facts(the_pass, self.now, launch=self._launch, ceased=ceased, delivered=delivered)
        )
        return the_pass

    def settle_stops(self) -> None:
        """The scheduler carries out every stop asked so far: those objects end cancelled."""
        for step in self.stopped:
            if step.ref in self.objects and self.objects[step.ref].alive:
                self.end(
                    step.ref,
                    cause(
                        CauseKind.CANCELLED, "CANCELLED by dispatch", provenance=Provenance.ACTOR
                    ),
                )
        self.stopped.clear()

    def command(self, command: OperatorCommand) -> None:
        """Decide an operator command and append its events."""
        self.record.append(decide(self.job, command, self.now))

    def status(self) -> Status:
        """The job's Status now."""
        return project(self.job, self.discovery(), self.now)

    def current(self) -> ObservedObject:
        """The object of the current submission the scheduler shows."""
        sub = self.job.submission
        assert sub is not None
        for obj in self.objects.values():
            if obj.submission == sub.number and obj.alive:
                return obj
        raise AssertionError(f"no live object of submission {sub.number}")


@overload
def committed(the_pass: Pass) -> list[JobEvent]: ...
@overload
def committed(the_pass: Pass, kind: type[E]) -> list[E]: ...
def committed(the_pass: Pass, kind: type[Event] | None = None) -> list[Any]:
    """The events of a pass's ``Commit`` steps (of one type, when given)."""
    return [
        s.event
        for s in the_pass.steps
        if isinstance(s, Commit) and (kind is None or isinstance(s.event, kind))
    ]


def actions(the_pass: Pass, kind: type[S]) -> list[S]:
    """The pass's steps of one step type."""
    return [s for s in the_pass.steps if isinstance(s, kind)]


def escalation_ids(the_pass: Pass) -> list[str]:
    """Ids of the escalations a pass commits, in order."""
    return [e.id for e in committed(the_pass, EscalationCommitted)]


def start(sim: Sim) -> ObservedObject:
    """Run a job's first passes: submission 1 opened and launched, its gate opened; return
    the running object."""
    sim.step()
    sim.tick(1)
    sim.step()
    sim.tick(1)
    return sim.current()

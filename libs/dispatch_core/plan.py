"""``next_steps``: the planner of one supervisor pass (DESIGN.md section 4;
docs/core-semantics.md, "The planner").

The planner is sans-I/O (h11's shape): it reads a folded :class:`~dispatch_core.job.Job`,
what the backend shows now (a :class:`~dispatch_core.state.Discovery`), the backend's
:class:`~dispatch_core.state.Declarations` and ``now``, and returns a
:class:`~dispatch_core.steps.Pass` whose steps the supervisor carries out. It never carries
anything out itself, and the same inputs always give the same steps.

A pass is computed *as if its own commits were already applied*: every event a step
commits (a ``Commit``'s event, a ``Launch``'s or ``Stop``'s intent) is folded into a working
copy of the job before the next rule looks at it, with :func:`~dispatch_core.fold.fold`
itself, so the planner and the record can't disagree on what an event means. Once a pass's
commits and intents are in the record, planning again with the same discovery and ``now``
gives nothing but ``Deliver`` (the planner is idempotent).

The rules run in this order, one function per rule family (the numbers are those of
docs/core-semantics.md, "The planner"):

1. :func:`_found_launches`: objects matched to unknown launches; duplicates stopped.
2. :func:`_endings`: executions that ended, recorded (objects gone included); a decision a
   crash lost is made again.
3. :func:`_decide_ending`: an object ending is not the job ending (the plan's rule).
4. :func:`_fence`: the node-loss fence; :func:`_no_capacity`: a no-capacity wait past the
   rule's ``wait_s`` stopped.
5. :func:`_holds`: overdue holds, the cessation signal, a ceased answer lifting a hold.
6. :func:`_launches`: submissions opened and launched, ``refused:<N>``; then
   :func:`_resume_launches`: a launch whose outcome a crash lost (or that came back
   unknown) started again, on a backend whose start is idempotent per attempt.
7. :func:`_unknown_launches`: ``all-unknown:<N>`` and ``unmatched:<N>/<a>``.
8. :func:`_gates`: start gates opened; ``admin-held:<id>``.
9. :func:`_foreign`: ``foreign:<id>``.
10. :func:`_stops`: objects that must stop (outcome, duplicates), emergency stops, re-asks.
11. :func:`_cleanup`: ``cleanup-deadline``.
12. :func:`_deliver`: the escalations the record held undelivered.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final, assert_never

from msgspec.structs import replace

from dispatch_core.constants import CESSATION_INTERVAL_S, SUPERVISOR
from dispatch_core.escalations import EscalationKind
from dispatch_core.escalations import escalation_id as esc_id
from dispatch_core.events import (
    EscalationCommitted,
    ExecutionEnded,
    HoldHow,
    HoldPlaced,
    HoldReleased,
    JobEvent,
    LaunchIntended,
    LaunchRecorded,
    LaunchUnknown,
    NoCapacityObserved,
    NodeLossObserved,
    OutcomeCommitted,
    ProgressObserved,
    RecoveryCommitted,
    StopRequested,
    StopWhy,
    SubmissionOpened,
    SubmissionWhy,
)
from dispatch_core.failover import current_cluster, failover_cluster, staying_cluster
from dispatch_core.fold import fold
from dispatch_core.job import Attempt, Hold, Job, LaunchOutcome, ObjectRecord, Submission
from dispatch_core.policy import planned_wait_s
from dispatch_core.progress import Verdict, fact_for, last_step, observe, verdict
from dispatch_core.project import settled
from dispatch_core.state import (
    Action,
    Cause,
    CauseKind,
    Declarations,
    Discovery,
    GateState,
    HoldKind,
    JobSpec,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    PlannedRule,
    Provenance,
    State,
    UnknownLaunchPolicy,
)
from dispatch_core.steps import (
    AnyStep,
    AskCessation,
    Commit,
    Deliver,
    Launch,
    OpenGate,
    Pass,
    Stop,
)
from dispatch_core.writers import WriterKind

__all__ = ["RESUME_INTERVAL_S", "STOP_INTERVAL_S", "VANISHED_DETAIL", "next_steps", "planned"]

STOP_INTERVAL_S: Final = 60.0
"""Seconds between two asks to stop an object that is still alive (docs/core-semantics.md,
planner rule 9): a stop lost on the way is asked again, so the job can settle."""

RESUME_INTERVAL_S: Final = 30.0
"""Seconds after a launch's intent, or after its start last came back unknown, before the
same attempt is started again on a backend whose start is idempotent per attempt
(docs/core-semantics.md, "Launches that survive the launcher"): a start still in flight in a
live supervisor answers well within it."""

_RESUMED: Final = "started again (the backend finds the object if one was made)"
"""The words of the ``LaunchUnknown`` committed when a launch is started again."""

VANISHED_DETAIL: Final = (
    "the scheduler has no record of this object: it no longer lists it, and has no end of it "
    "where it keeps ends"
)
"""The detail of the ``unknown`` end recorded for an object a Discovery lists as vanished
(issue 15, "gone is not ended")."""

_RUNNING: Final = frozenset({ObjectPhase.RUNNING, ObjectPhase.STOPPING})
_SEEN_ALIVE: Final = frozenset({ObjectPhase.PENDING, *_RUNNING})
"""Phases that show an object alive on a known footing: one of them without node-lost ends
a node-loss window (:func:`_fence`)."""
_RECOVERY_WHYS: Final = frozenset({"recovery", "ceased"})
"""``SubmissionOpened.why`` of the submissions a non-native ``RecoveryCommitted`` opens."""


class _Unset:
    """The type of ``_UNSET``: a cached value not computed yet."""


_UNSET: Final = _Unset()


class _Pass:
    """The working state of one pass: the job as if this pass's commits were applied, and
    the steps decided so far, by kind, in the order they are carried out."""

    __slots__ = (
        "_primary",
        "asks",
        "commits",
        "declarations",
        "discovery",
        "foreign",
        "gates",
        "given",
        "job",
        "launches",
        "now",
        "own",
        "stops",
        "wakes",
    )

    def __init__(
        self, job: Job, discovery: Discovery | None, declarations: Declarations, now: datetime
    ) -> None:
        self.given = job
        self.job = job
        self.discovery = discovery
        self.declarations = declarations
        self.now = now
        self.own: dict[ObjectRef, ObservedObject] = {}
        self.foreign: list[ObservedObject] = []
        if discovery is not None:
            for obj in discovery.objects:
                if obj.foreign:
                    self.foreign.append(obj)
                else:
                    self.own[obj.ref] = obj
        self.commits: list[AnyStep] = []
        self.stops: list[AnyStep] = []
        self.gates: list[AnyStep] = []
        self.launches: list[AnyStep] = []
        self.asks: list[AnyStep] = []
        self.wakes: list[datetime] = []
        self._primary: ObjectRecord | _Unset | None = _UNSET

    # -- keys, wakes, applying --------------------------------------------------------------

    def key(self, what: str, which: object) -> str:
        """The idempotency key ``<job>:<what>:<which>`` (the shell's ``Nats-Msg-Id``)."""
        return f"{self.job.job_id}:{what}:{which}"

    def wake(self, at: datetime) -> None:
        """Note a deadline; only a future one can wake the job."""
        if at > self.now:
            self.wakes.append(at)

    def due(self, at: datetime) -> bool:
        """Whether the deadline ``at`` has come; before it, note it as a wake.

        The one reading of every window the rules keep (a node-loss fence, a no-capacity
        wait, an unresolved age, a resume or cessation interval, a stop or clean-up
        deadline): seen since some time, has it lasted long enough to act on?
        """
        if self.now < at:
            self.wake(at)
            return False
        return True

    def apply(self, event: JobEvent) -> None:
        """Fold ``event`` into the working job, as the record will once it is committed."""
        self.job = fold(
            ((self.job.seq + 1, event, WriterKind.SUPERVISOR),), self.now, prior=self.job
        )
        self._primary = _UNSET

    def commit(self, what: str, which: object, event: JobEvent) -> None:
        """Decide a ``Commit`` step and apply its event."""
        self.commits.append(Commit(key=self.key(what, which), event=event))
        self.apply(event)

    def escalate(self, escalation_id: str, detail: str) -> None:
        """Commit an escalation, once per id over the job's life (seed 002: "Each
        escalation is committed once, keyed by its ID")."""
        if self.job.escalation(escalation_id) is None:
            self.commit(
                "escalation",
                escalation_id,
                EscalationCommitted(
                    job_id=self.job.job_id, at=self.now, id=escalation_id, detail=detail
                ),
            )

    def stop(
        self,
        ref: ObjectRef,
        why: StopWhy,
        *,
        emergency: bool = False,
        submission: int | None = None,
        attempt: int | None = None,
        cause: Cause | None = None,
    ) -> None:
        """Decide a ``Stop`` step (its intent is applied at once)."""
        record = self.job.object(ref)
        if emergency:
            which = f"{ref}:{_iso(self.job.emergency_stop_at)}"
            what = "emergency-stop"
        else:
            which = f"{ref}:{why}:{_iso(None if record is None else record.stop_requested_at)}"
            what = "stop"
        intent = StopRequested(
            job_id=self.job.job_id,
            at=self.now,
            ref=ref,
            why=why,
            emergency=emergency,
            submission=submission,
            attempt=attempt,
            cause=cause,
        )
        self.stops.append(Stop(key=self.key(what, which), intent=intent))
        self.apply(intent)
        self.wake(self.now + timedelta(seconds=STOP_INTERVAL_S))  # asked again while alive

    # -- what the rules ask of the job ------------------------------------------------------

    def primary(self) -> ObjectRecord | None:
        """The current submission's object: the first object the record holds as launched
        for the current N (a later one of the same N is a duplicate of it)."""
        if self._primary is _UNSET:
            sub = self.job.submission
            self._primary = None if sub is None else self.job.first_launched(sub.number)
        assert not isinstance(self._primary, _Unset)
        return self._primary

    def decidable(self) -> bool:
        """Whether an ending of the current execution may be decided now: no outcome, and
        no recovery hold (the decision that already stands)."""
        hold = self.job.hold
        return self.job.outcome is None and (hold is None or hold.kind is HoldKind.ACTOR)

    def settled(self) -> bool:
        """Whether the job, as if this pass's commits were applied, has settled."""
        return settled(self.job, self.discovery)


def next_steps(
    job: Job, discovery: Discovery | None, declarations: Declarations, now: datetime
) -> Pass:
    """Plan one supervisor pass of ``job`` (DESIGN.md section 4; docs/core-semantics.md,
    "The planner").

    Args:
        job: the job's folded record.
        discovery: what the backend shows now of the job's objects, or ``None`` when nothing
            has been seen (then only record-driven steps happen).
        declarations: what the job's backend declares now (node-loss window in seconds,
            native actions, optional cessation signal and emergency stop).
        now: the time of the pass (timezone-aware).

    Returns:
        The pass: ``Commit`` steps first, then actions (stops, gates, launches, cessation
        asks), then ``Deliver`` of the escalations the record held undelivered; ``wake_at``
        is the earliest future deadline; ``settled`` whether the job, with this pass's
        commits applied, has an outcome and nothing of it can still act.

    Raises:
        ValueError: ``discovery`` is another job's.
    """
    return planned(job, discovery, declarations, now)[0]


def planned(
    job: Job, discovery: Discovery | None, declarations: Declarations, now: datetime
) -> tuple[Pass, Job]:
    """:func:`next_steps`, with the job as it will be once the pass's decisions (its
    ``Commit`` events, then its ``Stop`` and fresh ``Launch`` intents) are committed: the
    planner's working copy, folded with :func:`~dispatch_core.fold.fold` itself as the pass
    was planned (``seq`` counts one per decision).

    Raises:
        ValueError: ``discovery`` is another job's.
    """
    if discovery is not None and discovery.job_id != job.job_id:
        raise ValueError(
            f"next_steps: discovery of job {discovery.job_id!r} given for job {job.job_id!r}"
        )
    p = _Pass(job, discovery, declarations, now)
    _found_launches(p)
    _endings(p)
    _fence(p)
    _no_capacity(p)
    _holds(p)
    _launches(p)
    _resume_launches(p)
    _unknown_launches(p)
    _gates(p)
    _foreign(p)
    _stops(p)
    _stop_overdue(p)
    _cleanup(p)
    deliver = _deliver(p)
    steps = (*p.commits, *p.stops, *p.gates, *p.launches, *p.asks, *deliver)
    return Pass(steps=steps, wake_at=min(p.wakes, default=None), settled=p.settled()), p.job


# -- 1. found launches ----------------------------------------------------------------------


def _found_launches(p: _Pass) -> None:
    """Match own objects to the record; record a launch found for an unknown attempt, stop
    a duplicate.

    Seed 002, "all-unknown:<N> or unmatched:<N>/<a>": "A Start call's outcome stayed
    unknown ... and no object turned up for it": an object that does turn up for an unknown
    attempt is that launch (``LaunchRecorded(found=True)``). An object for an attempt that
    was abandoned, refused or never intended, or a second object for an attempt that has one,
    is a duplicate: stopped once (seed 000: the kind list has ``duplicate``), its end recorded
    but never driving recovery.
    """
    job = p.job
    for obs in p.own.values():
        if job.object(obs.ref) is not None:
            continue
        assert obs.submission is not None  # own objects are not foreign
        assert obs.attempt is not None
        attempt = _attempt(p.job, obs.submission, obs.attempt)
        if attempt is not None and attempt.outcome is LaunchOutcome.UNKNOWN:
            p.commit(
                "found",
                f"{obs.submission}/{obs.attempt}",
                LaunchRecorded(
                    job_id=job.job_id,
                    at=p.now,
                    submission=obs.submission,
                    attempt=obs.attempt,
                    ref=obs.ref,
                    found=True,
                ),
            )
        elif obs.alive:
            p.stop(obs.ref, StopWhy.DUPLICATE, submission=obs.submission, attempt=obs.attempt)


# -- 2. endings -----------------------------------------------------------------------------


def _endings(p: _Pass) -> None:
    """Record every execution that ended, and decide the current one's.

    Seed 000, "An object ending is not the job ending": "When an object ends, the scheduler
    is done with it, but the job isn't necessarily done. The plan decides." Each earlier
    execution an object reports (a native requeue or restart), and its current one once
    its phase is ``ended``, is recorded once (``ExecutionEnded``); an object the scheduler
    no longer shows is *gone*, its execution ended (cause ``unknown`` from the scheduler, or
    ``cancelled`` by dispatch when dispatch had asked it to stop). Only the current
    submission's object drives the job: its new endings go to :func:`_decide_ending`, in
    order. A decision a crash separated from its ending is made again
    (:func:`_resume_recovery`, :func:`_resume_decision`).
    """
    _resume_recovery(p)
    decided = False
    # Only an object the discovery shows or lists vanished can have a new ending (what
    # _new_endings reads): those, in record order, not every object the record ever held.
    seen = [*p.own, *(() if p.discovery is None else p.discovery.vanished)]
    for record in p.job.objects_among(seen):
        obs = p.own.get(record.ref)
        for restart, cause in _new_endings(p, record, obs):
            _commit_end(p, record.ref, restart, cause, record.submission)
            primary = p.primary()
            if primary is not None and primary.ref == record.ref and p.decidable():
                lived_on = obs is not None and obs.restarts > restart
                _decide_ending(p, record.ref, restart, cause, lived_on=lived_on)
                decided = True
    # Own objects the record still doesn't hold are duplicates seen only once ended: their
    # end is recorded (which registers them), and never drives recovery.
    for obs in p.own.values():
        if p.job.object(obs.ref) is None and obs.phase is ObjectPhase.ENDED:
            assert obs.submission is not None
            for execution in obs.executions:
                _record_duplicate_end(p, obs, execution.restart, execution.cause)
            if obs.restarts not in {e.restart for e in obs.executions}:
                _record_duplicate_end(p, obs, obs.restarts, _ended_cause(obs))
    if not decided:
        _resume_decision(p)


def _record_duplicate_end(p: _Pass, obs: ObservedObject, restart: int, cause: Cause) -> None:
    record = p.job.object(obs.ref)
    if record is not None and restart in record.ended:
        return
    assert obs.submission is not None
    _commit_end(p, obs.ref, restart, cause, obs.submission)


def _commit_end(p: _Pass, ref: ObjectRef, restart: int, cause: Cause, submission: int) -> None:
    """Record that execution ``restart`` of ``ref`` (of ``submission``) ended with ``cause``."""
    p.commit(
        "ended",
        f"{ref}/{restart}",
        ExecutionEnded(
            job_id=p.job.job_id,
            at=p.now,
            ref=ref,
            restart=restart,
            cause=cause,
            submission=submission,
        ),
    )


def _new_endings(
    p: _Pass, record: ObjectRecord, obs: ObservedObject | None
) -> list[tuple[int, Cause]]:
    """The executions of ``record`` that ended and the record doesn't hold, oldest first."""
    ended = set(record.ended)
    out: list[tuple[int, Cause]] = []
    if obs is not None:
        for execution in obs.executions:
            if execution.restart not in ended:
                ended.add(execution.restart)
                out.append((execution.restart, execution.cause))
        if obs.phase is ObjectPhase.ENDED and obs.restarts not in ended:
            out.append((obs.restarts, _stopped_end(record, _ended_cause(obs))))
        return out
    restart = _vanished_restart(p, record)
    if restart is not None:
        if record.stop_why == StopWhy.NO_CAPACITY and record.stop_cause is not None:
            cause = record.stop_cause
        elif record.stop_requested_at is not None:
            cause = Cause(
                kind=CauseKind.CANCELLED,
                provenance=Provenance.ACTOR,
                actor=SUPERVISOR,
                detail=f"{VANISHED_DETAIL}; dispatch had asked it to stop ({record.stop_why})",
                at=p.now,
            )
        else:
            cause = Cause(
                kind=CauseKind.UNKNOWN, provenance=Provenance.SCHEDULER, detail=VANISHED_DETAIL
            )
        out.append((restart, cause))
    return out


def _vanished_restart(p: _Pass, record: ObjectRecord) -> int | None:
    """R of the execution of ``record`` to record ended because the Discovery of its cluster
    lists it as vanished, or ``None`` when it isn't (or its end is already recorded).

    Gone is not ended (issue 15): an object merely absent from a Discovery proves nothing
    (the Discovery may predate it, the observer may never have seen it, the scheduler may
    keep its end elsewhere), so only an object the observer saw alive and the scheduler then
    had no word for in a full reachable poll (``Discovery.vanished``) is ended here; every
    other end comes from what the backend shows (its accounting, archive, or the observer's
    memory of the object's end).

    Its execution R is 0 (or the one that lost its node) when none ended yet; for the
    current submission's object whose earlier executions each lived on (native
    recoveries), the next R.
    """
    discovery = p.discovery
    if (
        discovery is None
        or not discovery.covers(record.ref.cluster)
        or record.fenced
        or record.ref not in discovery.vanished
    ):
        return None
    if not record.ended:
        return record.node_loss_restart or 0
    primary = p.primary()
    if (
        primary is not None
        and primary.ref == record.ref
        and p.job.hold is None
        and p.job.outcome is None
    ):
        return max(record.ended) + 1
    return None


def _stopped_end(record: ObjectRecord, cause: Cause) -> Cause:
    """The cause to record for an end of ``record`` the scheduler shows as ``cause``.

    An object dispatch stopped for want of capacity (why ``no-capacity``) that the scheduler
    shows ``cancelled`` ended as the stop said: ``no-capacity``, with the scheduler's words
    from when it waited (``StopRequested.cause``), not as a cancel, which would be final
    (docs/core-semantics.md, "No capacity"). dispatch recognises its own stops from the
    record (the Slurm backend names the uid of a cancel, never who it was). Any other end
    (it started and ended on its own before the stop reached it) is the scheduler's.
    """
    if (
        cause.kind is CauseKind.CANCELLED
        and record.stop_why == StopWhy.NO_CAPACITY
        and record.stop_cause is not None
    ):
        return record.stop_cause
    return cause


def _ended_cause(obs: ObservedObject) -> Cause:
    """The cause of an ended object's current execution; an adapter that gives none is
    reported as ``unknown`` from the scheduler, never guessed (seed 000, "State and cause")."""
    if obs.cause is not None:
        return obs.cause
    return Cause(
        kind=CauseKind.UNKNOWN,
        provenance=Provenance.SCHEDULER,
        detail="the scheduler showed the object ended without a cause",
    )


def _resume_recovery(p: _Pass) -> None:
    """Open the submission a committed recovery opens, when a crash separated them.

    Seed 000: "a rule with budget left: the job is recovering, and the supervisor starts
    the next submission". Each non-native ``RecoveryCommitted`` is committed with its
    ``SubmissionOpened``; if the record holds one without the other, the submission is
    opened now, and no budget is spent twice.
    """
    job = p.job
    if (
        job.outcome is None
        and job.recoveries_made(native=False) > job.submissions_opened(*_RECOVERY_WHYS)
        and job.submission is not None
    ):
        recoveries = [r for r in job.recoveries if not r.native]
        last = recoveries[-1]
        _open_submission(p, SubmissionWhy.RECOVERY, last.cause, job.plan.rules[last.rule])


def _resume_decision(p: _Pass) -> None:
    """Decide the current execution's end when the record holds it undecided.

    Every decision on a final end (the object no longer runs) opens a submission, places a
    hold or commits an outcome in the pass that records the end; a current object that ended
    for good with none of those is an end whose decision a crash lost. It is decided now, on
    the cause the scheduler shows (or the record's last ending cause).
    """
    primary = p.primary()
    if primary is None or not primary.ended or not p.decidable():
        return
    obs = p.own.get(primary.ref)
    # Only an end the scheduler shows (or the fence made) is resumed here; an object that
    # vanished gets its end recorded, and decided, by the vanished rule.
    if not primary.fenced and (obs is None or obs.alive or obs.restarts not in primary.ended):
        return
    cause = obs.cause if obs is not None and obs.cause is not None else p.job.ended_cause
    if cause is None:
        return
    cause = _stopped_end(primary, cause)
    _decide_ending(p, primary.ref, max(primary.ended), cause, lived_on=False)


# -- 3. the decision on an ending ----------------------------------------------------------------


def _decide_ending(p: _Pass, ref: ObjectRef, restart: int, cause: Cause, *, lived_on: bool) -> None:
    """Apply the plan to an execution of the current submission's object that ended.

    Seed 000, "An object ending is not the job ending": "a rule with budget left: the job is
    recovering, and the supervisor starts the next submission; a hold rule: the job is held
    under a recovery hold, until a person resubmits, cancels or gives up; no rule, a spent
    budget, an escalate rule, or a rule nobody enforces: the job is failed, with the cause
    that ended the execution, and an escalation." ``none`` is success, and "cancelled from
    the scheduler is final". "restart and requeue are carried out only by a backend that
    enforces them natively": when the object ``lived_on`` (the scheduler ran it again) under
    a rule with budget left, that is the rule's recovery (``native``); a rule that wants
    something else stops it (why ``recovery``).

    Args:
        p: the pass.
        ref: the object.
        restart: R of the execution that ended.
        cause: why it ended.
        lived_on: whether the scheduler ran the object again after it (a later execution).
    """
    kind = cause.kind
    # A no-capacity end is of an object that never ran: no progress to account for.
    fact = None if kind is CauseKind.NO_CAPACITY else _progress(p, ref, restart, cause)
    if kind is CauseKind.NONE:
        _outcome(p, State.SUCCEEDED, cause)
        return
    if kind is CauseKind.CANCELLED:
        # A cancel that reached the scheduler is never undone by recovery (seed 000).
        _outcome(p, State.CANCELLED, cause)
        return
    rule = p.job.plan.rule_for(kind)
    if rule is None:
        _fail(p, ref, cause, f"no rule covers {kind}", lived_on=lived_on)
        return
    if rule.unenforced is not None:
        _fail(
            p,
            ref,
            cause,
            f"rule {rule.rule} ({rule.action} on {kind}): {rule.unenforced}",
            lived_on=lived_on,
        )
        return
    match rule.action:
        case Action.ESCALATE:
            _fail(
                p,
                ref,
                cause,
                f"the escalate rule (rule {rule.rule}) covers {kind}",
                lived_on=lived_on,
            )
        case Action.HOLD:
            if lived_on:
                p.stop(ref, StopWhy.RECOVERY)
            _place_recovery_hold(p, rule, cause)
        case Action.RESUBMIT | Action.RESTART | Action.REQUEUE:
            judged = verdict(rule, p.job.spent(rule.rule), fact)
            free = judged is Verdict.FREE
            if judged is Verdict.SPENT:
                _fail(p, ref, cause, _spent(rule, kind), lived_on=lived_on)
            elif judged is Verdict.NO_PROGRESS:
                if lived_on:
                    p.stop(ref, StopWhy.RECOVERY)
                _place_no_progress_hold(p, rule, cause)
            elif lived_on:
                _recover(p, ref, restart, rule, cause, native=True, free=free)
            elif rule.action is Action.RESUBMIT:
                _recover(p, ref, restart, rule, cause, native=False, free=free)
                _open_submission(p, SubmissionWhy.RECOVERY, cause, rule)
            else:
                _fail(
                    p,
                    ref,
                    cause,
                    f"rule {rule.rule} ({rule.action} on {kind}) is the backend's, and the "
                    f"backend did not {rule.action} the object: it ended for good",
                    lived_on=False,
                )
        case _:
            assert_never(rule.action)


def _spent(rule: PlannedRule, kind: CauseKind) -> str:
    on = ", ".join(rule.on)
    return (
        f"the budget of rule {rule.rule} ({rule.action} on {on}, budget {rule.budget}) is "
        f"spent, and {kind} ended the execution again"
    )


def _recover(
    p: _Pass,
    ref: ObjectRef,
    restart: int,
    rule: PlannedRule,
    cause: Cause,
    *,
    native: bool,
    free: bool = False,
) -> None:
    action = rule.substituted_for or rule.action
    p.commit(
        "recovery",
        f"{ref}/{restart}",
        RecoveryCommitted(
            job_id=p.job.job_id,
            at=p.now,
            rule=rule.rule,
            action=action,
            cause=cause,
            native=native,
            free=free,
        ),
    )


def _progress(p: _Pass, ref: ObjectRef, restart: int, cause: Cause) -> ProgressObserved | None:
    """Record the job's publications for an execution of the current object that ended
    (issue 14, part 1), once per execution, and return the fact.

    Recorded when the rule covering the cause reads publications (``free_if_progress`` or
    ``max_without_progress``) or the Discovery read the job's ``pub/`` listing; otherwise
    nothing is recorded and the rule spends as it always did. A fact a crash separated from
    its decision is reused.
    """
    known = fact_for(p.job, ref, restart)
    if known is not None:
        return known
    rule = p.job.plan.rule_for(cause.kind)
    publications = None if p.discovery is None else p.discovery.publications
    if publications is None and (rule is None or not rule.progress_aware):
        return None
    record = p.job.object(ref)
    assert record is not None  # only the current submission's object is decided
    fact = observe(
        p.job,
        ref=ref,
        restart=restart,
        submission=record.submission,
        rule=rule,
        publications=publications,
        now=p.now,
    )
    p.commit("progress", f"{ref}/{restart}", fact)
    return fact


def _place_no_progress_hold(p: _Pass, rule: PlannedRule, cause: Cause) -> None:
    """Hold the job under a recovery hold and escalate ``no-progress:<N>`` (issue 14): N
    executions in a row ended by a cause ``rule`` covers without advancing the published
    step. A person resubmits, gives up or cancels; the escalation is committed once per job
    (seed 002), a later no-progress hold of the same N places its hold alone."""
    limit = rule.max_without_progress
    assert limit is not None
    step = last_step(p.job)
    published = "nothing is published" if step is None else f"the published step stays {step}"
    reason = (
        f"{limit} executions in a row ended by a cause rule {rule.rule} covers (this one "
        f"{cause.kind}) and {published}; rule {rule.rule} holds the job for a person "
        f"(max_without_progress = {limit})"
    )
    _place_recovery_hold(p, rule, cause, reason=reason)
    p.escalate(esc_id(EscalationKind.NO_PROGRESS, limit), reason)


def _open_submission(
    p: _Pass, why: SubmissionWhy, cause: Cause | None, rule: PlannedRule | None = None
) -> None:
    """Open the next submission: on the next cluster of ``rule``'s failover list when a
    recovery by ``rule`` opens it, else where the job is (``dispatch_core.failover``)."""
    number = len(p.job.submissions) + 1
    cluster = failover_cluster(p.job, rule) if rule is not None else staying_cluster(p.job)
    p.commit(
        "submission",
        number,
        SubmissionOpened(
            job_id=p.job.job_id,
            at=p.now,
            submission=number,
            why=why,
            cause=cause,
            cluster=cluster,
        ),
    )


def _outcome(p: _Pass, state: State, cause: Cause) -> None:
    """Commit the job's outcome; "Only a committed outcome is terminal" and it never
    changes (seed 000), so a job with one gets no other.

    A person's hold still in force (an execution can end under it) ends with the job, as a
    cancel ends it: nothing is left to release, resubmit or give up.
    """
    if p.job.outcome is not None:
        return
    hold = p.job.hold
    if hold is not None:
        p.commit(
            "release",
            hold.instance,
            HoldReleased(
                job_id=p.job.job_id,
                at=p.now,
                instance=hold.instance,
                by=SUPERVISOR,
                how=HoldHow.OUTCOME,
                reason=f"the job has an outcome: {state}",
            ),
        )
    p.commit(
        "outcome",
        state,
        OutcomeCommitted(job_id=p.job.job_id, at=p.now, state=state, cause=cause),
    )


def _fail(p: _Pass, ref: ObjectRef, cause: Cause, why: str, *, lived_on: bool) -> None:
    """Fail the job "with the cause that ended the execution, and an escalation"
    (``failed:<cause>``, seed 002: "The detail says why")."""
    if lived_on:
        p.stop(ref, StopWhy.RECOVERY)
    _outcome(p, State.FAILED, cause)
    words = f": {cause.detail}" if cause.detail else ""
    p.escalate(
        esc_id(EscalationKind.FAILED, cause.kind),
        f"the job failed with {cause.kind} ({cause.provenance}{words}): {why}",
    )


def _place_recovery_hold(
    p: _Pass, rule: PlannedRule, cause: Cause, *, reason: str | None = None
) -> None:
    """Place a recovery hold for a hold rule.

    Seed 000: "a hold rule: the job is held under a recovery hold, until a person
    resubmits, cancels or gives up". An actor hold already in force is replaced by it (the
    job stays held; what a person may do with it is what a recovery hold allows), because
    a record holds at most one hold in force.
    """
    job = p.job
    current = job.hold
    if current is not None:
        p.commit(
            "release",
            current.instance,
            HoldReleased(
                job_id=job.job_id,
                at=p.now,
                instance=current.instance,
                by=SUPERVISOR,
                how=HoldHow.REPLACED,
                reason=f"an execution ended with {cause.kind}; a recovery hold replaces it",
            ),
        )
    instance = len(p.job.holds) + 1
    if reason is not None:
        pass
    elif rule.substituted_for is not None:
        reason = (
            f"{cause.kind} ended the execution; the job shares a mutable checkpoint, so rule "
            f"{rule.rule} ({rule.substituted_for}) became a hold until its processes are "
            "known to have stopped (seed 004)"
        )
    else:
        reason = f"{cause.kind} ended the execution; rule {rule.rule} holds the job for a person"
    p.commit(
        "hold",
        instance,
        HoldPlaced(
            job_id=job.job_id,
            at=p.now,
            instance=instance,
            kind=HoldKind.RECOVERY,
            by=SUPERVISOR,
            reason=reason,
            deadline=p.now + timedelta(seconds=rule.hold_for_s),
            cause=cause,
            rule=rule.rule,
            substituted_for=rule.substituted_for,
        ),
    )


# -- 4. the node-loss fence -----------------------------------------------------------------


def _fence(p: _Pass) -> None:
    """The node-loss fence.

    Seed 000, "The node-loss fence": "Inside the window the job is running with cause
    node-lost ... Past it, Next asks for the object to be stopped, then applies the plan for
    node-lost." The window (``declarations.node_loss_window_s``) counts unbroken node-lost
    sightings of one execution: the first pass that sees the current object running with
    cause node-lost commits ``NodeLossObserved(since=cause.at or discovery.seen_at)``; a pass
    that sees it alive otherwise (pending, running or stopping without node-lost: its node
    came back) while a window is open commits ``NodeLossObserved(since=None)``, ending it (an
    ended object or an unknown phase doesn't end it), and a later node-lost sighting
    begins a new window. A pass that doesn't see the object says nothing of the window.
    Facts only on a change, never per poll. ``wake_at`` includes the window's end. A node
    lost at 0, back at 10 and lost again at 500 is fenced at 500 + window, not at 0 + window.
    """
    primary = p.primary()
    if primary is None or p.job.outcome is not None or p.discovery is None:
        return
    obs = p.own.get(primary.ref)
    if obs is None or obs.restarts in primary.ended:
        return
    since = primary.node_loss_since
    cause = obs.cause
    if obs.phase not in _RUNNING or cause is None or cause.kind is not CauseKind.NODE_LOST:
        if since is not None and obs.phase in _SEEN_ALIVE:
            # Seen alive otherwise (its node back): the window is broken; a later loss starts
            # anew. An ended object's end is recorded by the ending rules, not read as a node
            # back; an unknown phase says nothing of the node.
            restart = primary.node_loss_restart
            p.commit(
                "node-loss",
                f"{primary.ref}/{restart}@{_iso(since)}:ended",
                NodeLossObserved(
                    job_id=p.job.job_id,
                    at=p.now,
                    ref=primary.ref,
                    restart=obs.restarts if restart is None else restart,
                    since=None,
                ),
            )
        return
    # The window runs from the first sight of the loss on this execution; a scheduler whose
    # condition time moves on each poll must not push the fence away for ever.
    if since is None or primary.node_loss_restart != obs.restarts:
        since = cause.at or p.discovery.seen_at
        p.commit(
            "node-loss",
            f"{primary.ref}/{obs.restarts}@{_iso(since)}",
            NodeLossObserved(
                job_id=p.job.job_id,
                at=p.now,
                ref=primary.ref,
                restart=obs.restarts,
                since=since,
                cause=cause,
            ),
        )
    end = since + timedelta(seconds=p.declarations.node_loss_window_s)
    if not p.due(end):
        return
    p.stop(primary.ref, StopWhy.FENCE)
    p.commit(
        "ended",
        f"{primary.ref}/{obs.restarts}",
        ExecutionEnded(
            job_id=p.job.job_id,
            at=p.now,
            ref=primary.ref,
            restart=obs.restarts,
            cause=cause,
            fenced=True,
            submission=primary.submission,
        ),
    )
    if p.decidable():
        _decide_ending(p, primary.ref, obs.restarts, cause, lived_on=False)


def _no_capacity(p: _Pass) -> None:
    """Stop the current submission's object once it waited the rule's ``wait_s`` without
    capacity, without a break (docs/core-semantics.md, "No capacity").

    Issue 14, part 2: a rule may name ``no-capacity`` (and fail over to another cluster on
    it); a backend reports a waiting object's reason as ``ObservedObject.cause`` ``no-capacity``
    (phase ``pending``). Like the node-loss fence (:func:`_fence`), the wait runs from the
    first sighting, kept in the record: the first pass that sees the object pending, gate
    open, with a no-capacity cause commits ``NoCapacityObserved(since=discovery.seen_at)``;
    a pass that sees it otherwise (queued on another reason, running, held) while a wait
    runs commits ``NoCapacityObserved(since=None)``, ending it, and a later sighting begins
    a new one. So a job that queued on ``Resources`` for longer than ``wait_s`` and shows
    ``ReqNodeNotAvail`` for one poll (Slurm's backfill does, briefly, on healthy clusters:
    reframe#1049) is not stopped: its wait began at that poll. Once ``now`` reaches
    ``since + wait_s`` and the scheduler still shows it so, it is stopped (why
    ``no-capacity``, with that cause); the rule is applied when the scheduler confirms the
    end (:func:`_stopped_end`), never before, so the object can't start running beside the
    next submission. Before that, the deadline is a wake. Only an object that never ran under
    the record (no execution of it recorded ended), its gate opened by dispatch, is counted;
    with no rule covering ``no-capacity`` nothing is recorded and the object waits as the
    scheduler decides. Sightings are recorded whatever holds the job, so the wait a stop
    reads is one of unbroken sightings; a job under a hold, or with an outcome, is not
    stopped.
    """
    primary = p.primary()
    if primary is None or p.discovery is None or p.job.outcome is not None:
        return
    if primary.gate_opened_at is None or primary.ended or primary.stop_requested_at is not None:
        return
    rule = p.job.plan.rule_for(CauseKind.NO_CAPACITY)
    obs = p.own.get(primary.ref)
    if rule is None or obs is None:
        return  # not seen: nothing to say of the wait either way
    cause = obs.cause
    waiting = (
        obs.phase is ObjectPhase.PENDING
        and obs.gate is GateState.OPEN
        and cause is not None
        and cause.kind is CauseKind.NO_CAPACITY
    )
    since = primary.no_capacity_since
    if not waiting or cause is None:
        if since is not None:  # the wait is broken: a later no-capacity starts a new one
            p.commit(
                "no-capacity",
                f"{primary.ref}@{_iso(since)}:ended",
                NoCapacityObserved(job_id=p.job.job_id, at=p.now, ref=primary.ref, since=None),
            )
        return
    if since is None:
        since = p.discovery.seen_at
        p.commit(
            "no-capacity",
            f"{primary.ref}@{_iso(since)}",
            NoCapacityObserved(
                job_id=p.job.job_id, at=p.now, ref=primary.ref, since=since, cause=cause
            ),
        )
    if not p.decidable() or p.job.hold is not None:
        return
    end = since + timedelta(seconds=planned_wait_s(rule))
    if not p.due(end):
        return
    p.stop(primary.ref, StopWhy.NO_CAPACITY, cause=replace(cause, at=cause.at or end))


# -- 5. holds and cessation -----------------------------------------------------------------


def _holds(p: _Pass) -> None:
    """Escalate an overdue hold; ask the cessation signal; lift a hold on ``ceased``.

    Seed 002, ``overdue:<instance>``: "a hold past its deadline. The hold stays in force;
    dispatch never releases or fails a job on its own." Seed 004, "When a job can't
    isolate": "While such a hold stands, the supervisor asks it about the ended object every
    dispatch.CessationInterval, a minute, and records each answer in the record as a
    cessation fact. A ceased answer lifts the hold, and the rule it stood in for applies
    again: a resubmit rule with budget left starts the next submission. Without the
    interface, or while the answer is no, the job waits for a person."
    """
    job = p.job
    hold = job.hold
    if hold is None or job.outcome is not None:
        return
    escalation_id = esc_id(EscalationKind.OVERDUE, hold.instance)
    if p.now >= hold.deadline:
        p.escalate(
            escalation_id,
            f"hold {hold.instance} ({hold.kind}, by {hold.by.name}: {hold.reason}) is past its "
            f"deadline {_iso(hold.deadline)}; it stays in force until a person decides",
        )
    elif job.escalation(escalation_id) is None:
        p.wake(hold.deadline)
    if hold.kind is not HoldKind.RECOVERY or hold.substituted_for is None:
        return
    primary = p.primary()
    if primary is None:
        return
    asked = primary.cessation_asked_at
    answered = asked is not None and asked >= hold.placed_at
    if answered and primary.ceased:
        _ceased(p, hold)
        return
    if not p.declarations.cessation_signal:
        return
    if answered and asked is not None:
        next_ask = asked + timedelta(seconds=CESSATION_INTERVAL_S)
        if not p.due(next_ask):
            return
    obs = p.own.get(primary.ref)
    p.wake(p.now + timedelta(seconds=CESSATION_INTERVAL_S))  # ask again if no answer comes
    p.asks.append(
        AskCessation(
            key=p.key("ask-cessation", f"{primary.ref}:{_iso(asked)}"),
            ref=primary.ref,
            nodes=() if obs is None else obs.nodes,
        )
    )


def _ceased(p: _Pass, hold: Hold) -> None:
    """Lift a shared-checkpoint hold on a ceased answer and apply the rule it stood in for
    (seed 004: "a resubmit rule with budget left starts the next submission")."""
    job = p.job
    p.commit(
        "release",
        hold.instance,
        HoldReleased(
            job_id=job.job_id,
            at=p.now,
            instance=hold.instance,
            by=SUPERVISOR,
            how=HoldHow.CEASED,
            reason="the backend's cessation signal says the ended object's processes are gone",
        ),
    )
    primary = p.primary()
    cause = hold.cause or job.ended_cause
    if primary is None or cause is None or hold.rule is None:
        return
    rule = job.plan.rules[hold.rule]
    original = hold.substituted_for
    if original is Action.RESUBMIT and p.job.spent(rule.rule) < rule.budget:
        restart = max(primary.ended, default=0)
        _recover(p, primary.ref, restart, rule, cause, native=False)
        _open_submission(p, SubmissionWhy.CEASED, cause, rule)
    elif original is Action.RESUBMIT:
        _fail(p, primary.ref, cause, _spent(rule, cause.kind), lived_on=False)
    else:
        _fail(
            p,
            primary.ref,
            cause,
            f"rule {rule.rule} ({original} on {cause.kind}) stood in for by a hold, and the "
            f"object has ended: only the backend carries out {original}, on a live object",
            lived_on=False,
        )


# -- 6. launches ------------------------------------------------------------------------------


def _launches(p: _Pass) -> None:
    """Open and launch submissions.

    Seed 000: "a rule with budget left: the job is recovering, and the supervisor starts
    the next submission". Seed 002: "After an all-unknown submission is abandoned, the
    supervisor launches the next one"; ``refused:<N>``: "the scheduler refused every attempt
    to launch". A refused launch is retried as the next attempt up to
    ``spec.max_launch_attempts``; while a launch's outcome is unknown nothing more is
    launched (policy ``wait``), or the next attempt is launched once the call came back
    unknown (policy ``relaunch``). Nothing is launched with an outcome or a hold in force
    (seed 002: a hold keeps the job from running until it is released).
    """
    job = p.job
    if job.outcome is not None or job.hold is not None:
        return
    sub = job.submission
    if sub is None:
        _open_submission(p, SubmissionWhy.INITIAL, None)
        _launch(p)
        return
    attempts = sub.attempts
    if any(a.outcome is LaunchOutcome.LAUNCHED for a in attempts):
        return
    last = attempts[-1] if attempts else None
    if any(a.outcome is LaunchOutcome.UNKNOWN for a in attempts):
        # relaunch: the next attempt once the last one came back unknown (not while one is
        # in flight: its detail is empty until ``LaunchUnknown``, or says it was started
        # again by :func:`_resume_launches`, whose start answers for it), or was refused or
        # closed. A resumed attempt relaunched would run beside the object its start makes.
        if (
            job.spec.on_unknown_launch is UnknownLaunchPolicy.RELAUNCH
            and last is not None
            and (
                last.outcome is not LaunchOutcome.UNKNOWN
                or (last.detail and not last.detail.startswith(_RESUMED))
            )
            and len(attempts) < job.spec.max_launch_attempts
        ):
            _launch(p)
        return
    if last is None:
        _launch(p)
        return
    abandoned = any(
        t.submission == sub.number and t.attempt is None and t.foreign is None
        for t in job.abandoned
    )
    if abandoned:
        _open_submission(p, SubmissionWhy.ABANDONED, sub.cause)
        _launch(p)
    elif len(attempts) < job.spec.max_launch_attempts:
        _launch(p)
    elif all(a.outcome is LaunchOutcome.REFUSED for a in attempts):
        _refused(p, sub)
    else:
        # Attempts a person abandoned (no object) and refusals used every attempt: the
        # submission made nothing, like an abandoned all-unknown one; launch the next.
        _open_submission(p, SubmissionWhy.ABANDONED, sub.cause)
        _launch(p)


def _launch(p: _Pass) -> None:
    """Launch the next attempt of the current submission, its start gate closed."""
    job = p.job
    sub = job.submission
    assert sub is not None
    attempt = len(sub.attempts) + 1
    intent = LaunchIntended(job_id=job.job_id, at=p.now, submission=sub.number, attempt=attempt)
    p.launches.append(
        Launch(
            key=p.key("launch", f"{sub.number}/{attempt}"),
            intent=intent,
            name=_name(job.job_id),
            spec=_launch_spec(job),
            generation=job.generation,
            submission=sub.number,
            attempt=attempt,
            exclude_nodes=_lost_nodes(p),
        )
    )
    p.apply(intent)


def _launch_spec(job: Job) -> JobSpec:
    """The spec a launch of the current submission gives its backend: ``spec.cluster`` is the
    submission's cluster (a failover runs the same spec elsewhere, issue 14 part 2)."""
    cluster = current_cluster(job)
    return job.spec if cluster == job.spec.cluster else replace(job.spec, cluster=cluster)


def _lost_nodes(p: _Pass) -> tuple[str, ...]:
    """Nodes of the job's executions that ended ``node-lost``, which a backend may avoid: on
    the cluster the launch goes to only (another cluster's node names mean nothing there, and
    Slurm refuses an ``--exclude`` naming a node it doesn't have)."""
    nodes: set[str] = set()
    here = current_cluster(p.job)
    for obs in p.own.values():
        if obs.ref.cluster != here:
            continue
        for execution in obs.executions:
            if execution.cause.kind is CauseKind.NODE_LOST:
                nodes.update(execution.nodes)
        if obs.cause is not None and obs.cause.kind is CauseKind.NODE_LOST:
            nodes.update(obs.nodes)
    return tuple(sorted(nodes))


def _refused(p: _Pass, sub: Submission) -> None:
    """Fail the job when the scheduler refused every attempt of a submission (seed 002,
    ``refused:<N>``), with cause ``launch-failed`` and the last refusal's words.

    Unless a failover rule covers ``launch-failed`` (issue 14, part 2): a resubmit rule with
    ``clusters`` and budget left whose next cluster is another one recovers instead (spending
    one), and the next submission is launched there. On the last listed cluster, or with the
    budget spent, the job fails as above: launching again where every attempt was refused
    would only be refused again.
    """
    last = sub.attempts[-1]
    cause = Cause(
        kind=CauseKind.LAUNCH_FAILED,
        provenance=Provenance.SCHEDULER,
        detail=last.detail,
        at=p.now,
    )
    rule = p.job.plan.rule_for(CauseKind.LAUNCH_FAILED)
    if (
        rule is not None
        and rule.action is Action.RESUBMIT
        and rule.unenforced is None
        and rule.clusters
        and failover_cluster(p.job, rule) != staying_cluster(p.job)
        and p.job.spent(rule.rule) < rule.budget
    ):
        p.commit(
            "recovery",
            f"refused:{sub.number}",
            RecoveryCommitted(
                job_id=p.job.job_id,
                at=p.now,
                rule=rule.rule,
                action=Action.RESUBMIT,
                cause=cause,
            ),
        )
        _open_submission(p, SubmissionWhy.RECOVERY, cause, rule)
        _launch(p)
        return
    _outcome(p, State.FAILED, cause)
    p.escalate(
        esc_id(EscalationKind.REFUSED, sub.number),
        f"the job failed: the scheduler refused every attempt to launch submission "
        f"{sub.number} ({len(sub.attempts)} attempts){_words(last.detail)}",
    )


def _resume_launches(p: _Pass) -> None:
    """Start again the current submission's last attempt when its outcome is unknown and
    the backend's start is idempotent per attempt (``Declarations.idempotent_start``).

    Issue 15, "Launches survive the launcher": a supervisor killed between committing a
    launch intent and recording its outcome left the attempt unknown, and since nothing may
    resubmit on unknown, a person had to abandon a launch the backend could have completed.
    On an idempotent backend a second start of the same (job, N, a) makes no second object:
    it returns the one the first start made (pending, running or ended) or makes it now, so
    the planner may simply ask again. It does so

    * :data:`RESUME_INTERVAL_S` after its intent for an attempt no start has answered
      (``unknown_at`` is ``None``: its start was cut off, or is still in flight in another
      supervisor, which the interval makes unlikely and idempotence makes harmless);
    * :data:`RESUME_INTERVAL_S` after a start of it last came back unknown, unless
      :func:`_launches` launched the next attempt instead (policy ``relaunch``).

    Each time it first commits ``LaunchUnknown`` (the outcome is not known; the words say it
    is started again), so two supervisors never resume the same attempt at once (the commit
    is a decision, appended under optimistic concurrency), the next try waits its interval
    whatever this one's fate, and planning again gives nothing new. Then the ``Launch`` step,
    with ``resume`` set, carries the attempt's own intent (already in the record).

    It asks only for the last attempt of the current submission, with no attempt of it
    launched: an earlier unknown attempt (policy ``relaunch``) started again would be a
    duplicate of the one that followed it, so it stays ``unmatched:<N>/<a>`` for a person
    (seed 002). The start gate stays closed whatever the job's hold or outcome: an object it
    makes for a job that has an outcome is stopped by :func:`_stops` like any other, which
    settles the record without a person.
    """
    if not p.declarations.idempotent_start or p.launches:
        return
    job = p.job
    sub = job.submission
    if sub is None or not sub.attempts:
        return
    if any(a.outcome is LaunchOutcome.LAUNCHED for a in sub.attempts):
        return
    last = sub.attempts[-1]
    if last.outcome is not LaunchOutcome.UNKNOWN:
        return
    due = (last.unknown_at or last.intended_at) + timedelta(seconds=RESUME_INTERVAL_S)
    if not p.due(due):
        return
    if last.unknown_at is None:
        words = f"{_RESUMED}: no answer of its start was recorded (its supervisor stopped)"
    else:
        earlier = "" if last.detail.startswith(_RESUMED) else _words(last.detail)
        words = f"{_RESUMED}: its start came back with an unknown outcome{earlier}"
    which = f"{sub.number}/{last.attempt}:{_iso(p.now)}"
    p.commit(
        "launch-resumed",
        which,
        LaunchUnknown(
            job_id=job.job_id,
            at=p.now,
            submission=sub.number,
            attempt=last.attempt,
            detail=words,
        ),
    )
    intent = LaunchIntended(
        job_id=job.job_id, at=last.intended_at, submission=sub.number, attempt=last.attempt
    )
    p.launches.append(
        Launch(
            key=p.key("launch", f"{which}:resume"),
            intent=intent,
            name=_name(job.job_id),
            spec=_launch_spec(job),
            generation=job.generation,
            submission=sub.number,
            attempt=last.attempt,
            exclude_nodes=_lost_nodes(p),
            resume=True,
        )
    )
    p.wake(p.now + timedelta(seconds=RESUME_INTERVAL_S))  # again, should its answer be lost


def _cut_off(p: _Pass) -> frozenset[tuple[int, int]]:
    """The (N, a) of a launch whose start no answer was recorded for, on a backend whose
    start is idempotent: :func:`_resume_launches` starts it again (in this pass, or at its
    due time), so it is not escalated before that start has answered: a supervisor down for
    longer than the unresolved age, or an unresolved age shorter than
    :data:`RESUME_INTERVAL_S`, must not ask a person about a launch the backend settles. One
    whose start came back unknown is escalated as usual once the age ran out."""
    if not p.declarations.idempotent_start:
        return frozenset()
    sub = p.given.submission
    if sub is None or not sub.attempts:
        return frozenset()
    last = sub.attempts[-1]
    if (
        last.outcome is LaunchOutcome.UNKNOWN
        and last.unknown_at is None
        and not any(a.outcome is LaunchOutcome.LAUNCHED for a in sub.attempts)
    ):
        return frozenset({(sub.number, last.attempt)})
    return frozenset()


# -- 7. unknown launches ----------------------------------------------------------------------


def _unknown_launches(p: _Pass) -> None:
    """Escalate a launch whose outcome stayed unknown for the unresolved age.

    Seed 002, "all-unknown:<N> or unmatched:<N>/<a>": "A Start call's outcome stayed unknown
    for at least the job's unresolved age, 10 minutes unless WithUnresolvedAge set it, and
    no object turned up for it." ``all-unknown:<N>`` when every attempt of N is unknown
    (from the last attempt's intent); otherwise ``unmatched:<N>/<a>`` for each unknown
    attempt. Every submission is checked: an unknown launch blocks settling. A cut-off launch
    an idempotent backend's start will settle (:func:`_cut_off`) is not escalated until that
    start has answered.
    """
    age = timedelta(seconds=p.job.spec.unresolved_age_s)
    cut_off = _cut_off(p)
    for sub in p.job.unknown_submissions():
        unknown = [a for a in sub.attempts if a.outcome is LaunchOutcome.UNKNOWN]
        if not unknown or any((sub.number, a.attempt) in cut_off for a in unknown):
            continue
        if len(unknown) == len(sub.attempts):
            escalation_id = esc_id(EscalationKind.ALL_UNKNOWN, sub.number)
            due = sub.attempts[-1].intended_at + age
            if p.job.escalation(escalation_id) is None and p.due(due):
                p.escalate(
                    escalation_id,
                    f"no launch of submission {sub.number} is known to have made an object "
                    f"({len(unknown)} attempts, outcome unknown since "
                    f"{_iso(unknown[0].intended_at)}{_words(unknown[-1].detail)}); check the "
                    f"scheduler for an object named {_name(p.job.job_id)}, and if there is "
                    f"none, abandon submission {sub.number}",
                )
            continue
        for attempt in unknown:
            escalation_id = esc_id(EscalationKind.UNMATCHED, (sub.number, attempt.attempt))
            due = attempt.intended_at + age
            if p.job.escalation(escalation_id) is None and p.due(due):
                p.escalate(
                    escalation_id,
                    f"launch {sub.number}/{attempt.attempt} has an unknown outcome since "
                    f"{_iso(attempt.intended_at)}{_words(attempt.detail)}; check the "
                    f"scheduler for an object named {_name(p.job.job_id)}, and if there is "
                    f"none, abandon attempt {sub.number}/{attempt.attempt}",
                )


# -- 8. gates ---------------------------------------------------------------------------------


def _gates(p: _Pass) -> None:
    """Open the current submission's start gate when nothing else of the job is alive;
    escalate a gate someone else holds.

    Seed 000, "The node-loss fence": "A replacement may be started, but its gate isn't
    opened until the scheduler shows the old object ended." Seed 002, ``admin-held:<object
    id>``: "A launched object is held by someone other than dispatch ... dispatch never opens
    it."
    """
    job = p.job
    if job.outcome is not None:
        return
    for obs in p.own.values():
        record = job.object(obs.ref)
        if (
            obs.alive
            and obs.gate is GateState.ADMIN_HELD
            and (record is None or record.stop_requested_at is None)
        ):
            words = "" if obs.cause is None else _words(obs.cause.detail)
            p.escalate(
                esc_id(EscalationKind.ADMIN_HELD, obs.ref.id),
                f"object {obs.ref} of submission {obs.submission} is held by someone other "
                f"than dispatch{words}; dispatch never opens that gate: ask whoever holds it, "
                "or cancel the job",
            )
    primary = p.primary()
    if primary is None or job.hold is not None or primary.gate_opened_at is not None:
        return
    seen = p.own.get(primary.ref)
    if (
        seen is None
        or not seen.alive
        or seen.gate is not GateState.CLOSED
        or primary.stop_requested_at is not None
        or seen.restarts in primary.ended
    ):
        return
    if any(other.alive for ref, other in p.own.items() if ref != primary.ref):
        return
    if _unconfirmed_others(p, primary.ref):
        return
    p.gates.append(OpenGate(key=p.key("open-gate", primary.ref), ref=primary.ref))


def _unconfirmed_others(p: _Pass, primary: ObjectRef) -> list[ObjectRef]:
    """Other objects of the job whose end the scheduler hasn't confirmed: absent from the
    discovery (neither shown nor listed vanished) while the record doesn't hold their end,
    or holds only the fence's (the scheduler never said). Gone is not ended (issue 15): such
    an object may still run, so a replacement's gate stays closed. An object on a cluster
    the discovery doesn't cover (the cluster a failover left, whose Discovery is missing)
    is unconfirmed the same way: nothing says it stopped."""
    discovery = p.discovery
    if discovery is None:
        return []
    return [
        record.ref
        for record in p.job.unconfirmed_objects()
        if record.ref != primary
        and (
            not discovery.covers(record.ref.cluster)
            or (record.ref not in p.own and record.ref not in discovery.vanished)
        )
        and (record.fenced or not record.ended)
    ]


# -- 9. foreign objects -----------------------------------------------------------------------


def _foreign(p: _Pass) -> None:
    """Escalate a foreign object once; never stop or adopt it.

    Seed 002, ``foreign:<object id>``: "The scheduler has an object named for this job whose
    submission and attempt can't be read from it ... It blocks the record from settling.
    dispatch never stops or adopts it."
    """
    abandoned = {t.foreign for t in p.job.abandoned if t.foreign is not None}
    for obs in p.foreign:
        if obs.alive and obs.ref not in abandoned:
            p.escalate(
                esc_id(EscalationKind.FOREIGN, obs.ref.id),
                f"object {obs.ref} is named for this job ({obs.name}) but its submission and "
                "attempt can't be read from it; dispatch never stops or adopts it: find out "
                "what it is, stop it yourself if it shouldn't run, then abandon it",
            )


# -- 10. stops ---------------------------------------------------------------------------------


def _stops(p: _Pass) -> None:
    """Stop what must not run; ask again while it lives; emergency stops.

    Seed 002, ``cleanup-deadline``: a job with an outcome stops its live objects ("a
    cancelled job still stopping"); every live object of the job other than the current
    submission's is a duplicate and is stopped (seed 000, "The node-loss fence": a
    replacement runs only once the old object ended). A stop already asked is asked again
    every ``STOP_INTERVAL_S`` while the object lives. An emergency stop request kills every
    live object once (``cluster.Stopper().EmergencyStop``), where the backend declares it.
    """
    job = p.job
    primary = p.primary()
    if job.outcome is None:
        why = StopWhy.DUPLICATE
    else:
        why = StopWhy.CANCEL if job.outcome is State.CANCELLED else StopWhy.OUTCOME
    emergency = job.emergency_stop_at if p.declarations.emergency_stop else None
    for obs in p.own.values():
        if not obs.alive:
            continue
        record = job.object(obs.ref)
        asked = None if record is None else record.stop_requested_at
        again_why = why if record is None or not record.stop_why else StopWhy(record.stop_why)
        if emergency is not None and (
            record is None
            or record.emergency_stop_at is None
            or record.emergency_stop_at < emergency
        ):
            p.stop(obs.ref, again_why, emergency=True)
        elif asked is None:
            if job.outcome is not None or primary is None or primary.ref != obs.ref:
                p.stop(obs.ref, why, submission=obs.submission, attempt=obs.attempt)
        elif p.now >= asked + timedelta(seconds=STOP_INTERVAL_S):
            p.stop(obs.ref, again_why)
        else:
            p.wake(asked + timedelta(seconds=STOP_INTERVAL_S))


# -- 10b. stops that don't end -----------------------------------------------------------------


def _stop_overdue(p: _Pass) -> None:
    """Escalate, once per object, a stop the scheduler hasn't carried out by the deadline.

    Issue 15, item 5 ("a fence that never completes waits silently"): an object dispatch
    asked to stop (fence, duplicate, outcome, cancel, recovery) that the scheduler still
    doesn't show ended ``spec.stop_overdue_s`` after the first ask (pods that can't be
    force-deleted, a Slurm job stuck ``COMPLETING``) raises ``stop-overdue:<object id>``.
    Nothing else changes: the stop is still asked every ``STOP_INTERVAL_S`` and a
    replacement's gate stays closed (:func:`_gates`) until the scheduler shows the object
    ended, or has no record of it (listed vanished).
    """
    deadline = timedelta(seconds=p.job.spec.stop_overdue_s)
    # An unconfirmed stop is of an object shown, or one whose end isn't confirmed.
    candidates = [*p.own, *(o.ref for o in p.job.unconfirmed_objects())]
    for record in p.job.objects_among(candidates):
        first = record.first_stop_requested_at
        if first is None or not _stop_unconfirmed(p, record):
            continue
        escalation_id = esc_id(EscalationKind.STOP_OVERDUE, record.ref.id)
        if p.job.escalation(escalation_id) is not None:
            continue
        due = first + deadline
        if not p.due(due):
            continue
        obs = p.own.get(record.ref)
        shown = (
            "the scheduler doesn't show it any more and has said nothing of its end"
            if obs is None
            else f"the scheduler still shows it {obs.phase}"
        )
        p.escalate(
            escalation_id,
            f"object {record.ref} (submission {record.submission}) was asked to stop "
            f"({record.stop_why}) at {_iso(first)}, and {p.job.spec.stop_overdue_s:.0f} s on "
            f"{shown}; dispatch keeps asking every {STOP_INTERVAL_S:.0f} s and keeps any "
            "replacement's gate closed until it ends: stop it on the scheduler yourself, or "
            "emergency-stop the job",
        )


def _stop_unconfirmed(p: _Pass, record: ObjectRecord) -> bool:
    """Whether a stopped object's end is not confirmed by the scheduler: shown alive; or
    absent from the discovery (not listed vanished) with no end recorded, or only the
    fence's. With no discovery nothing is known, so nothing is escalated."""
    discovery = p.discovery
    if discovery is None or not discovery.covers(record.ref.cluster):
        return False
    obs = p.own.get(record.ref)
    if obs is not None:
        return obs.alive
    if record.ref in discovery.vanished:
        return False
    return record.fenced or not record.ended


# -- 11. clean-up -----------------------------------------------------------------------------


def _cleanup(p: _Pass) -> None:
    """Escalate a job that has not settled by its clean-up deadline, once.

    Seed 002, ``cleanup-deadline``: "The job has an outcome, and its record still hasn't
    settled more than the job's clean-up deadline after the cancel, or after the outcome if
    nobody cancelled. The deadline is 30 minutes unless WithCleanupDeadline set it. The
    detail names the objects still alive. ... This escalation is committed once per job."
    """
    job = p.job
    if job.outcome is None or job.outcome_at is None or p.settled():
        return
    if job.escalation(esc_id(EscalationKind.CLEANUP_DEADLINE)) is not None:
        return
    start = job.cancel_requested_at or job.outcome_at
    due = start + timedelta(seconds=job.spec.cleanup_deadline_s)
    if not p.due(due):
        return
    alive = [str(o.ref) for o in p.own.values() if o.alive]
    unconfirmed = _unshown_unended(p)
    unknown = [
        f"{a.submission}/{a.attempt}"
        for s in job.unknown_submissions()
        for a in s.attempts
        if a.outcome is LaunchOutcome.UNKNOWN
    ]
    abandoned = {t.foreign for t in job.abandoned if t.foreign is not None}
    foreign = [str(o.ref) for o in p.foreign if o.alive and o.ref not in abandoned]
    parts = [
        f"{what}: {', '.join(items)}"
        for what, items in (
            ("objects still alive", alive),
            ("objects the scheduler no longer shows, their end not known", unconfirmed),
            ("launches with an unknown outcome", unknown),
            ("foreign objects", foreign),
        )
        if items
    ]
    if p.discovery is None:
        parts.append("the scheduler's view of the job is not known yet")
    p.escalate(
        esc_id(EscalationKind.CLEANUP_DEADLINE),
        f"the job's outcome is {job.outcome} since {_iso(job.outcome_at)} but it has not "
        f"settled {job.spec.cleanup_deadline_s:.0f} s after {_iso(start)}: " + "; ".join(parts),
    )


def _unshown_unended(p: _Pass) -> list[str]:
    """Objects the record holds, not ended, that the discovery neither shows nor lists as
    vanished: gone is not ended (issue 15), so they keep the job from settling."""
    discovery = p.discovery
    if discovery is None:
        return []
    return [
        str(r.ref)
        for r in p.job.unconfirmed_objects()
        if not r.ended
        and discovery.covers(r.ref.cluster)
        and r.ref not in p.own
        and r.ref not in discovery.vanished
    ]


# -- 12. delivery -----------------------------------------------------------------------------


def _deliver(p: _Pass) -> tuple[AnyStep, ...]:
    """Deliver what the record held undelivered when the pass began.

    Seed 002, "Receive and answer escalations": "After each pass's steps, the supervisor
    calls your Deliver function for each escalation the record held, undelivered, when the
    pass began ... An escalation the pass itself committed is delivered after the next
    pass."
    """
    job = p.given
    pending = tuple(e for e in job.escalations if e.delivered is None)
    if not pending:
        return ()
    return (Deliver(key=p.key("deliver", job.seq), escalations=pending),)


# -- helpers ----------------------------------------------------------------------------------


def _attempt(job: Job, submission: int, attempt: int) -> Attempt | None:
    if not 1 <= submission <= len(job.submissions):
        return None
    attempts = job.submissions[submission - 1].attempts
    if not 1 <= attempt <= len(attempts):
        return None
    return attempts[attempt - 1]


def _name(job_id: str) -> str:
    """The scheduler name of the job's objects (seed 002: "an object named dj-<job id>")."""
    return f"dj-{job_id}"


def _iso(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat()


def _words(detail: str) -> str:
    return f": {detail}" if detail else ""

"""The stateful test of the pure core (issue 2, "Tests that must exist", 2nd bullet; STYLE.md,
"Test pyramid"): a ``RuleBasedStateMachine`` drives a simulated scheduler
(:mod:`tests.unit.core.sim_scheduler`), the planner and operators through random sequences,
and checks the core's promises after every step.

The machine holds one job's record, folded incrementally the way a supervisor replica does
(``fold(new, now, prior=cached)``, docs/runtime.md "One pass"), the scheduler's truth (the
sim), and the latest Discovery the observer published (which may be older than the record
when a pass uses it). Its rules, each a feature hypothesis's swarm testing may turn off for
a walk (so walks free of each kind of trouble happen too):

* time: ``tick(dt)`` (seconds to minutes) and ``clock_jump(dt)`` (half an hour to a day:
  every deadline passes at once); ``observe()``: the observer publishes;
* the supervisor: ``follow_plan()`` (a pass on what the scheduler shows now: decisions
  committed, actions carried out on the sim, facts committed), ``poll(dt)``,
  ``wake_and_follow_plan()`` (sleep until ``wake_at``), ``follow_plan_on_old_view()`` (a
  stale Discovery, or none), ``follow_plan_with_launch_trouble(answer)`` (a launch refused,
  timed out having made an object or not, or made twice), ``crash_during_pass(where)``
  (after the decisions, or after the actions);
* the scheduler: ``scheduler_ends(how)`` (preemption, time limit, OOM, exit 1, success,
  node failure, an administrator's cancel, an unmappable end, no cause),
  ``scheduler_requeues`` (native requeue), ``node_lost``, ``node_declared_down`` (the
  scheduler ends an object on a lost node, inside the window or past it), ``foreign_object``,
  ``admin_gate`` (admin holds and releases), ``scheduler_state`` (an unmappable state),
  ``late_objects_show``, ``scheduler_forgets`` (ended objects purged, a live one lost);
* operators, through ``decide`` (a refusal is fine): ``operator_answers`` (hold, release,
  resubmit, give-up, abandon by a human who checked the scheduler, or by a service) and
  ``operator_ends_job`` (cancel, emergency stop, supersede).

The invariants, checked after every step, are the methods marked ``@invariant``; each pass
is also checked on its own (:meth:`DispatchMachine._check_pass`), and every walk that broke
nothing ends with :meth:`DispatchMachine.drain` (the job settles once people answer and
nothing new happens). The shrunk failures found while writing the machine, and walks that
show what it checks, are the example tests at the end.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from msgspec.structs import replace

from dispatch_core import (
    Abandon,
    AbandonTarget,
    Action,
    Actor,
    ActorKind,
    AskCessation,
    Cancel,
    Cause,
    CauseKind,
    CessationObserved,
    Commit,
    Declarations,
    Deliver,
    Discovery,
    EmergencyStop,
    EscalationCommitted,
    EscalationDelivered,
    GateOpened,
    GateState,
    GiveUp,
    HoldCommand,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    Launch,
    LaunchOutcome,
    ObjectPhase,
    ObjectRef,
    OpenGate,
    OperatorCommand,
    OutcomeCommitted,
    Pass,
    RecoveryPolicy,
    RecoveryRule,
    Refused,
    Release,
    Resubmit,
    State,
    Stop,
    Submit,
    Supersede,
    decide,
    epoch,
    fold,
    next_steps,
    project,
    settled,
)
from tests.unit.core.helpers import ALICE, CLUSTER, T0, Record, Sim, decisions, facts
from tests.unit.core.sim_scheduler import ENDINGS, LaunchAnswer, SimObject, SimScheduler
from tests.unit.core.strategies import submits
from tests.util import written

JOB: Final = "job-1"
NEW_JOB: Final = "job-2"
OPS_BOT: Final = Actor(name="ops-bot", kind=ActorKind.SERVICE)
"""A service actor: it may hold, cancel and so on, but never abandon (seed 002)."""


@st.composite
def _submits(draw: st.DrawFn) -> Submit:
    """A job as an operator submits it (strategies.submits: a legal policy, shared checkpoint
    or not, 1-3 launch attempts, either unknown-launch policy, native actions, cessation
    signal, emergency stop), with a node-loss window of 1 or 5 minutes, and mostly a resubmit
    rule for preemption and node loss, so that walks recover and reach later submissions."""
    submit = draw(submits(job_id=JOB))
    rules = list(submit.policy.rules)
    covered = {kind for r in rules for kind in r.on}
    extra = tuple(k for k in (CauseKind.PREEMPTED, CauseKind.NODE_LOST) if k not in covered)
    add: bool = draw(st.sampled_from([True, True, True, False]))
    if extra and add:
        budget = draw(st.integers(min_value=1, max_value=3))
        rules.append(RecoveryRule(on=extra, action=Action.RESUBMIT, budget=budget))
    declarations = Declarations(
        node_loss_window_s=draw(st.sampled_from([60.0, 300.0])),
        native_actions=submit.declarations.native_actions,
        cessation_signal=submit.declarations.cessation_signal,
        emergency_stop=submit.declarations.emergency_stop,
        idempotent_start=submit.declarations.idempotent_start,
    )
    return Submit(
        by=submit.by,
        job_id=JOB,
        spec=submit.spec,
        policy=RecoveryPolicy(rules=tuple(rules)),
        declarations=declarations,
    )


def _pick(objects: Sequence[SimObject], pick: int) -> SimObject | None:
    """The ``pick``-th object from the newest (0: the newest, the one most likely to be the
    current submission's), or ``None``."""
    if not objects:
        return None
    return objects[-1 - pick % len(objects)]


class DispatchMachine(RuleBasedStateMachine):
    """One job, a simulated scheduler, a supervisor and operators (see the module docstring)."""

    record: Record
    job: Job
    declarations: Declarations
    sched: SimScheduler
    now: datetime
    seen: Discovery | None
    native_requeue: bool
    outcome: tuple[State, object, datetime | None] | None
    recovered: bool
    wake_at: datetime | None
    runs: dict[tuple[ObjectRef, int], int]

    # -- set-up -----------------------------------------------------------------------------

    @initialize(
        submit=_submits(),
        native_requeue=st.booleans(),
        linger_s=st.sampled_from([300.0, 3600.0, 300.0, 60.0]),
        outlive_s=st.sampled_from([24.0, 29.0, 140.0]),
        kill_wait_s=st.sampled_from([30.0, 120.0, 0.0]),
        lost_node_kill_wait_s=st.sampled_from([300.0, 30.0]),
    )
    def create(
        self,
        submit: Submit,
        native_requeue: bool,
        linger_s: float,
        outlive_s: float,
        kill_wait_s: float,
        lost_node_kill_wait_s: float,
    ) -> None:
        """Submit the job through ``decide``; start the scheduler (its timings are
        :class:`SimScheduler`'s arguments)."""
        self.now = T0
        (created,) = decide(None, submit, T0)
        assert isinstance(created, JobCreated)
        self.record = Record(created)
        self.job = fold(written(self.record.events), T0)
        self.declarations = submit.declarations
        self.sched = SimScheduler(
            CLUSTER,
            JOB,
            T0,
            linger_s=linger_s,
            outlive_s=outlive_s,
            kill_wait_s=kill_wait_s,
            lost_node_kill_wait_s=lost_node_kill_wait_s,
            idempotent=submit.declarations.idempotent_start,
        )
        self.seen = None
        self.native_requeue = native_requeue
        self.outcome = None
        self.recovered = False
        self.wake_at = None
        self.runs = {}

    # -- the record -------------------------------------------------------------------------

    def _append(self, events: Sequence[JobEvent]) -> None:
        """Append events to the record and fold only them into the cached job, as a
        supervisor replica does (``fold(new, now, prior=cached)``).

        Each escalation id is committed once (seed 002: "Each escalation is committed once,
        keyed by its ID"): checked here, before the record could hold a second one.
        """
        ids = [e.id for e in events if isinstance(e, EscalationCommitted)]
        assert len(ids) == len(set(ids)), f"one batch commits an escalation twice: {ids}"
        for escalation_id in ids:
            assert self.job.escalation(escalation_id) is None, (
                f"escalation {escalation_id!r} committed a second time"
            )
        start = len(self.record.events)
        self.record.append(events)
        self.job = fold(written(self.record.events[start:]), self.now, prior=self.job)

    # -- the clock and the observer ---------------------------------------------------------

    @rule(dt=st.sampled_from([1, 30, 61, 130, 301, 601]))
    def tick(self, dt: int) -> None:
        """Time passes."""
        self._advance(self.now + timedelta(seconds=dt))

    @rule(dt=st.sampled_from([1801, 3601, 86401]))
    def clock_jump(self, dt: int) -> None:
        """The clock jumps (a supervisor paused for half an hour, an hour, a day): every
        deadline passes at once, and whatever the scheduler did meanwhile is only seen
        after (ended objects may have vanished)."""
        self._advance(self.now + timedelta(seconds=dt))

    def _advance(self, now: datetime) -> None:
        self.now = now
        self.sched.advance(now)

    @rule()
    def observe(self) -> None:
        """The observer publishes what the scheduler shows now."""
        self.seen = self.sched.discover()

    # -- the supervisor ---------------------------------------------------------------------
    #
    # Several rules carry a pass out, each with its own trouble, so that hypothesis's swarm
    # testing (which turns rules off per walk) keeps passes in nearly every walk and yet
    # has walks free of each kind of trouble.

    @rule(delivered=st.booleans())
    def follow_plan(self, delivered: bool) -> None:
        """One supervisor pass on what the scheduler shows now; every launch is recorded."""
        self._pass("fresh", LaunchAnswer.RECORDED, delivered, "none")

    @rule(dt=st.sampled_from([1, 30, 61]))
    def poll(self, dt: int) -> None:
        """The supervisor's usual loop: a little time passes, the observer publishes, and a
        pass runs on what it shows."""
        self.tick(dt)
        self._pass("fresh", LaunchAnswer.RECORDED, True, "none")

    @rule(delivered=st.booleans())
    def wake_and_follow_plan(self, delivered: bool) -> None:
        """The supervisor sleeps until the last pass's ``wake_at`` (a 30 s poll when it had
        none, or it is past), then passes."""
        wake = self.wake_at
        if wake is None or wake <= self.now:
            wake = self.now + timedelta(seconds=30)
        self._advance(wake)
        self._pass("fresh", LaunchAnswer.RECORDED, delivered, "none")

    @rule(view=st.sampled_from(["stale", "none"]), delivered=st.booleans())
    def follow_plan_on_old_view(self, view: str, delivered: bool) -> None:
        """A pass on the latest Discovery the observer published, perhaps older than the
        record's newest launch (the observer republishes only on change), or on none (the
        scheduler unreachable, or nothing seen yet)."""
        self._pass(view, LaunchAnswer.RECORDED, delivered, "none")

    @rule(answer=st.sampled_from([a for a in LaunchAnswer if a is not LaunchAnswer.RECORDED]))
    def follow_plan_with_launch_trouble(self, answer: LaunchAnswer) -> None:
        """A pass whose launch the scheduler refuses, or whose call times out having made an
        object (shown at once, or only later) or not (seed 002, "all-unknown:<N> or
        unmatched:<N>/<a>", "refused:<N>"), or makes two objects for one launch."""
        self._pass("fresh", answer, False, "none")

    @rule(
        where=st.sampled_from(["after-decisions", "before-facts"]),
        answer=st.sampled_from(LaunchAnswer),
    )
    def crash_during_pass(self, where: str, answer: LaunchAnswer) -> None:
        """The supervisor crashes during a pass: after its decisions (no action carried out:
        a launch intended and never called, a stop never asked), or after its actions (no
        fact committed: an object made, a gate opened, and the record doesn't know)."""
        self._pass("fresh", answer, True, where)

    def _pass(self, view: str, answer: LaunchAnswer, delivered: bool, crash: str) -> None:
        """One supervisor pass (docs/runtime.md, "One pass"): plan, commit the decisions,
        carry out the actions, commit their facts (helpers.decisions gives the decisions)."""
        if view == "fresh":
            self.observe()
        discovery = None if view == "none" else self.seen
        the_pass = next_steps(self.job, discovery, self.declarations, self.now)
        self.wake_at = the_pass.wake_at
        had_outcome = self.job.outcome
        self._append(decisions(the_pass))
        self._check_pass(the_pass, discovery, had_outcome=had_outcome is not None)
        if crash == "after-decisions":
            return
        found = self._carry_out(the_pass, answer, delivered)
        if crash != "before-facts":
            self._append(found)

    def _check_pass(
        self, the_pass: Pass, discovery: Discovery | None, *, had_outcome: bool
    ) -> None:
        """What one pass promises, checked once its decisions are in the record
        (docs/core-semantics.md, "The planner"):

        * ``Pass.settled`` is ``settled`` of the job with the pass's commits applied;
        * a job with an outcome gets no second one (seed 000: outcomes never change);
        * nothing is launched and no gate opens while the job has an outcome or a hold in
          force (seed 002: a hold keeps the job from running), except that a launch whose
          answer was lost is started again on an idempotent backend (its gate stays closed;
          issue 15, "Launches survive the launcher");
        * the pass is idempotent: with its decisions and the facts of its gates and
          cessation asks ("not yet") committed, planning again on the same view at the same
          time gives nothing but ``Deliver``;
        * ``wake_at`` is the next deadline: planning on that record and view just before it
          (or a month on, when it is ``None``) gives nothing but ``Deliver`` either, so a
          supervisor that sleeps until ``wake_at`` misses nothing.
        """
        job = self.job
        assert the_pass.settled == settled(job, discovery), the_pass
        if had_outcome:
            assert not any(
                isinstance(s, Commit) and isinstance(s.event, OutcomeCommitted)
                for s in the_pass.steps
            ), "a pass commits a second outcome"
        if job.outcome is not None or job.hold is not None:
            assert not any(
                isinstance(s, OpenGate) or (isinstance(s, Launch) and not s.resume)
                for s in the_pass.steps
            ), the_pass
        if not self.declarations.idempotent_start:
            assert not any(isinstance(s, Launch) and s.resume for s in the_pass.steps)
        quiet_facts = facts(the_pass, self.now)
        quiet = fold(
            written(((job.seq + 1 + i, ev) for i, ev in enumerate(quiet_facts))),
            self.now,
            prior=job,
        )
        again = next_steps(quiet, discovery, self.declarations, self.now)
        assert all(isinstance(s, Deliver) for s in again.steps), ("not idempotent", again)
        wake = the_pass.wake_at
        before = self.now + timedelta(days=30) if wake is None else wake - timedelta(seconds=1)
        if before > self.now:
            later = next_steps(quiet, discovery, self.declarations, before)
            assert all(isinstance(s, Deliver) for s in later.steps), (
                f"wake_at {wake} but a pass at {before} does more",
                later,
            )

    def _carry_out(self, the_pass: Pass, answer: LaunchAnswer, delivered: bool) -> list[JobEvent]:
        """Carry out a pass's actions on the sim, in order; return their facts.

        (helpers.facts gives every gate or cessation ask the same answer; here each one is
        what the sim's truth says: a gate can't open on an object that ended or that an
        administrator holds since the snapshot, and the cessation signal says whether the
        object's processes are really gone.)
        """
        out: list[JobEvent] = []
        for step in the_pass.steps:
            match step:
                case Stop():
                    self.sched.stop(step.ref, emergency=step.intent.emergency)
                case OpenGate():
                    if self.sched.open_gate(step.ref):
                        out.append(GateOpened(job_id=JOB, at=self.now, ref=step.ref))
                case Launch():
                    out.append(self.sched.launch(step, answer))
                case AskCessation():
                    ceased = self.sched.ceased(step.ref)
                    out.append(
                        CessationObserved(job_id=JOB, at=self.now, ref=step.ref, ceased=ceased)
                    )
                case Deliver():
                    if delivered:
                        out.extend(
                            EscalationDelivered(job_id=JOB, at=self.now, id=e.id)
                            for e in step.escalations
                        )
                case _:
                    pass
        return out

    # -- the scheduler, by itself (``pick`` chooses the object, newest first) ---------------

    @rule(
        how=st.sampled_from(["preempted", "preempted", *ENDINGS, "no-cause"]),
        pick=st.integers(min_value=0, max_value=3),
    )
    def scheduler_ends(self, how: str, pick: int) -> None:
        """An object ends: preempted, time limit, OOM, exit 1, success, node failure, a
        cancel by an administrator, a state the adapter can't map, or no cause at all
        (preemption, the
        commonest on a busy cluster, thrice as often). Mostly a running object (the
        interesting case), else any live one."""
        running = [o for o in self.sched.own() if o.phase is ObjectPhase.RUNNING]
        obj = _pick(running, pick) or _pick(self.sched.own(), pick)
        if obj is not None:
            self.sched.end(obj.ref, None if how == "no-cause" else _at(ENDINGS[how], self.now))

    @rule(
        how=st.sampled_from(["preempted", "node-fail", "time-limit"]),
        pick=st.integers(min_value=0, max_value=3),
    )
    def scheduler_requeues(self, how: str, pick: int) -> None:
        """A native requeue, where the sim's scheduler does them: the running object's
        execution ends and the object lives on (restarts + 1, an ``executions`` entry)."""
        running = [o for o in self.sched.own() if o.phase is ObjectPhase.RUNNING]
        obj = _pick(running, pick)
        if obj is not None and self.native_requeue:
            self.sched.requeue(obj.ref, _at(ENDINGS[how], self.now))

    @rule(pick=st.integers(min_value=0, max_value=3))
    def node_lost(self, pick: int) -> None:
        """A node under a running object is lost: the object keeps running with cause
        node-lost (seed 000, "The node-loss fence"), until the scheduler ends it
        (``scheduler_ends(node-fail)``) or dispatch stops it."""
        running = [o for o in self.sched.own() if o.phase is ObjectPhase.RUNNING]
        obj = _pick([o for o in running if o.cause is None], pick)
        if obj is not None:
            self.sched.lose_node(obj.ref)

    @rule(pick=st.integers(min_value=0, max_value=3))
    def node_declared_down(self, pick: int) -> None:
        """The scheduler itself ends an object whose node it lost (Slurm's ``NODE_FAIL`` once
        ``SlurmdTimeout`` passes): inside the node-loss window, this end is the scheduler's
        word and the node-lost rule applies to it; past the window, the fence already
        ended the execution and this end changes nothing."""
        lost = [
            o
            for o in self.sched.own()
            if o.cause is not None and o.cause.kind is CauseKind.NODE_LOST
        ]
        obj = _pick(lost, pick)
        if obj is not None:
            self.sched.end(obj.ref, _at(ENDINGS["node-fail"], self.now))

    @rule(appears=st.booleans(), pick=st.integers(min_value=0, max_value=3))
    def foreign_object(self, appears: bool, pick: int) -> None:
        """An object named for the job whose submission and attempt can't be read appears
        (a site plugin rewrote it), or one ends (someone stopped it by hand)."""
        if appears:
            self.sched.make(f"dj-{JOB}-rewritten-by-site-plugin", None, None)
            return
        obj = _pick(self.sched.foreign(), pick)
        if obj is not None:
            self.sched.end(obj.ref, _at(ENDINGS["admin-cancel"], self.now))

    @rule(hold=st.booleans(), pick=st.integers(min_value=0, max_value=3))
    def admin_gate(self, hold: bool, pick: int) -> None:
        """An administrator holds a pending object (Slurm ``JobHeldAdmin``): one whose gate
        dispatch hasn't opened, or one requeued; or releases one."""
        if hold:
            pending = [o for o in self.sched.own() if o.phase is ObjectPhase.PENDING]
            obj = _pick([o for o in pending if o.gate is not GateState.ADMIN_HELD], pick)
            if obj is not None:
                self.sched.admin_hold(obj.ref)
        else:
            obj = _pick([o for o in self.sched.own() if o.gate is GateState.ADMIN_HELD], pick)
            if obj is not None:
                self.sched.admin_release(obj.ref)

    @rule(unmappable=st.booleans(), pick=st.integers(min_value=0, max_value=3))
    def scheduler_state(self, unmappable: bool, pick: int) -> None:
        """A live object shows a state the adapter can't map (phase ``unknown``), or one
        that showed such a state maps again."""
        if unmappable:
            obj = _pick([o for o in self.sched.own() if o.phase is not ObjectPhase.UNKNOWN], pick)
            if obj is not None:
                self.sched.state_unmappable(obj.ref)
        else:
            obj = _pick([o for o in self.sched.own() if o.phase is ObjectPhase.UNKNOWN], pick)
            if obj is not None:
                self.sched.state_mappable(obj.ref)

    @rule()
    def late_objects_show(self) -> None:
        """Objects made by launches that timed out are shown at last."""
        self.sched.reveal()

    @rule(live=st.sampled_from([False, False, False, True]), pick=st.integers(0, 3))
    def scheduler_forgets(self, live: bool, pick: int) -> None:
        """The scheduler stops showing an ended object early (purged), or, rarely, loses a
        live one (its state lost): either is *gone* to dispatch."""
        if live:
            obj = _pick([o for o in self.sched.own() if o.seen], pick)
        else:
            obj = _pick([o for o in self.sched.objects.values() if not o.alive and o.seen], pick)
        if obj is not None:
            self.sched.vanish(obj.ref)

    # -- operators --------------------------------------------------------------------------

    @rule(
        which=st.sampled_from(
            [
                "hold",
                "release",
                "resubmit",
                "give-up",
                "abandon-submission",
                "abandon-attempt",
                "abandon-submission",
                "abandon-foreign",
            ]
        ),
        human=st.sampled_from([True, True, True, False]),
        pick=st.integers(min_value=0, max_value=3),
        for_s=st.sampled_from([3600.0, 60.0]),
    )
    def operator_answers(self, which: str, human: bool, pick: int, for_s: float) -> None:
        """An operator holds or releases the job, or answers an escalation: resubmit or give
        up a recovery hold, abandon an unknown launch or a foreign object (seed 002)."""
        self._command(which, human, pick, for_s)

    @precondition(lambda self: bool(self.job.submissions))
    @rule(
        which=st.sampled_from(["cancel", "emergency-stop", "supersede"]),
        human=st.sampled_from([True, True, True, False]),
        dice=st.integers(min_value=0, max_value=3),
    )
    def operator_ends_job(self, which: str, human: bool, dice: int) -> None:
        """An operator cancels the job, stops it in an emergency, or supersedes it: once the
        job has opened a submission, and only on one call in four (``dice == 0``), so that
        walks live long enough to recover (test_decide.py cancels jobs that never ran)."""
        if dice == 0:
            self._command(which, human, 0, 3600.0)

    def _command(self, which: str, human: bool, pick: int, for_s: float) -> None:
        """An operator command through ``decide``; a refusal is fine (seed 002 says which
        commands a state allows; test_decide.py checks each refusal).

        A human abandons a launch only after checking the scheduler for its object and
        finding none, as seed 002 tells them to ("Check the scheduler for an object named
        dj-<job id>. If there's none, close it"); a service actor's abandon is refused.
        """
        by = ALICE if human else OPS_BOT
        job = self.job
        command: OperatorCommand
        match which:
            case "cancel":
                command = Cancel(by=by, reason="not needed any more")
            case "hold":
                command = HoldCommand(by=by, reason="maintenance", for_s=for_s)
            case "release":
                command = Release(by=by, reason="maintenance done")
            case "resubmit":
                command = Resubmit(by=by, reason="fixed the data path")
            case "give-up":
                command = GiveUp(by=by, reason="not worth it")
            case "emergency-stop":
                command = EmergencyStop(by=by, reason="runaway job")
            case "supersede":
                command = Supersede(by=by, reason="fixed the data path", new_job_id=NEW_JOB)
            case "abandon-submission" | "abandon-attempt" | "abandon-foreign":
                target = self._abandon_target(which, pick)
                if target is None:
                    return
                command = Abandon(by=by, reason="no such job in squeue", target=target)
            case _:
                raise AssertionError(which)
        try:
            events = decide(job, command, self.now)
        except Refused:
            return
        if isinstance(command, Supersede):
            new, *rest = events
            assert isinstance(new, JobCreated)
            assert (new.job_id, new.supersedes, new.generation) == (
                NEW_JOB,
                JOB,
                job.generation + 1,
            )
            fold(written([(1, new)]), self.now)  # the new job's record begins well
            events = tuple(rest)
        self._append(events)

    def _abandon_target(self, which: str, pick: int) -> AbandonTarget | None:
        """What a person abandons: a submission or an attempt whose object the scheduler
        doesn't show (the person checked), or a foreign object; ``None`` when the person
        finds an object for it, or there is nothing to name."""
        shown = [o for o in self.sched.objects.values() if o.visible]
        if which == "abandon-foreign":
            obj = _pick([o for o in shown if o.foreign], pick)
            return None if obj is None else AbandonTarget(foreign=obj.ref)
        subs = [s for s in self.job.submissions if s.attempts]
        if not subs:
            return None
        sub = subs[-1 - pick % len(subs)]
        if which == "abandon-submission":
            if any(o.submission == sub.number for o in shown):
                return None
            return AbandonTarget(submission=sub.number)
        att = sub.attempts[-1 - pick % len(sub.attempts)]
        if any(o.submission == sub.number and o.attempt == att.attempt for o in shown):
            return None
        return AbandonTarget(submission=sub.number, attempt=att.attempt)

    # -- the end of a walk ------------------------------------------------------------------

    def teardown(self) -> None:
        """After a walk that broke nothing, :meth:`drain` it."""
        if sys.exc_info()[0] is None and hasattr(self, "job"):
            self.drain()

    def drain(self) -> None:
        """The other half of "settled only when nothing can act": once nothing new happens
        and people answer what dispatch asks of them, the job settles (seed 002).

        The operator cancels the job if it has no outcome; objects of timed-out launches
        show up; an administrator releases a gate they hold; a person stops each foreign
        object by hand and abandons it ("stop it on the scheduler yourself ... then dispose
        of it in the record"), and abandons each unknown launch whose object the scheduler
        doesn't show. The supervisor then passes every minute on what the scheduler shows;
        within 20 minutes the job must have settled. The invariants hold at every step.
        """
        self._command("cancel", True, 0, 3600.0)
        for _ in range(20):
            self.sched.reveal()
            for obj in self.sched.own():
                if obj.gate is GateState.ADMIN_HELD:
                    self.sched.admin_release(obj.ref)
            for obj in self.sched.foreign():
                self.sched.end(obj.ref, _at(ENDINGS["admin-cancel"], self.now))
            shown = [o for o in self.sched.objects.values() if o.visible]
            for obj in shown:
                if obj.foreign and self.job.escalation(f"foreign:{obj.ref.id}") is not None:
                    self._try(
                        Abandon(
                            by=ALICE,
                            reason="stopped by hand",
                            target=AbandonTarget(foreign=obj.ref),
                        )
                    )
            for sub in self.job.submissions:
                for att in sub.attempts:
                    if att.outcome is LaunchOutcome.UNKNOWN and not any(
                        (o.submission, o.attempt) == (sub.number, att.attempt) for o in shown
                    ):
                        target = AbandonTarget(submission=sub.number, attempt=att.attempt)
                        self._try(Abandon(by=ALICE, reason="no such job in squeue", target=target))
            self._advance(self.now + timedelta(seconds=61))
            self._pass("fresh", LaunchAnswer.RECORDED, True, "none")
            self.check_all()
            if settled(self.job, self.seen):
                return
        raise AssertionError(
            f"the job has not settled 20 minutes after everything of it was asked to end: "
            f"{project(self.job, self.seen, self.now)}, scheduler shows {self.seen}"
        )

    def _try(self, command: OperatorCommand) -> None:
        """Decide a command a person gives as the walk ends; a refusal is fine."""
        with contextlib.suppress(Refused):
            self._append(decide(self.job, command, self.now))

    def check_all(self) -> None:
        """Check every invariant (the drain runs outside hypothesis's steps)."""
        self.replay_equals_live()
        self.each_escalation_id_committed_once()
        self.no_rule_budget_exceeded()
        self.committed_outcome_never_changes()
        self.recovering_never_returns_to_pending()
        self.never_two_live_launches()
        self.epochs_only_increase()
        self.status_says_what_the_record_and_scheduler_do()
        self.settled_only_when_nothing_can_act()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def replay_equals_live(self) -> None:
        """Folding the whole record from scratch gives the job the supervisor holds, folded
        pass by pass with ``prior`` (STYLE.md: "replay equals the live state";
        docs/core-semantics.md: ``fold(b, now, prior=fold(a, now)) == fold(a + b, now)``)."""
        assert fold(written(self.record.events), self.now) == self.job

    @invariant()
    def each_escalation_id_committed_once(self) -> None:
        """Seed 002, "Read escalations without a supervisor": "Each escalation is committed
        once, keyed by its ID, so you can deduplicate on it"."""
        ids = [ev.id for _, ev in self.record.events if isinstance(ev, EscalationCommitted)]
        assert len(ids) == len(set(ids)), ids

    @invariant()
    def no_rule_budget_exceeded(self) -> None:
        """Seed 000, "An object ending is not the job ending": a rule recovers while it has
        "budget left"; "a spent budget" fails the job. Native recoveries spend it too."""
        for rule_ in self.job.plan.rules:
            spent = sum(1 for r in self.job.recoveries if r.rule == rule_.rule)
            assert spent <= rule_.budget, (rule_, self.job.recoveries)

    @invariant()
    def committed_outcome_never_changes(self) -> None:
        """Seed 000: "Only a committed outcome is terminal. succeeded, failed and cancelled
        never change once committed." The record holds at most one outcome, and once the
        job has one, its state, cause and time stay as first committed."""
        job = self.job
        outcomes = [ev for _, ev in self.record.events if isinstance(ev, OutcomeCommitted)]
        assert len(outcomes) <= 1, outcomes
        now = (job.outcome, job.outcome_cause, job.outcome_at) if job.outcome else None
        if self.outcome is None:
            self.outcome = now
        else:
            assert now == self.outcome, (self.outcome, now)

    @invariant()
    def recovering_never_returns_to_pending(self) -> None:
        """Seed 000: "recovering never goes back to pending. A job whose second submission
        is waiting to start is recovering". Once the job has been taken back to run again
        (a recovery, or a submission after the first) or shown recovering, the Status
        ``project`` gives (with the observer's latest Discovery) is never pending; nor does
        the record's history go from recovering to pending.
        Also: only a committed outcome is terminal (seed 000)."""
        job = self.job
        status = project(job, self.seen, self.now)
        sub = job.submission
        if status.state is State.RECOVERING or job.recoveries or (sub and sub.number > 1):
            self.recovered = True
        if self.recovered:
            assert status.state is not State.PENDING, status
        assert status.state.terminal == (job.outcome is not None), status
        states = [t.state for t in job.history]
        if State.RECOVERING in states:
            after = states[states.index(State.RECOVERING) :]
            assert State.PENDING not in after, states

    @invariant()
    def never_two_live_launches(self) -> None:
        """Seed 000, "The node-loss fence": "A replacement may be started, but its gate
        isn't opened until the scheduler shows the old object ended." In the scheduler's
        truth, at most one live object of the job has an open gate (can run); every other
        live one (a fenced object's replacement, a late launch) waits behind a closed gate."""
        open_ = [o.ref for o in self.sched.own() if o.gate is GateState.OPEN]
        assert len(open_) <= 1, (open_, [o.shown() for o in self.sched.own()])

    @invariant()
    def epochs_only_increase(self) -> None:
        """Seed 004, "The epoch orders executions": "DISPATCH_EPOCH is a number that only
        increases across a job's executions". Every execution that runs on the scheduler
        (an object whose gate is open, at its restart count R) has an epoch ``G*10^12 +
        N*10^6 + R`` above every execution that ran before it."""
        for obj in self.sched.own():
            if obj.gate is not GateState.OPEN or obj.phase is not ObjectPhase.RUNNING:
                continue
            assert obj.submission is not None
            run = (obj.ref, obj.restarts)
            if run not in self.runs:
                value = epoch(self.job.generation, obj.submission, obj.restarts)
                assert all(value > earlier for earlier in self.runs.values()), (run, self.runs)
                self.runs[run] = value

    @invariant()
    def status_says_what_the_record_and_scheduler_do(self) -> None:
        """Seed 000, "State and cause" and "The node-loss fence": a running job carries a
        cause only when it is node-lost ("the one case where a running job carries a
        cause"); a held job has a hold in force, or its current object's gate is held by
        someone else (seed 002, ``admin-held``); and, with an outcome, the Status is that
        outcome and its cause."""
        job = self.job
        status = project(job, self.seen, self.now)
        if status.state is State.RUNNING:
            assert status.cause.kind in (CauseKind.NONE, CauseKind.NODE_LOST), status
        if status.state is State.HELD:
            admin = self.seen is not None and any(
                o.gate is GateState.ADMIN_HELD and o.alive for o in self.seen.objects
            )
            assert job.hold is not None or admin, status
        if job.outcome is not None:
            assert (status.state, status.cause) == (job.outcome, job.outcome_cause), status

    @invariant()
    def settled_only_when_nothing_can_act(self) -> None:
        """Seed 002: a record settles when nothing of the job can still act; a foreign
        object "blocks the record from settling", as does a launch whose outcome is unknown.
        When the job is settled by the latest Discovery (what the supervisor's next look
        would conclude), it has an outcome, no attempt is unknown, the Discovery shows no
        live object but abandoned foreign ones, and no object the record knows of is alive
        on the scheduler now (a Discovery older than the record's last launch must not
        settle it)."""
        job, seen = self.job, self.seen
        if not settled(job, seen):
            return
        assert job.outcome is not None
        unknown = [
            (a.submission, a.attempt)
            for s in job.submissions
            for a in s.attempts
            if a.outcome is LaunchOutcome.UNKNOWN
        ]
        assert unknown == []
        abandoned = {t.foreign for t in job.abandoned if t.foreign is not None}
        if seen is not None:
            for obj in seen.objects:
                assert not obj.alive or (obj.foreign and obj.ref in abandoned), obj
        alive = [
            r.ref
            for r in job.objects
            if r.ref in self.sched.objects and self.sched.objects[r.ref].alive
        ]
        assert alive == [], (
            f"settled by the Discovery seen at {None if seen is None else seen.seen_at}, "
            f"but the record's objects {alive} are alive on the scheduler at {self.now}"
        )


def _at(cause: Cause, now: datetime) -> Cause:
    """The scheduler's cause, with the time it happened."""
    return replace(cause, at=now)


DispatchMachine.TestCase.settings = settings(
    max_examples=800,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestDispatchMachine = pytest.mark.timeout(900)(DispatchMachine.TestCase)
"""The machine as a test: 800 walks of up to 100 steps, about 20 s on an idle 2-core machine.
Hypothesis prints the failing steps (shrunk: they paste into an example test) and the seed
to reproduce; the longer timeout leaves its shrinking (at most 5 minutes) time to finish."""


# -- regression tests: shrunk failures the machine found, and walks that show what it checks --


def _submit(*rules: RecoveryRule, window: float = 60.0) -> Submit:
    return Submit(
        by=ALICE,
        job_id=JOB,
        spec=JobSpec(cluster=CLUSTER, max_launch_attempts=1),
        policy=RecoveryPolicy(rules=rules),
        declarations=Declarations(node_loss_window_s=window),
    )


def _machine(submit: Submit, **sched: float) -> DispatchMachine:
    machine = DispatchMachine()
    timings = {"linger_s": 300.0, "outlive_s": 24.0, "kill_wait_s": 30.0}
    timings["lost_node_kill_wait_s"] = 300.0
    timings.update(sched)
    machine.create(submit=submit, native_requeue=False, **timings)
    return machine


def test_a_discovery_older_than_a_launch_does_not_settle_the_job() -> None:
    """Shrunk by the machine (fixed in 78af14b): a pass on a view taken just before it
    launches submission 1; the operator cancels; the next pass, on that same view (the
    observer republishes only on change), said the job settled, with no step and no
    ``wake_at``, while the object it launched was alive on the scheduler (pending, gate
    closed) and was never stopped.

    DESIGN.md 3: a job settles when "nothing of it can still act: no live object";
    planner rule 2: "a Discovery that predates the object proves nothing". It is not
    settled until a view shows the object ended, or the planner records it gone.
    """
    sim = Sim(spec=JobSpec(cluster=CLUSTER, max_launch_attempts=1))
    seen = sim.discovery()  # the observer's latest view, taken before the launch
    sim.step()  # submission 1 opened and launched: object 100, pending, gate closed
    assert [o.alive for o in sim.objects.values()] == [True]
    sim.command(Cancel(by=ALICE, reason="not needed any more"))

    the_pass = next_steps(sim.job, seen, sim.declarations, sim.now)

    assert not settled(sim.job, seen)
    assert not the_pass.settled
    stopped = sim.step()  # on what the scheduler shows now: the object is stopped
    assert [s.ref for s in stopped.steps if isinstance(s, Stop)] == list(sim.objects)

    # The same, as the machine shrank it:
    machine = _machine(_submit())
    machine.wake_and_follow_plan(delivered=False)
    machine.operator_ends_job(which="cancel", human=True, dice=0)
    machine.settled_only_when_nothing_can_act()


def test_a_fenced_replacement_waits_behind_its_closed_gate_until_the_old_object_ends() -> None:
    """Seed 000, "The node-loss fence", walked through the machine: inside the window the
    job runs with cause node-lost; past it the object is stopped and the node-lost rule
    launches a replacement, whose gate stays closed while the old object (on a lost node,
    slow to die) still lives, and opens once the scheduler shows it ended."""
    machine = _machine(
        _submit(RecoveryRule(on=(CauseKind.NODE_LOST,), action=Action.RESUBMIT, budget=1))
    )
    machine.poll(dt=1)  # submission 1 launched
    machine.poll(dt=1)  # its gate opened: running
    machine.node_lost(pick=0)
    machine.poll(dt=30)
    assert project(machine.job, machine.seen, machine.now).cause.kind is CauseKind.NODE_LOST
    machine.poll(dt=61)  # past the window: fenced, stopped, recovered, replacement launched
    old, new = machine.sched.own()
    assert (old.phase, new.gate) == (ObjectPhase.STOPPING, GateState.CLOSED)
    machine.poll(dt=61)
    assert new.gate is GateState.CLOSED  # the old one still lives
    machine.check_all()
    machine.tick(dt=301)  # the node is declared down: the old object ends
    machine.poll(dt=1)
    assert (old.alive, new.gate) == (False, GateState.OPEN)
    machine.check_all()
    machine.drain()

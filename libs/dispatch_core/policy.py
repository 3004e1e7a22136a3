"""Recovery policies: ``validate`` refuses an illegal one, ``make_plan`` shows how a job will be
recovered before it starts (seed 000, "Recovery rules are written against causes"; seed 004,
"When a job can't isolate"; docs/core-semantics.md, "validate, make_plan").
"""

from __future__ import annotations

import math
from typing import Final

from dispatch_core.constants import (
    CESSATION_INTERVAL_S,
    MAX_HOLD_FOR_S,
    NO_CAPACITY_WAIT_S,
    SHARED_HOLD_FOR_S,
    SUPERVISOR,
)
from dispatch_core.epoch import MAX_SUBMISSION
from dispatch_core.errors import InvalidPolicy, InvalidSpec
from dispatch_core.state import (
    COVERABLE_CAUSES,
    Action,
    CauseKind,
    Declarations,
    Enforcer,
    JobSpec,
    Plan,
    PlannedRule,
    RecoveryPolicy,
    Substitution,
    is_job_id,
)

__all__ = [
    "CESSATION_INTERVAL_S",
    "MAX_LAUNCH_ATTEMPTS",
    "SHARED_HOLD_FOR_S",
    "SUPERVISOR",
    "make_plan",
    "planned_wait_s",
    "validate",
    "validate_spec",
]

_UNCOVERABLE: Final = {
    CauseKind.NONE: "none is success",
    CauseKind.CANCELLED: "a cancel that reached the scheduler is final",
    CauseKind.HELD: "held and released are decisions, not endings",
    CauseKind.RELEASED: "held and released are decisions, not endings",
}
"""Causes no rule may cover, with the seed's reason (seed 000, "Recovery rules")."""

_FOR_UNKNOWN: Final = frozenset({Action.HOLD, Action.ESCALATE})
_RECOVERING: Final = frozenset({Action.RESUBMIT, Action.RESTART, Action.REQUEUE})
_NATIVE_ONLY: Final = frozenset({Action.RESTART, Action.REQUEUE})
_ORDER: Final = {kind: i for i, kind in enumerate(CauseKind)}


def validate(policy: RecoveryPolicy) -> None:
    """Refuse an illegal recovery policy (seed 000, "Recovery rules are written against causes").

    Rules are checked in order; within a rule, in this order: it covers no cause; its budget
    is negative; its ``hold_for_s`` is not a positive, finite number of seconds of at most
    ``MAX_HOLD_FOR_S`` (a deadline past the year 9999 can't be computed); its
    ``max_without_progress`` is set and not in 1..``MAX_SUBMISSION``; it covers
    ``none`` (success), ``cancelled`` (a cancel that reached the scheduler is final),
    ``held`` or ``released`` (decisions, not endings); it covers ``unknown`` with an action
    other than hold or escalate (resubmitting on a cause nobody understands is a guess); it
    covers a cause an earlier rule covers; it lists failover ``clusters`` and is not a
    resubmit rule (only a new submission can go elsewhere), or lists a name that is not a
    cluster token or one cluster twice (issue 14, part 2); it sets ``wait_s`` and doesn't
    cover ``no-capacity``, or sets one that is not a positive, finite number of seconds of at
    most ``MAX_HOLD_FOR_S`` (docs/core-semantics.md, "No capacity"). Nothing else is illegal
    (whether
    each listed cluster exists, takes the spec and sees its checkpoint root is the API's
    check against the clusters file).

    Args:
        policy: the policy as submitted.

    Raises:
        InvalidPolicy: naming the first offending rule (its index), the cause when one makes
            it illegal, and the reason.
    """
    covered: dict[CauseKind, int] = {}
    for i, rule in enumerate(policy.rules):
        if not rule.on:
            raise InvalidPolicy(i, None, "the rule covers no cause")
        if not 0 <= rule.budget <= MAX_SUBMISSION:
            # each recovery opens a submission, and N can't pass MAX_SUBMISSION (seed 004)
            raise InvalidPolicy(
                i, None, f"budget {rule.budget} is not in 0..{MAX_SUBMISSION} (submissions)"
            )
        if not (math.isfinite(rule.hold_for_s) and 0 < rule.hold_for_s <= MAX_HOLD_FOR_S):
            raise InvalidPolicy(
                i,
                None,
                f"hold_for_s {rule.hold_for_s} is not a positive number of seconds of at most "
                f"{MAX_HOLD_FOR_S:.0f}",
            )
        if rule.max_without_progress is not None and not (
            1 <= rule.max_without_progress <= MAX_SUBMISSION
        ):
            raise InvalidPolicy(
                i,
                None,
                f"max_without_progress {rule.max_without_progress} is not in "
                f"1..{MAX_SUBMISSION} (executions)",
            )
        for kind in rule.on:
            if kind in _UNCOVERABLE:
                raise InvalidPolicy(
                    i, kind.value, f"no rule may cover {kind}: {_UNCOVERABLE[kind]}"
                )
        if CauseKind.UNKNOWN in rule.on and rule.action not in _FOR_UNKNOWN:
            raise InvalidPolicy(
                i,
                CauseKind.UNKNOWN.value,
                f"unknown may only be covered by a hold or escalate rule, not {rule.action}: "
                "resubmitting on a cause nobody understands is a guess",
            )
        _validate_clusters(i, rule.action, rule.clusters)
        _validate_wait(i, rule.on, rule.wait_s)
        for kind in rule.on:
            first = covered.get(kind)
            if first is not None and first != i:
                raise InvalidPolicy(
                    i,
                    kind.value,
                    f"{kind} is already covered by rule {first}; a cause has one rule",
                )
            covered[kind] = i


def _validate_clusters(i: int, action: Action, clusters: tuple[str, ...]) -> None:
    """Refuse rule ``i``'s failover list (see :func:`validate`)."""
    if not clusters:
        return
    if action is not Action.RESUBMIT:
        raise InvalidPolicy(
            i,
            None,
            f"clusters (failover) is only for a resubmit rule, not {action}: only a new "
            "submission can run on another cluster",
        )
    seen: set[str] = set()
    for cluster in clusters:
        if not is_job_id(cluster):
            raise InvalidPolicy(
                i,
                None,
                f"clusters: {cluster!r} is not a cluster name (lower-case letters, digits and '-')",
            )
        if cluster in seen:
            raise InvalidPolicy(i, None, f"clusters: {cluster!r} is listed twice")
        seen.add(cluster)


def _validate_wait(i: int, on: tuple[CauseKind, ...], wait_s: float | None) -> None:
    """Refuse rule ``i``'s ``wait_s`` (see :func:`validate`)."""
    if wait_s is None:
        return
    if CauseKind.NO_CAPACITY not in on:
        raise InvalidPolicy(
            i,
            None,
            "wait_s (how long a no-capacity wait is tolerated) is only for a rule covering "
            "no-capacity",
        )
    if not (math.isfinite(wait_s) and 0 < wait_s <= MAX_HOLD_FOR_S):
        raise InvalidPolicy(
            i,
            CauseKind.NO_CAPACITY.value,
            f"wait_s {wait_s} is not a positive number of seconds of at most {MAX_HOLD_FOR_S:.0f}",
        )


def planned_wait_s(rule: PlannedRule) -> float:
    """Seconds ``rule`` (covering ``no-capacity``) tolerates a no-capacity wait: its
    ``wait_s``, else ``NO_CAPACITY_WAIT_S`` (a plan recorded before the setting existed)."""
    return NO_CAPACITY_WAIT_S if rule.wait_s is None else rule.wait_s


MAX_LAUNCH_ATTEMPTS: Final = 1000
"""Most launch attempts per submission a spec may ask for."""


def validate_spec(spec: JobSpec) -> None:
    """Refuse a spec the planner can't work with, or that no runner could start.

    ``unresolved_age_s``, ``cleanup_deadline_s`` and ``stop_overdue_s`` must be positive,
    finite numbers of seconds of at most ``MAX_HOLD_FOR_S`` (the planner adds them to times,
    and a deadline past the year 9999 can't be computed); ``max_launch_attempts`` must be in
    1..``MAX_LAUNCH_ATTEMPTS``.

    Refused at the door (issue 15, item 7), because every backend would take the job and its
    runner die on it at launch (``execve`` refuses a NUL byte in an argument, an environment
    entry or a path, and reads an environment entry ``KEY=VALUE`` up to the first ``=``):

    * a spec with both ``command`` and ``script`` (which one would run?);
    * a NUL byte in an element of ``command``, in ``script``, in an environment key or
      value, or in an option's name or value (``options.chdir`` among them);
    * an environment key that is empty or contains ``=``;
    * an environment key starting with ``DISPATCH_``: those name the execution to the job and
      its checkpoint library (``DISPATCH_EPOCH``, ``DISPATCH_ATTEMPT``...; seed 004, "The
      epoch orders executions"); every backend sets them last, so a spec's value would be
      silently overridden (or, for one dispatch adds later, silently win).

    ``=`` stays legal where a program or path takes it: in ``command`` (``--lr=0.1``), in an
    environment value, and in ``options.chdir`` (``/data/run=3`` is a valid path).

    Raises:
        InvalidSpec: naming the field (``command``, ``script``, ``env``, ``options.<name>``,
            a duration, ``max_launch_attempts``) and why.
    """
    for name in ("unresolved_age_s", "cleanup_deadline_s", "stop_overdue_s"):
        value = float(getattr(spec, name))
        if not (math.isfinite(value) and 0 < value <= MAX_HOLD_FOR_S):
            raise InvalidSpec(
                name,
                f"{value} is not a positive number of seconds of at most {MAX_HOLD_FOR_S:.0f}",
            )
    if not 1 <= spec.max_launch_attempts <= MAX_LAUNCH_ATTEMPTS:
        raise InvalidSpec(
            "max_launch_attempts",
            f"{spec.max_launch_attempts} is not in 1..{MAX_LAUNCH_ATTEMPTS}",
        )
    _validate_runnable(spec)


_NUL: Final = "\0"

RESERVED_ENV_PREFIX: Final = "DISPATCH_"
"""Environment names dispatch sets in every execution (seed 004); a spec may not set them."""


def _validate_runnable(spec: JobSpec) -> None:
    """Refuse what no runner can start (see :func:`validate_spec`)."""
    if spec.command and spec.script:
        raise InvalidSpec(
            "script",
            "the spec has both a command and a script; give exactly one (which would run?)",
        )
    for i, arg in enumerate(spec.command):
        if _NUL in arg:
            raise InvalidSpec(
                "command", f"argument {i} ({arg!r}) has a NUL byte, which no program can get"
            )
    if _NUL in spec.script:
        raise InvalidSpec("script", "the script has a NUL byte")
    for key, value in spec.env.items():
        if not key or "=" in key or _NUL in key:
            raise InvalidSpec(
                "env",
                f"{key!r} is not an environment variable name: a name is not empty and has "
                "no '=' and no NUL byte",
            )
        if _NUL in value:
            raise InvalidSpec("env", f"the value of {key} has a NUL byte")
        if key.startswith(RESERVED_ENV_PREFIX):
            raise InvalidSpec(
                "env",
                f"{key} is dispatch's own: variables starting with {RESERVED_ENV_PREFIX} tell "
                "the execution who it is (DISPATCH_EPOCH, DISPATCH_ATTEMPT, ...) and are set "
                "by dispatch; rename it",
            )
    for key, value in spec.options.items():
        if _NUL in key:
            raise InvalidSpec("options", f"option name {key!r} has a NUL byte")
        if _NUL in value:
            raise InvalidSpec(f"options.{key}", f"{value!r} has a NUL byte")


def make_plan(spec: JobSpec, policy: RecoveryPolicy, declarations: Declarations) -> Plan:
    """Make the plan that shows, before the job starts, how it will be recovered.

    Implements seed 000 ("Recovery rules": ``Plan.Uncovered``; "An object ending is not the
    job ending": restart and requeue only where the backend enforces them natively) and
    seed 004 ("When a job can't isolate": with a shared checkpoint every recovery rule
    becomes a 24 h hold, and the plan shows the substitution).

    Args:
        spec: the job's spec (its extensions say whether it shares a checkpoint).
        policy: the recovery policy.
        declarations: what the backend of ``spec.cluster`` declares.

    Returns:
        The plan: one ``PlannedRule`` per policy rule, in policy order; ``uncovered`` every
        coverable cause no rule covers, in ``CauseKind`` order; the substitutions made.

    Raises:
        InvalidPolicy: ``validate`` refuses the policy.
    """
    validate(policy)
    shared = spec.shared_checkpoint
    planned: list[PlannedRule] = []
    substitutions: list[Substitution] = []
    covered: set[CauseKind] = set()
    for i, rule in enumerate(policy.rules):
        covered.update(rule.on)
        action, enforcer, hold_for_s = rule.action, rule.enforcer, rule.hold_for_s
        substituted_for: Action | None = None
        unenforced: str | None = None
        if shared and action in _RECOVERING:
            substituted_for, action, hold_for_s = action, Action.HOLD, SHARED_HOLD_FOR_S
            substitutions.append(
                Substitution(
                    rule=i,
                    original=substituted_for,
                    substitute=Action.HOLD,
                    reason=(
                        "the job shares a mutable checkpoint: the scheduler's word that an "
                        "execution ended doesn't prove its processes stopped, so "
                        f"{substituted_for} becomes a hold for 24 h and a person decides "
                        "when it is safe to run again (seed 004)"
                    ),
                )
            )
        if action in _NATIVE_ONLY:
            if enforcer is Enforcer.SUPERVISOR:
                unenforced = f"supervisor recovery for {action} isn't implemented"
            elif action not in declarations.native_actions:
                unenforced = f"backend of cluster {spec.cluster} doesn't enforce {action} natively"
        else:
            # resubmit, hold and escalate are always the supervisor's (core-semantics).
            enforcer = Enforcer.SUPERVISOR
        planned.append(
            PlannedRule(
                rule=i,
                on=rule.on,
                action=action,
                budget=rule.budget,
                enforcer=enforcer,
                hold_for_s=hold_for_s,
                substituted_for=substituted_for,
                unenforced=unenforced,
                free_if_progress=rule.free_if_progress,
                max_without_progress=rule.max_without_progress,
                clusters=rule.clusters,
                wait_s=(
                    (NO_CAPACITY_WAIT_S if rule.wait_s is None else rule.wait_s)
                    if CauseKind.NO_CAPACITY in rule.on
                    else None
                ),
            )
        )
    uncovered = tuple(sorted(COVERABLE_CAUSES - covered, key=_ORDER.__getitem__))
    return Plan(rules=tuple(planned), uncovered=uncovered, substitutions=tuple(substitutions))

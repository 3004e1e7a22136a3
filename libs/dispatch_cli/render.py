"""How the CLI shows things to a person: tables, a job in detail, a plan, a Status line.

Everything here is pure (text in, text out); ``--json`` output bypasses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Final, assert_never

from dispatch_cli.client import EscalationView, JobSummary
from dispatch_cli.program import program
from dispatch_core import (
    Abandoned,
    CancelRequested,
    Cause,
    CauseKind,
    CessationObserved,
    EmergencyStopRequested,
    EscalationCommitted,
    EscalationDelivered,
    EscalationKind,
    ExecutionEnded,
    GateOpened,
    GaveUp,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    HoldView,
    InvalidEscalationId,
    JobCreated,
    JobEvent,
    LaunchIntended,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
    NoCapacityObserved,
    NodeLossObserved,
    OutcomeCommitted,
    Plan,
    ProgressObserved,
    RecoveryCommitted,
    Status,
    StopRequested,
    SubmissionOpened,
    Superseded,
    Transition,
    parse_escalation_id,
)
from dispatch_core import hold_answers as core_hold_answers

__all__ = [
    "answer_hint",
    "cause_text",
    "escalations_table",
    "event_line",
    "history_omitted_line",
    "hold_answers",
    "hold_brief",
    "hold_lines",
    "hold_text",
    "jobs_table",
    "plan_lines",
    "status_detail",
    "status_line",
    "table",
    "when",
]


def when(at: datetime | None, *, now: datetime | None = None) -> str:
    """``at`` in local time: ``HH:MM:SS`` today, else ``YYYY-MM-DD HH:MM:SS``."""
    if at is None:
        return "-"
    local = at.astimezone()
    today = (now or datetime.now(UTC)).astimezone().date()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    all_rows = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(headers))]
    lines = []
    for row in all_rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def cause_text(cause: Cause, *, detail: bool = True) -> str:
    """``preempted: "preempted by fault injection" (scheduler)``; ``none`` alone."""
    if cause.kind is CauseKind.NONE and not cause.detail:
        return "none"
    text = cause.kind.value
    if not detail:
        return text
    extras = []
    if cause.detail:
        extras.append(f'"{cause.detail}"')
    who = cause.provenance.value
    if cause.actor is not None:
        who += f" {cause.actor.name}"
    extras.append(f"({who})")
    if cause.exit_code is not None and "exit code" not in cause.detail:
        extras.append(f"exit code {cause.exit_code}")
    return f"{text}: " + " ".join(extras)


def hold_text(hold: HoldView | None) -> str:
    """One line about the hold in force, or ``-``."""
    if hold is None:
        return "-"
    text = f"{hold.kind.value} hold #{hold.instance} by {hold.by.name}: {hold.reason}"
    text += f" (until {when(hold.deadline)}{', OVERDUE' if hold.overdue else ''})"
    return text


_REASON = '--reason "..."'


_DOES: Final = {
    "release": "let it run again",
    "resubmit": "run a new submission",
    "cancel": "cancel the job",
    "give-up": "fail it with the cause that ended it",
}


def hold_answers(job_id: str, kind: HoldKind) -> list[tuple[str, str]]:
    """The commands that answer a hold of ``kind`` (the core's
    :func:`~dispatch_core.escalations.hold_answers`), each with what it does: an actor hold
    is released; a recovery hold, which release can't lift, is resubmitted, cancelled or
    given up."""
    return [
        (f"{program()} {answer} {job_id} {_REASON}", _DOES[answer])
        for answer in core_hold_answers(kind)
    ]


def hold_lines(job_id: str, hold: HoldView, *, width: int = 8) -> list[str]:
    """What a person reads about a hold in force: for a recovery hold the cause that ended
    the execution, in the scheduler's or the application's words (an exit code, Slurm's
    ``FAILED 7:0``), then the commands that answer it; each line a label padded to ``width``
    and its text."""
    pairs = []
    if hold.cause is not None:
        pairs.append(("ended by", cause_text(hold.cause)))
    for i, (command, does) in enumerate(hold_answers(job_id, hold.kind)):
        pairs.append(("answer" if i == 0 else "", f"{command}  ({does})"))
    return [f"{label:<{width}}  {text}" for label, text in pairs]


def hold_brief(hold: HoldView | None) -> str:
    """The HOLD column of the jobs table: ``-`` without a hold, else :func:`_hold_brief`."""
    return "-" if hold is None else _hold_brief(hold)


def _hold_brief(hold: HoldView) -> str:
    """The hold in a few words: its kind, and the cause that ended the execution."""
    text = hold.kind.value
    if hold.cause is not None:
        text += f" on {hold.cause.kind.value}"
        if hold.cause.exit_code is not None:
            text += f" (exit {hold.cause.exit_code})"
    return text + (" (overdue)" if hold.overdue else "")


def plan_lines(plan: Plan) -> list[str]:
    """The plan as a user reads it before the job starts: each rule, the substitutions, and
    the causes no rule covers (an execution ending with one fails the job)."""
    lines = []
    if not plan.rules:
        lines.append("  rules:      none")
    for rule in plan.rules:
        on = ", ".join(k.value for k in rule.on)
        text = f"  rule {rule.rule}:     {rule.action.value} on {on}"
        if rule.action.value in ("resubmit", "restart", "requeue"):
            text += f" (budget {rule.budget})"
        if rule.action.value == "hold":
            text += f" (overdue after {duration_text(rule.hold_for_s)})"
        if rule.free_if_progress:
            text += " (free if progress)"
        if rule.max_without_progress is not None:
            text += f" (hold after {rule.max_without_progress} without progress)"
        if rule.clusters:
            text += f" (fail over: {' -> '.join(rule.clusters)})"
        if rule.wait_s is not None:
            text += f" (no capacity for {duration_text(rule.wait_s)}: stop and apply)"
        if rule.enforcer.value == "backend":
            text += " [backend enforces it]"
        if rule.substituted_for is not None:
            text += f" [instead of {rule.substituted_for.value}]"
        if rule.unenforced:
            text += f" [NOT ENFORCED: {rule.unenforced}]"
        lines.append(text)
    for sub in plan.substitutions:
        lines.append(
            f"  changed:    rule {sub.rule} {sub.original.value} -> {sub.substitute.value}: "
            f"{sub.reason}"
        )
    if plan.uncovered:
        lines.append("  uncovered:  " + ", ".join(k.value for k in plan.uncovered))
        lines.append("              (an execution ending with one of these fails the job)")
    else:
        lines.append("  uncovered:  none: every cause has a rule")
    return lines


def duration_text(seconds: float) -> str:
    """``seconds`` as the plan says it: ``24 h`` (whole hours), ``15 min``, ``30 s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def status_line(status: Status) -> str:
    """One line of ``watch``: time, state, cause, and where it runs."""
    parts = [when(status.at), f"{status.state.value:<10}", cause_text(status.cause)]
    where = []
    if status.submission is not None:
        where.append(f"submission {status.submission}")
        if status.cluster is not None:
            where[-1] += f" on {status.cluster}"
    if status.epoch is not None:
        where.append(f"epoch {status.epoch}")
    if status.objects:
        where.append("objects " + ", ".join(f"{o.cluster}/{o.id}" for o in status.objects))
    if status.hold is not None:
        where.append(hold_text(status.hold))
    if status.settled:
        where.append("settled")
    line = "  ".join(parts)
    return line + (f"  [{'; '.join(where)}]" if where else "")


def transition_line(transition: Transition, *, note: str = "") -> str:
    """One committed transition of a job's history."""
    text = f"{when(transition.at)}  {transition.state.value:<10}  {cause_text(transition.cause)}"
    if transition.detail:
        text += f"  -- {transition.detail}"
    return text + note


def history_omitted_line(job_id: str, omitted: int, shown: int) -> str:
    """The note that ``omitted`` earlier transitions of the job's history aren't shown: a
    Status carries only its last ``STATUS_HISTORY_LIMIT`` (``shown`` here); the record holds
    them all."""
    what = "transition" if omitted == 1 else "transitions"
    return (
        f"({omitted} earlier {what} not shown: a Status carries the last {shown}; "
        f"{program()} record {job_id} prints the whole record)"
    )


def jobs_table(jobs: Sequence[JobSummary]) -> str:
    """``dispatch status``: one row per job; ``SUPERSEDED`` names the job's successor."""
    rows = []
    for job in jobs:
        hold = "-" if job.hold is None else _hold_brief(job.hold)
        rows.append(
            [
                job.job_id,
                job.state.value,
                cause_text(job.cause, detail=False),
                "-" if job.submission is None else str(job.submission),
                hold,
                "yes" if job.settled else "no",
                job.superseded_by or "-",
            ]
        )
    return table(["JOB", "STATE", "CAUSE", "SUB", "HOLD", "SETTLED", "SUPERSEDED"], rows)


def answer_hint(
    job_id: str,
    escalation_id: str,
    *,
    cluster: str | None = None,
    hold: HoldView | None = None,
) -> str:
    """The command that answers an escalation (seed 002, "Answer it by its id").

    Args:
        job_id: the job.
        escalation_id: the escalation's id; its kind (:class:`EscalationKind`) says what
            happened.
        cluster: the job's cluster (names a foreign object).
        hold: the hold in force: an ``overdue`` escalation of it gets the commands of its kind
            alone.
    """
    try:
        kind, arg = parse_escalation_id(escalation_id)
    except InvalidEscalationId:
        return "nothing to answer"  # an id this build doesn't know (a newer writer's)
    rest = arg or ""
    r = _REASON
    p = program()
    match kind:
        case EscalationKind.OVERDUE if hold is not None and rest == str(hold.instance):
            return "; or ".join(command for command, _ in hold_answers(job_id, hold.kind))
        case EscalationKind.OVERDUE:
            return (
                f"{p} release {job_id} {r} (an actor hold); for a recovery hold: "
                f"{p} resubmit|cancel|give-up {job_id} {r}"
            )
        case EscalationKind.ALL_UNKNOWN:
            return (
                f"check the scheduler for dj-{job_id}; if none: "
                f"{p} abandon {job_id} --submission {rest} {r}"
            )
        case EscalationKind.UNMATCHED:
            sub, _, att = rest.partition("/")
            return (
                f"check the scheduler for dj-{job_id}; if none: "
                f"{p} abandon {job_id} --submission {sub} --attempt {att} {r}"
            )
        case EscalationKind.FOREIGN:
            target = f"{cluster or 'CLUSTER'}/{rest}"
            return (
                "stop it on the scheduler if it shouldn't run, then: "
                f"{p} abandon {job_id} --foreign {target} {r}"
            )
        case EscalationKind.ADMIN_HELD:
            return f"ask whoever holds object {rest}, or: {p} cancel {job_id} {r}"
        case EscalationKind.FAILED | EscalationKind.REFUSED:
            return f"to run it again: {p} supersede {job_id} {r}"
        case EscalationKind.CLEANUP_DEADLINE:
            return f"stop what is left on the scheduler, or: {p} emergency-stop {job_id} {r}"
        case EscalationKind.STOP_OVERDUE:
            target = f"{cluster or 'CLUSTER'}/{rest}"
            return (
                f"stop object {target} on the scheduler yourself (it ignores dispatch's stop), "
                f"or: {p} emergency-stop {job_id} {r}"
            )
        case EscalationKind.GIVE_UP:
            return "nothing to answer"
        case EscalationKind.NO_PROGRESS:
            return (
                f"find why it makes no progress, then: dispatch resubmit {job_id} {r} "
                f"(or give-up, or cancel)"
            )
        case _:
            assert_never(kind)


def escalations_table(escalations: Sequence[EscalationView]) -> str:
    """``dispatch escalations``: one row per escalation, with the command that answers it."""
    rows = [
        [
            when(e.at),
            e.job_id,
            e.id,
            "delivered" if e.delivered is not None else "UNDELIVERED",
            e.detail,
        ]
        for e in escalations
    ]
    return table(["AT", "JOB", "ID", "DELIVERY", "DETAIL"], rows)


_WINDOW_WORDS: Final[dict[type[JobEvent], tuple[str, str]]] = {
    NodeLossObserved: ("on a lost node", "node back: no longer on a lost node"),
    NoCapacityObserved: ("waits for capacity", "no longer waits for capacity"),
}
"""What an object's window fact says once it begins, and once it ends (``since=None``)."""


def event_line(seq: int, event: JobEvent) -> str:
    """One record event, in a few words."""
    match event:
        case JobCreated():
            what = f"created on {event.spec.cluster} by {event.by.name}"
            if event.supersedes:
                what += f", superseding {event.supersedes}"
        case SubmissionOpened():
            what = f"submission {event.submission} opened ({event.why})"
            if event.cluster is not None:
                what += f" on {event.cluster}"
        case LaunchRecorded():
            what = f"launch {event.submission}/{event.attempt} -> {event.ref}"
        case LaunchIntended():
            what = f"launch {event.submission}/{event.attempt} intended"
        case LaunchRefused():
            what = f"launch {event.submission}/{event.attempt} refused: {event.detail}"
        case LaunchUnknown():
            what = f"launch {event.submission}/{event.attempt} outcome unknown: {event.detail}"
        case GateOpened():
            what = f"gate of {event.ref} opened"
        case StopRequested():
            kind = "emergency stop" if event.emergency else "stop"
            what = f"{kind} of {event.ref}: {event.why}"
            if event.cause is not None:  # a no-capacity stop: what the scheduler said
                what += f" ({cause_text(event.cause)})"
        case NodeLossObserved() | NoCapacityObserved():
            began, ended = _WINDOW_WORDS[type(event)]
            if event.since is None or event.cause is None:
                what = f"{event.ref} {ended}"
            else:
                what = f"{event.ref} {began}: {cause_text(event.cause)}"
        case CessationObserved():
            what = f"{event.ref} ceased: {'yes' if event.ceased else 'no'}"
        case CancelRequested() | GaveUp() | EmergencyStopRequested():
            what = f"by {event.by.name}: {event.reason}"
        case Superseded():
            what = f"by job {event.new_job} ({event.by.name}: {event.reason})"
        case ExecutionEnded():
            what = f"{event.ref} ended: {cause_text(event.cause)}"
        case RecoveryCommitted():
            what = f"recovery: rule {event.rule} {event.action.value} on {event.cause.kind.value}"
            if event.free:
                what += " (free: the execution made progress)"
        case ProgressObserved():
            step = "nothing published" if event.step is None else f"step {event.step}"
            what = f"{event.ref} ended at {step}"
            if event.advanced:
                what += ", advanced"
            if event.without_progress:
                what += f", {event.without_progress} without progress"
        case HoldPlaced():
            what = f"{event.kind.value} hold #{event.instance} by {event.by.name}: {event.reason}"
        case HoldReleased():
            what = f"hold #{event.instance} ended ({event.how}) by {event.by.name}"
        case Abandoned():
            what = f"{event.target} abandoned by {event.by.name}: {event.reason}"
        case OutcomeCommitted():
            what = f"outcome {event.state.value}: {cause_text(event.cause)}"
        case EscalationCommitted():
            what = f"escalation {event.id}: {event.detail}"
        case EscalationDelivered():
            what = f"escalation {event.id} delivered"
        case _:
            assert_never(event)
    tag = type(event).__struct_config__.tag
    return f"{seq:>6}  {when(event.at)}  {tag:<24} {what}".rstrip()


def status_detail(
    status: Status,
    escalations: Sequence[EscalationView],
    *,
    cluster: str | None = None,
    command: str | None = None,
) -> str:
    """``dispatch status JOB``: the job in detail, its history and its escalations."""
    lines = [f"job {status.job_id}" + (f"  (cluster {cluster})" if cluster else "")]
    if command:
        lines.append(f"  command     {command}")
    lines.append(f"  state       {status.state.value}{'  (settled)' if status.settled else ''}")
    lines.append(f"  cause       {cause_text(status.cause)}")
    if status.submission is not None:
        on = f" on {status.cluster}" if status.cluster and status.cluster != cluster else ""
        lines.append(f"  submission  {status.submission}{on}")
    if status.epoch is not None:
        lines.append(f"  epoch       {status.epoch}")
    if status.published_step is not None:
        lines.append(
            f"  published   step {status.published_step} (as of {when(status.published_at)})"
        )
    objects = ", ".join(f"{o.cluster}/{o.id}" for o in status.objects) or "-"
    lines.append(f"  objects     {objects}")
    lines.append(f"  hold        {hold_text(status.hold)}")
    if status.hold is not None:
        lines.extend(f"  {line}" for line in hold_lines(status.job_id, status.hold, width=10))
    if status.supersedes:
        lines.append(f"  supersedes  {status.supersedes}")
    if status.superseded_by:
        lines.append(f"  superseded  by {status.superseded_by}")
    lines.append(f"  as of       {when(status.at)} (record seq {status.seq}, {status.level.value})")
    lines.append("history (committed transitions, oldest first)")
    if status.history_omitted:
        lines.append(
            "  " + history_omitted_line(status.job_id, status.history_omitted, len(status.history))
        )
    if status.history:
        lines.extend("  " + transition_line(t) for t in status.history)
    else:
        lines.append("  none yet")
    lines.append("escalations")
    if escalations:
        for e in escalations:
            state = "delivered" if e.delivered is not None else "UNDELIVERED"
            lines.append(f"  {when(e.at)}  {e.id}  [{state}]  {e.detail}")
            hint = answer_hint(status.job_id, e.id, cluster=cluster, hold=status.hold)
            lines.append(f"      answer: {hint}")
    else:
        lines.append("  none")
    return "\n".join(lines)

"""How the CLI shows a hold in force (libs/dispatch_cli/render.py, watching.py): the cause
that ended the execution in its own words, and the commands that answer the hold, in
``dispatch status JOB``, the jobs table and ``dispatch watch`` (once per hold)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from dispatch_cli.client import JobSummary
from dispatch_cli.render import answer_hint, jobs_table, status_detail
from dispatch_cli.watching import Watcher
from dispatch_core import (
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    HoldKind,
    HoldView,
    Level,
    Provenance,
    State,
    Status,
    Transition,
)
from tests.util import ReplayedStatusStream

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SUPERVISOR = Actor(name="supervisor", kind=ActorKind.SERVICE)
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
R = '--reason "..."'


def _exit(code: int, detail: str | None = None, provenance: Provenance | None = None) -> Cause:
    return Cause(
        kind=CauseKind.NON_ZERO_EXIT,
        provenance=provenance or Provenance.APPLICATION,
        detail=f"exit code {code}" if detail is None else detail,
        exit_code=code,
    )


def _recovery_hold(ended: Cause, instance: int = 1) -> HoldView:
    return HoldView(
        instance=instance,
        kind=HoldKind.RECOVERY,
        by=SUPERVISOR,
        reason="non-zero-exit ended the execution; rule 0 holds the job for a person",
        since=T0,
        deadline=T0 + timedelta(days=1),
        overdue=False,
        cause=ended,
    )


ACTOR_HOLD = HoldView(
    instance=1,
    kind=HoldKind.ACTOR,
    by=ALICE,
    reason="node maintenance",
    since=T0,
    deadline=T0 + timedelta(hours=2),
    overdue=False,
)


def _held(hold: HoldView | None, seq: int = 3, *, state: State = State.HELD) -> Status:
    held_cause = Cause(
        kind=CauseKind.HELD,
        provenance=Provenance.ACTOR,
        actor=None if hold is None else hold.by,
        detail="" if hold is None else hold.reason,
    )
    cause = (
        held_cause
        if state is State.HELD
        else Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)
    )
    return Status(
        job_id="j",
        level=Level.FULL,
        state=state,
        cause=cause,
        at=T0 + timedelta(seconds=seq),
        seq=seq,
        hold=hold,
        history=(Transition(at=T0, state=State.HELD, cause=held_cause),)
        if state is State.HELD
        else (),
        submission=1,
        settled=state.terminal,
    )


def test_status_of_a_recovery_hold_shows_the_exit_code_and_the_three_answers() -> None:
    detail = status_detail(_held(_recovery_hold(_exit(3))), [])
    assert '  ended by    non-zero-exit: "exit code 3" (application)' in detail
    assert f"  answer      dispatch resubmit j {R}" in detail
    assert f"dispatch cancel j {R}" in detail
    assert f"dispatch give-up j {R}" in detail
    assert "dispatch release" not in detail


def test_status_of_a_slurm_recovery_hold_shows_the_schedulers_words() -> None:
    ended = _exit(7, detail="FAILED 7:0", provenance=Provenance.SCHEDULER)
    detail = status_detail(_held(_recovery_hold(ended)), [])
    assert 'ended by    non-zero-exit: "FAILED 7:0" (scheduler) exit code 7' in detail


def test_status_of_an_actor_hold_shows_release_only() -> None:
    detail = status_detail(_held(ACTOR_HOLD), [])
    assert f"  answer      dispatch release j {R}" in detail
    assert "ended by" not in detail
    for command in ("resubmit", "cancel", "give-up"):
        assert f"dispatch {command}" not in detail


def test_without_a_hold_status_shows_no_answer() -> None:
    detail = status_detail(_held(None, state=State.RUNNING), [])
    assert "answer" not in detail


def test_an_overdue_escalation_of_the_hold_in_force_answers_for_its_kind() -> None:
    assert answer_hint("j", "overdue:1", hold=ACTOR_HOLD) == f"dispatch release j {R}"
    recovery = answer_hint("j", "overdue:1", hold=_recovery_hold(_exit(3)))
    assert recovery == (
        f"dispatch resubmit j {R}; or dispatch cancel j {R}; or dispatch give-up j {R}"
    )
    # Without the hold (or for an earlier one), both kinds' commands.
    unknown = answer_hint("j", "overdue:1")
    assert "dispatch release" in unknown
    assert "give-up" in unknown
    assert "dispatch release" in answer_hint("j", "overdue:1", hold=_recovery_hold(_exit(3), 2))


def test_the_jobs_table_names_the_cause_that_ended_a_held_job() -> None:
    rows = [
        JobSummary(
            job_id=job_id,
            state=State.HELD,
            cause=Cause(kind=CauseKind.HELD, provenance=Provenance.ACTOR),
            at=T0,
            seq=1,
            settled=False,
            hold=hold,
            submission=1,
        )
        for job_id, hold in (("a", _recovery_hold(_exit(3))), ("b", ACTOR_HOLD))
    ]
    table = jobs_table(rows).splitlines()
    assert "recovery on non-zero-exit (exit 3)" in table[1]
    assert table[2].split()[:5] == ["b", "held", "held", "1", "actor"]


def test_dispatch_status_puts_the_successor_under_its_own_header() -> None:
    row = JobSummary(
        job_id="old",
        state=State.FAILED,
        cause=Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER),
        at=T0,
        seq=9,
        settled=True,
        superseded_by="new",
    )
    header, line = jobs_table([row]).splitlines()
    assert header.split()[-1] == "SUPERSEDED"
    assert line.split()[-1] == "new"
    assert line.index("new") == header.index("SUPERSEDED")


def _watch(statuses: list[Status]) -> list[str]:
    lines: list[str] = []
    done = Status(
        job_id="j",
        level=Level.FULL,
        state=State.CANCELLED,
        cause=Cause(kind=CauseKind.CANCELLED, provenance=Provenance.ACTOR),
        at=T0 + timedelta(minutes=1),
        seq=99,
        settled=True,
    )
    Watcher(ReplayedStatusStream([*statuses, done]), "j", emit=lines.append).run()
    return lines


def test_watch_prints_the_answer_to_a_recovery_hold_once() -> None:
    hold = _recovery_hold(_exit(3))
    first = _held(hold, 3)
    overdue = msgspec.structs.replace(
        first, seq=4, hold=msgspec.structs.replace(hold, overdue=True)
    )
    lines = _watch([first, msgspec.structs.replace(first, seq=4), overdue])
    text = "\n".join(lines)
    assert text.count('ended by  non-zero-exit: "exit code 3" (application)') == 1, text
    assert text.count(f"answer    dispatch resubmit j {R}") == 1, text
    assert text.count(f"dispatch cancel j {R}") == 1, text
    assert text.count(f"dispatch give-up j {R}") == 1, text
    # The hint follows the line that shows the job held.
    at = next(i for i, line in enumerate(lines) if "ended by" in line)
    assert " held " in lines[at - 1], text


def test_watch_prints_the_answer_again_for_a_new_hold() -> None:
    first = _held(_recovery_hold(_exit(3)), 3)
    second = _held(_recovery_hold(_exit(5), instance=2), 6)
    text = "\n".join(_watch([first, second]))
    assert "exit code 3" in text
    assert "exit code 5" in text
    assert text.count("dispatch give-up j") == 2, text


def test_watch_of_an_actor_hold_prints_release() -> None:
    text = "\n".join(_watch([_held(ACTOR_HOLD)]))
    assert f"answer    dispatch release j {R}" in text
    assert "give-up" not in text

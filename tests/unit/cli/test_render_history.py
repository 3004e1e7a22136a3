"""How the CLI shows a job's history once a Status carries only its latest transitions
(issue 11: ``STATUS_HISTORY_LIMIT`` and ``history_total``): ``dispatch status JOB`` and
``dispatch watch`` say how many are left out and where the whole history is, and ``watch``
still shows every transition the stream skipped that the Status carries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from dispatch_cli.render import status_detail, transition_line
from dispatch_cli.watching import MISSED_NOTE, Watcher
from dispatch_core import (
    STATUS_HISTORY_LIMIT,
    Cause,
    CauseKind,
    Level,
    Provenance,
    State,
    Status,
    Transition,
)
from tests.util import ReplayedStatusStream

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED")
NONE = Cause(kind=CauseKind.NONE, provenance=Provenance.SCHEDULER)


def _transitions(n: int) -> tuple[Transition, ...]:
    return tuple(
        Transition(at=T0 + timedelta(minutes=i), state=State.RECOVERING, cause=PREEMPTED)
        for i in range(n)
    )


def _status(total: int, seq: int, *, settled: bool = False) -> Status:
    """A Status of job ``j`` whose record holds ``total`` transitions (running now)."""
    history = _transitions(total)
    return Status(
        job_id="j",
        level=Level.FULL,
        state=State.RUNNING,
        cause=NONE,
        at=T0,
        seq=seq,
        history=history[-STATUS_HISTORY_LIMIT:],
        history_total=total,
        settled=settled,
    )


def test_status_says_how_many_earlier_transitions_it_leaves_out_and_where_they_are() -> None:
    text = status_detail(_status(STATUS_HISTORY_LIMIT + 12, 9), [])
    lines = text.splitlines()
    at = lines.index("history (committed transitions, oldest first)")
    assert lines[at + 1] == (
        f"  (12 earlier transitions not shown: a Status carries the last {STATUS_HISTORY_LIMIT};"
        " dispatch record j prints the whole record)"
    )
    shown = [line for line in lines[at + 2 :] if "recovering" in line]
    assert len(shown) == STATUS_HISTORY_LIMIT


def test_status_of_a_short_history_or_an_old_status_shows_it_whole_without_a_note() -> None:
    short = status_detail(_status(3, 5), [])
    old = msgspec.json.decode(msgspec.json.encode(_status(3, 5)))
    del old["history_total"]  # written before the history was bounded
    before = status_detail(msgspec.json.decode(msgspec.json.encode(old), type=Status), [])
    for text in (short, before):
        assert "not shown" not in text
        assert sum("recovering" in line for line in text.splitlines()) == 3


def test_watch_counts_transitions_by_the_record_not_by_what_the_status_carries() -> None:
    """Past the limit, a Status carries as many transitions as the one before: watch still
    sees the new ones (by ``history_total``), shows those the stream skipped, and notes
    those the Status no longer carries."""
    first = _status(STATUS_HISTORY_LIMIT + 5, 10)
    skipped_two = _status(STATUS_HISTORY_LIMIT + 7, 12)
    far_behind = _status(STATUS_HISTORY_LIMIT * 2 + 10, 40)
    done = msgspec.structs.replace(far_behind, seq=41, settled=True)
    lines: list[str] = []
    Watcher(
        ReplayedStatusStream([first, skipped_two, far_behind, done]), "j", emit=lines.append
    ).run()
    assert lines[0] == (
        f"(5 earlier transitions not shown: a Status carries the last {STATUS_HISTORY_LIMIT};"
        " dispatch record j prints the whole record)"
    )
    every = _transitions(STATUS_HISTORY_LIMIT * 2 + 10)
    missed = [line for line in lines if line.endswith(MISSED_NOTE)]
    assert missed[:2] == [
        transition_line(t, note=MISSED_NOTE)
        for t in every[STATUS_HISTORY_LIMIT + 5 : STATUS_HISTORY_LIMIT + 7]
    ]
    # 53 committed between the second and third Status; the third carries the last 50.
    assert (
        f"(3 earlier transitions not shown: a Status carries the last {STATUS_HISTORY_LIMIT};"
        " dispatch record j prints the whole record)"
    ) in lines
    assert missed[2:] == [
        transition_line(t, note=MISSED_NOTE) for t in every[-STATUS_HISTORY_LIMIT:]
    ]

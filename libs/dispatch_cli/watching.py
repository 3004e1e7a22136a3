"""``dispatch watch``: follow a job's Status live until it settles.

The API's SSE stream sends each Status the supervisor publishes, in order. Each one is shown
on a line. A Status carries the latest of the job's committed transitions and how many
there are (``history_total``), so a transition the stream skipped (the status stream keeps
one Status per job: one replaced within milliseconds can be skipped) is still shown, from
the record, marked as such; transitions older than the Status carries are counted and the
person pointed at ``dispatch record``: nothing committed is lost from view. The stream is
resumed with ``Last-Event-ID`` when it ends before the job settles (the API restarted), for
up to ``reconnect_s`` seconds. An ``error`` event ends the watch at once: the API sends one
when the job's record can't be read (``record-unreadable``, exit 9), and resuming would only
get it again.

When a hold is placed, the line is followed, once per hold, by what ended the execution (a
recovery hold's cause, with the exit code or the scheduler's words) and the commands that
answer the hold: nothing else tells the person, since a hold escalates only when overdue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import msgspec

from dispatch_cli.client import ApiClient
from dispatch_cli.errors import CliError, Unreachable
from dispatch_cli.render import history_omitted_line, hold_lines, status_line, transition_line
from dispatch_core import State, Status, Transition

__all__ = ["MISSED_NOTE", "Watcher"]

MISSED_NOTE: Final = "  (from the record: replaced before the stream sent it)"
_STATUS_DECODER: Final = msgspec.json.Decoder(Status)
_COMMITTED: Final = frozenset(
    {State.RECOVERING, State.HELD, State.SUCCEEDED, State.FAILED, State.CANCELLED}
)


def _key(status: Status) -> tuple[object, ...]:
    hold = None if status.hold is None else (status.hold.instance, status.hold.overdue)
    return (
        status.state,
        status.cause.kind,
        status.cause.detail,
        status.submission,
        status.epoch,
        status.objects,
        hold,
        status.settled,
        status.history_count,
    )


class Watcher:
    """Follow one job (see the module docstring)."""

    def __init__(
        self,
        client: ApiClient,
        job_id: str,
        *,
        emit: Callable[[str], None],
        json_lines: bool = False,
        reconnect_s: float = 120.0,
        on_status: Callable[[Status], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """Prepare to watch ``job_id``.

        Args:
            client: the API.
            job_id: the job.
            emit: where each output line goes.
            json_lines: print each Status received as one JSON line instead of text.
            reconnect_s: how long to keep resuming a lost stream before giving up.
            on_status: called with each Status received (the demo's director).
            say: where notes about the connection go (default: ``emit``).
        """
        self.client = client
        self.job_id = job_id
        self.emit = emit
        self.json_lines = json_lines
        self.reconnect_s = reconnect_s
        self.on_status = on_status
        self.say = say or emit
        self.received: list[Status] = []
        self._history_seen: int | None = None
        self._last_key: tuple[object, ...] | None = None
        self._holds_shown: set[int] = set()

    def run(self) -> Status:
        """Watch until the job settles; return its settled Status.

        Raises:
            Unreachable: the API can't be reached at first, or not again within
                ``reconnect_s`` after the stream was lost.
            ApiError: the API refused (401, 404, ...), or its stream said the job's record
                can't be read (422 ``record-unreadable``).
        """
        last_id: str | None = None
        lost_since: float | None = None
        while True:
            try:
                for message in self.client.stream(self.job_id, last_event_id=last_id):
                    if message.event == "error":
                        raise self.client.stream_error(message)
                    if message.event != "status":
                        continue
                    try:
                        status = _STATUS_DECODER.decode(message.data)
                    except msgspec.DecodeError as err:
                        raise CliError(
                            f"a Status of job {self.job_id} can't be read by this CLI: {err}"
                        ) from err
                    if message.id is not None:
                        last_id = message.id
                    if lost_since is not None:
                        self.say("(stream resumed)")
                        lost_since = None
                    self._show(status)
                    if status.settled:
                        return status
                reason = "the API ended the stream"
            except Unreachable as err:
                if not self.received:
                    raise
                reason = err.why
            now = time.monotonic()
            if lost_since is None:
                lost_since = now
                self.say(f"(stream lost: {reason}; resuming; Ctrl-C to stop watching)")
            elif now - lost_since > self.reconnect_s:
                raise Unreachable(self.client.url, f"{reason}, for {self.reconnect_s:g} s")
            time.sleep(1.0)

    def _show(self, status: Status) -> None:
        self.received.append(status)
        if self.on_status is not None:
            self.on_status(status)
        if self.json_lines:
            self.emit(msgspec.json.encode(status).decode())
            return
        history, total = status.history, status.history_count
        if self._history_seen is None:
            if status.history_omitted:
                self.emit(history_omitted_line(self.job_id, status.history_omitted, len(history)))
            earlier = history[:-1] if _is_live(status, history[-1:]) else history
            for transition in earlier:
                self.emit(transition_line(transition, note="  (earlier)"))
            self._history_seen = total
        elif total > self._history_seen:
            fresh = total - self._history_seen  # committed since the last Status shown
            new = history[-fresh:]
            if fresh > len(new):
                self.emit(history_omitted_line(self.job_id, fresh - len(new), len(history)))
            missed = new[:-1] if _is_live(status, new[-1:]) else new
            for transition in missed:
                self.emit(transition_line(transition, note=MISSED_NOTE))
            self._history_seen = total
        key = _key(status)
        if key != self._last_key:
            self.emit(status_line(status))
            self._last_key = key
        hold = status.hold
        if hold is not None and hold.instance not in self._holds_shown:
            self._holds_shown.add(hold.instance)
            for line in hold_lines(status.job_id, hold):
                self.emit(f"  {line}")


def _is_live(status: Status, last: tuple[Transition, ...]) -> bool:
    """Whether the Status itself shows the last committed transition (so it isn't missed)."""
    return (
        bool(last)
        and status.state in _COMMITTED
        and last[0].state is status.state
        and last[0].cause.kind is status.cause.kind
    )

"""How an object ended, as a cause (the table in the package docstring)."""

from __future__ import annotations

from datetime import datetime

import msgspec

from dispatch_backends import local_runner as _r
from dispatch_backends.local.files import _Meta, _signal_name, _Status
from dispatch_core.state import (
    Cause,
    CauseKind,
    Provenance,
)


def _scheduler(kind: CauseKind, detail: str, at: datetime | None = None) -> Cause:
    return Cause(kind=kind, provenance=Provenance.SCHEDULER, detail=detail, at=at)


def _ending_cause(meta: _Meta, status: _Status) -> Cause:
    """Map what the runner recorded to a cause (the table in the module docstring)."""
    at = status.ended_at
    how = "(SIGTERM)"
    if status.escalated:
        how = f"(SIGKILL after kill wait {status.kill_wait_s:g} s)"
    match status.reason:
        case _r.REASON_EXITED if status.signal is not None:
            words = f"killed by signal {status.signal} ({_signal_name(status.signal)})"
            return _scheduler(CauseKind.UNKNOWN, words, at)
        case _r.REASON_EXITED:
            code = status.exit_code
            return Cause(
                kind=CauseKind.NONE if code == 0 else CauseKind.NON_ZERO_EXIT,
                provenance=Provenance.APPLICATION,
                detail=f"exit code {code}",
                exit_code=code,
                at=at,
            )
        case _r.REASON_STOP:
            words = (
                f"stopped by dispatch {how}"
                if status.started
                else "stopped by dispatch before start"
            )
            return _with_exit_code(_scheduler(CauseKind.CANCELLED, words, at), status)
        case _r.REASON_PREEMPT:
            cause = _scheduler(CauseKind.PREEMPTED, "preempted by fault injection", at)
            return _with_exit_code(cause, status)
        case _r.REASON_TIME_LIMIT:
            words = f"time limit {meta.time_limit_s} s reached"
            return _with_exit_code(_scheduler(CauseKind.TIME_LIMIT, words, at), status)
        case _r.REASON_EMERGENCY:
            return _scheduler(CauseKind.CANCELLED, "emergency stop by dispatch (SIGKILL)", at)
        case _r.REASON_EXEC_FAILED:
            return _scheduler(CauseKind.LAUNCH_FAILED, status.detail, at)
        case _:
            return _scheduler(CauseKind.UNKNOWN, f"runner reported {status.reason!r}", at)


def _with_exit_code(cause: Cause, status: _Status) -> Cause:
    """Keep the exit code of a process that exited on its own after being asked to end."""
    if status.exit_code is None:
        return cause
    return msgspec.structs.replace(cause, exit_code=status.exit_code)

"""A BENCHMARK scheduler, not a backend for real jobs: objects are rows in memory, nothing
runs. It implements ``dispatch_backends.Backend`` (libs/dispatch_backends/protocol.py) so
that the observer and the supervisor drive it as they drive Slurm or Kubernetes, at a cost
of microseconds per call, and it can preempt every running object at once
(``bench/mass_preemption.py --scheduler synthetic``).

A started object is pending with its gate closed; opening the gate makes it running; a stop
or a preemption ends it (cause ``cancelled`` by the scheduler, or ``preempted``). Calls may
come from several threads (the bench runs the observer and the supervisor on separate event
loops): one lock guards the rows.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from datetime import UTC, datetime

import msgspec

from dispatch_backends import Snapshot
from dispatch_core import (
    Cause,
    CauseKind,
    Declarations,
    GateState,
    Launch,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
)

__all__ = ["SyntheticScheduler"]


class SyntheticScheduler:
    """BENCHMARK ONLY: a scheduler whose objects are in-memory rows (see the module
    docstring)."""

    def __init__(self, cluster: str = "synthetic", *, node_loss_window_s: float = 60.0) -> None:
        """An empty scheduler serving ``cluster``."""
        self._cluster = cluster
        self._declarations = Declarations(node_loss_window_s=node_loss_window_s)
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[ObservedObject, ...]] = {}
        """Job id -> its objects, oldest first (a tuple replaced on every change)."""
        self._job_of: dict[str, str] = {}
        """Object id -> job id."""
        self.calls = 0
        """Backend calls made so far (start, open_gate, stop, discover)."""

    @property
    def cluster(self) -> str:
        """The cluster this scheduler serves."""
        return self._cluster

    def declarations(self) -> Declarations:
        """A node-loss window and nothing native."""
        return self._declarations

    async def start(self, launch: Launch) -> ObjectRef:
        """Add a pending object with its gate closed."""
        job_id = launch.intent.job_id
        with self._lock:
            self.calls += 1
            ref = ObjectRef(cluster=self._cluster, id=f"s{len(self._job_of) + 1}")
            row = ObservedObject(
                ref=ref,
                name=launch.name,
                submission=launch.submission,
                attempt=launch.attempt,
                phase=ObjectPhase.PENDING,
                gate=GateState.CLOSED,
            )
            self._job_of[ref.id] = job_id
            self._rows[job_id] = (*self._rows.get(job_id, ()), row)
        return ref

    async def open_gate(self, ref: ObjectRef) -> None:
        """Open the gate: a pending object runs."""
        with self._lock:
            self.calls += 1
            self._change(ref, _open)

    async def stop(self, ref: ObjectRef) -> None:
        """End the object (cause ``cancelled``, said by the scheduler); an ended one stays."""
        with self._lock:
            self.calls += 1
            self._change(ref, _ended(CauseKind.CANCELLED, "stopped", datetime.now(UTC)))

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        """Every object, in one call (nothing vanishes: ended rows are kept)."""
        with self._lock:
            self.calls += 1
            objects = dict(self._rows)
        return Snapshot(cluster=self._cluster, seen_at=datetime.now(UTC), objects=objects)

    # -- for the benchmark ----------------------------------------------------------------------

    def preempt_all(self) -> int:
        """End every running object with cause ``preempted``, at once; return how many."""
        ended = _ended(CauseKind.PREEMPTED, "preempted by the benchmark", datetime.now(UTC))
        n = 0
        with self._lock:
            for job_id, rows in self._rows.items():
                if any(r.phase is ObjectPhase.RUNNING for r in rows):
                    self._rows[job_id] = tuple(
                        ended(r) if r.phase is ObjectPhase.RUNNING else r for r in rows
                    )
                    n += 1
        return n

    def running(self, submission: int) -> dict[str, ObjectRef]:
        """Job id -> its running object of ``submission``."""
        with self._lock:
            return {
                job_id: r.ref
                for job_id, rows in self._rows.items()
                for r in rows
                if r.phase is ObjectPhase.RUNNING and r.submission == submission
            }

    def _change(self, ref: ObjectRef, how: _Change) -> None:
        job_id = self._job_of.get(ref.id)
        if job_id is None or ref.cluster != self._cluster:
            return
        self._rows[job_id] = tuple(how(r) if r.ref == ref else r for r in self._rows[job_id])


class _Change:
    """How a row changes (a callable, typed)."""

    def __call__(self, row: ObservedObject) -> ObservedObject:
        raise NotImplementedError


class _Open(_Change):
    def __call__(self, row: ObservedObject) -> ObservedObject:
        if row.phase is not ObjectPhase.PENDING:
            return row
        return msgspec.structs.replace(row, phase=ObjectPhase.RUNNING, gate=GateState.OPEN)


class _Ended(_Change):
    def __init__(self, cause: Cause) -> None:
        self._cause = cause

    def __call__(self, row: ObservedObject) -> ObservedObject:
        if row.phase is ObjectPhase.ENDED:
            return row
        return msgspec.structs.replace(row, phase=ObjectPhase.ENDED, cause=self._cause)


_open: _Change = _Open()


def _ended(kind: CauseKind, detail: str, at: datetime) -> _Change:
    return _Ended(Cause(kind=kind, provenance=Provenance.SCHEDULER, detail=detail, at=at))

"""The one interface every scheduler backend implements (DESIGN.md section 7).

A backend reports what it sees of each of dispatch's objects (state, cause, executions) and
carries out the supervisor's steps on the scheduler. It never computes a job's state: that
is ``dispatch_core.project``'s job (seed 000, "Where the state comes from").

Object names are ``dj-<job id>``; the submission N and attempt a are readable from the
object (Slurm: job name and comment; Kubernetes: labels and annotations; local: its
metadata). An object named for a job whose N and a can't be read is reported with
``submission=None`` (foreign) and is never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol, runtime_checkable

import msgspec

from dispatch_core.state import Declarations, ObjectRef, ObservedObject, UtcDatetime
from dispatch_core.steps import Launch

__all__ = [
    "Backend",
    "BackendError",
    "CessationAnswer",
    "CessationSignal",
    "EmergencyStopper",
    "LaunchRefusedError",
    "LaunchUnknownError",
    "Snapshot",
    "Unreachable",
    "object_name",
]


def object_name(job_id: str) -> str:
    """The scheduler name of every object of ``job_id``: ``dj-<job id>``."""
    return f"dj-{job_id}"


class BackendError(Exception):
    """Root of the errors a backend raises.

    ``retryable`` tells the caller whether the same call may succeed later.
    """

    retryable: ClassVar[bool] = False

    def __init__(self, cluster: str, detail: str) -> None:
        super().__init__(f"cluster {cluster!r}: {detail}")
        self.cluster, self.detail = cluster, detail


class Unreachable(BackendError):
    """The scheduler could not be asked (seed 000: "A scheduler you can't reach is an
    ErrUnreachable error, never a state"). It changes no job's state."""

    retryable: ClassVar[bool] = True


class LaunchRefusedError(BackendError):
    """The scheduler refused a launch; ``detail`` holds its words verbatim (committed as
    ``LaunchRefused``)."""


class LaunchUnknownError(BackendError):
    """A launch call ended without saying whether it made an object (committed as
    ``LaunchUnknown``; the attempt stays unknown until an object turns up for it)."""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a backend shows of dispatch's objects, from one batched query.

    Attributes:
        cluster: the cluster asked.
        seen_at: when it was asked.
        objects: job id -> the objects named for that job (own and foreign).
        calls: the number of scheduler calls the query took (constant as jobs grow).
        vanished: objects the caller expected (last seen alive) that the scheduler no
            longer lists and keeps no end for (issue 15, "gone is not ended").
    """

    cluster: str
    seen_at: UtcDatetime
    objects: Mapping[str, tuple[ObservedObject, ...]]
    calls: int = 1
    vanished: tuple[ObjectRef, ...] = ()


class CessationAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A site's answer on whether an ended object's processes are gone (seed 004)."""

    ceased: bool
    detail: str = ""


@runtime_checkable
class Backend(Protocol):
    """A scheduler backend: Slurm, Kubeflow Trainer, or local process groups.

    All methods may raise :class:`Unreachable`; none changes a job's state by itself.
    """

    @property
    def cluster(self) -> str:
        """The cluster name this backend serves (part of every ObjectRef it makes)."""
        ...

    def declarations(self) -> Declarations:
        """What the backend declares: node-loss window (seconds), native actions, and
        whether it has the optional cessation signal and emergency stop."""
        ...

    async def start(self, launch: Launch) -> ObjectRef:
        """Create the object for ``launch`` with its start gate closed.

        The object is named ``launch.name`` and carries ``launch.submission`` and
        ``launch.attempt`` readably. Each execution of it gets ``DISPATCH_ATTEMPT`` (opaque,
        unique per execution), ``DISPATCH_EPOCH`` (``epoch(G, N, R)`` with R the backend's
        restart count of that execution) and the checkpoint root.

        Raises:
            LaunchRefusedError: the scheduler said no.
            LaunchUnknownError: the outcome is unknown (an object may exist).
            Unreachable: the scheduler could not be asked at all (nothing was created).
        """
        ...

    async def open_gate(self, ref: ObjectRef) -> None:
        """Open dispatch's own start gate of ``ref``; never a gate someone else holds."""
        ...

    async def stop(self, ref: ObjectRef) -> None:
        """Ask the scheduler to stop ``ref`` (the scheduler's normal stop with its kill wait).
        Stopping an object that already ended is not an error."""
        ...

    async def discover(self) -> Snapshot:
        """Return every object of dispatch's on the cluster, in one batched query (never one
        call per job)."""
        ...


@runtime_checkable
class CessationSignal(Protocol):
    """Optional: a site's own answer on whether an object's processes are gone (seed 004)."""

    async def cessation(self, ref: ObjectRef, nodes: tuple[str, ...]) -> CessationAnswer:
        """Ask whether ``ref``'s processes on ``nodes`` are gone."""
        ...


@runtime_checkable
class EmergencyStopper(Protocol):
    """Optional: kill an object at once, without the kill wait (seed 002)."""

    async def emergency_stop(self, ref: ObjectRef) -> None:
        """Kill ``ref`` and everything of it now."""
        ...


@runtime_checkable
class Closable(Protocol):
    """Optional: a backend that holds resources to release at shutdown (watch threads, API
    clients). Services call :func:`close_backend` on each backend they built themselves."""

    async def aclose(self) -> None:
        """Release the backend's resources; calling it twice is not an error."""
        ...


async def close_backend(backend: Backend) -> None:
    """Call ``backend.aclose()`` if the backend is :class:`Closable`; otherwise do nothing."""
    if isinstance(backend, Closable):
        await backend.aclose()

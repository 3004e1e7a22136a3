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

import enum
from collections.abc import Collection, Mapping
from typing import ClassVar, Final, Protocol, runtime_checkable

import msgspec

from dispatch_core.state import Declarations, ObjectRef, ObservedObject, UtcDatetime
from dispatch_core.steps import Launch

__all__ = [
    "OUTPUT_CHUNK_LIMIT",
    "Backend",
    "BackendError",
    "CessationAnswer",
    "CessationSignal",
    "EmergencyStopper",
    "LaunchRefusedError",
    "LaunchUnknownError",
    "OutputChunk",
    "OutputNotFound",
    "OutputReader",
    "OutputStream",
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
        objects: job id -> the objects named for that job (own and foreign), including each
            expected object the scheduler no longer lists live that the backend found ended
            where the scheduler keeps ends (with its real cause).
        calls: the number of scheduler calls the query took (constant as jobs grow).
        vanished: expected objects the scheduler has no word for at all: neither listed nor
            found where it keeps ends (issue 15, "gone is not ended"). Only these may be
            recorded ended ``unknown``; an object absent from a snapshot proves nothing.
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

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        """Return every object of dispatch's on the cluster, in one batched query (never one
        call per job).

        Args:
            expected: objects the caller (the observer) last saw alive on this cluster. For
                each one the scheduler no longer lists live, the backend looks it up where
                the scheduler keeps ends, in the same poll and batched (Slurm: accounting;
                local: its archive; Kubeflow: the TrainJob's last terminal condition it
                kept), and reports it as an ended object with its real cause; only one the
                scheduler has no word for is listed in ``Snapshot.vanished``. Refs of
                another cluster are ignored.

        Raises:
            Unreachable: the scheduler (or where it keeps ends) could not be asked: no
                snapshot, so nothing is ended.
        """
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


class OutputStream(enum.StrEnum):
    """Which output of an object: its standard output or its standard error."""

    STDOUT = "stdout"
    STDERR = "stderr"


OUTPUT_CHUNK_LIMIT: Final = 256 * 1024
"""The most bytes one :meth:`OutputReader.read_output` returns (a chunk travels in one NATS
message: base64 in JSON, well under nats-server's default 1 MiB payload)."""


class OutputChunk(msgspec.Struct, frozen=True, kw_only=True):
    """A bounded piece of an object's output, read from a byte offset.

    Attributes:
        data: the bytes read (at most the limit asked for); empty at the end of what exists.
        offset: the byte offset ``data`` starts at.
        size: the output's size in bytes when it was read (``offset + len(data) < size``:
            more can be read at once).
        live: whether more may still be written (the object has not ended); an ended
            object's output is complete once ``offset + len(data) == size``.
        where: where the output is, for a person (a file path, ``pod <ns>/<name>``).
    """

    data: bytes
    offset: int
    size: int
    live: bool
    where: str = ""

    @property
    def next_offset(self) -> int:
        """The offset to read from next."""
        return self.offset + len(self.data)

    @property
    def complete(self) -> bool:
        """Whether nothing more will ever come after this chunk."""
        return not self.live and self.next_offset >= self.size


class OutputNotFound(BackendError):
    """The object (or its output) is not known to the backend: never made, or forgotten."""


@runtime_checkable
class OutputReader(Protocol):
    """Optional: read an object's output (``dispatch logs``; issue 16 item 2)."""

    async def read_output(
        self, ref: ObjectRef, stream: OutputStream, offset: int, limit: int
    ) -> OutputChunk:
        """Read at most ``limit`` bytes (capped at :data:`OUTPUT_CHUNK_LIMIT`) of ``ref``'s
        ``stream`` from byte ``offset`` on.

        An output not written yet (a pending object) reads as empty and live. An offset past
        the end reads as empty at that offset.

        Raises:
            OutputNotFound: no such object, or its output is not kept where it can be read.
            Unreachable: where the output is could not be read now.
            ValueError: a negative offset or limit.
        """
        ...


async def close_backend(backend: Backend) -> None:
    """Call ``backend.aclose()`` if the backend is :class:`Closable`; otherwise do nothing."""
    if isinstance(backend, Closable):
        await backend.aclose()

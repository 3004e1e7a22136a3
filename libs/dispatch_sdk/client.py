"""The SDK's clients (see :mod:`dispatch_sdk`): :class:`Client` over the CLI's own HTTP client
(the same requests, retries and errors as ``dispatch``), :class:`AsyncClient` running it off
the event loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Final, ParamSpec, Protocol, Self, TypeVar, cast

import msgspec

from dispatch_cli.client import (
    ApiClient,
    CommandResponse,
    EscalationList,
    JobList,
    OutputResponse,
    RecordResponse,
    SubmitResponse,
    new_idempotency_key,
)
from dispatch_cli.errors import CliError, Unreachable, UsageError
from dispatch_cli.home import DEFAULT_API, default_data_dir, read_state, read_token
from dispatch_cli.jobfile import PolicyFlags, build_submission
from dispatch_core import State, Status

__all__ = ["AsyncClient", "Client"]

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
C = TypeVar("C", bound=Callable[..., object])

_STATUS: Final = msgspec.json.Decoder(Status)


def _where(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The API's address and token: the arguments, then ``DISPATCH_API``/``DISPATCH_TOKEN``,
    then the ``dispatch up`` running on this machine (its token goes only to its own API)."""
    data_dir = default_data_dir(os.environ)
    state = read_state(data_dir)
    address = url or os.environ.get("DISPATCH_API") or (state.api if state else DEFAULT_API)
    local = address.rstrip("/") in {DEFAULT_API, state.api if state else DEFAULT_API}
    secret = token or os.environ.get("DISPATCH_TOKEN") or (read_token(data_dir) if local else None)
    return address, secret


class Client:
    """dispatch's API, synchronously.

    Args:
        url: the API's base URL; default ``DISPATCH_API``, else the running ``dispatch up``,
            else ``http://127.0.0.1:8080``.
        token: the bearer token; default ``DISPATCH_TOKEN``, else the one ``dispatch up``
            keeps (sent only to its own API).
        timeout_s: seconds one request may take.

    Raises:
        UsageError: ``url`` is not an http(s) URL.
    """

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout_s: float = 30.0
    ) -> None:
        address, secret = _where(url, token)
        self._api = ApiClient(address, secret, timeout_s=timeout_s)

    @property
    def url(self) -> str:
        """The API's base URL."""
        return self._api.url

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None  # each request opens and closes its own connection

    # -- submitting and reading ---------------------------------------------------------------

    def submit(
        self,
        job: Mapping[str, Any] | str | Path,
        *,
        cluster: str | None = None,
        name: str | None = None,
        job_id: str | None = None,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResponse:
        """Submit a job: the body of ``POST /v1/jobs`` (``{"spec": ..., "policy": ...}``), or
        a job file or batch script read as ``dispatch submit`` reads it (keys checked; the job
        runs in the current directory unless its spec says otherwise).

        Args:
            job: the body, or the path of a job file or batch script.
            cluster, name, job_id, reason: as ``dispatch submit``'s options (a path only for
                ``cluster``, which a batch script needs).
            idempotency_key: reuse one to make a retried submission answer from the first
                (default: a new one).

        Raises:
            UsageError: the file can't be read or has an unknown key.
            ApiError: 400 naming the field (``field``), 401/403, 409.
            Unreachable: nothing answers.
        """
        if isinstance(job, str | Path):
            body = build_submission(
                Path(job), cluster=cluster, name=name, job_id=job_id, reason=reason,
                chdir=os.getcwd(), policy_file=None, flags=PolicyFlags(),
            )  # fmt: skip
        else:
            body = dict(job)
            for key, value in (("name", name), ("job_id", job_id), ("reason", reason)):
                if value:
                    body[key] = value
        return self._api.submit(body, key=idempotency_key or new_idempotency_key())

    def status(self, job_id: str) -> Status:
        """The job's Status (``GET /v1/jobs/{job}``). Raises ApiError 404 for no such job."""
        return self._api.status(job_id)

    def list(
        self,
        states: Sequence[State] = (),
        *,
        clusters: Sequence[str] = (),
        after: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> JobList:
        """The jobs' Status heads with their cluster, creation time and checkpoint root, by
        id (``GET /v1/jobs``): only in ``states`` and on ``clusters`` (empty: all), past job
        id ``after``, from ``offset``, at most ``limit`` (None: all); filtered and paged by
        the API, which answers the ``total`` that match and the next page's ``next_after``.
        """
        return self._api.jobs(
            [s.value for s in states],
            clusters=list(clusters),
            after=after,
            offset=offset,
            limit=limit,
        )

    def record(self, job_id: str, after: int = 0) -> RecordResponse:
        """The job's record, every event with its seq (``GET /v1/jobs/{job}/record``)."""
        return self._api.record(job_id, after)

    def escalations(
        self, job_id: str | None = None, *, delivered: bool | None = None
    ) -> EscalationList:
        """Escalations, oldest first (``GET /v1/escalations``), of one job or all."""
        return self._api.escalations(job_id=job_id, delivered=delivered)

    def watch(self, job_id: str, *, read_timeout_s: float = 60.0) -> Generator[Status, None, None]:
        """Yield the job's Status on every change (SSE ``/v1/jobs/{job}/stream``), the current
        one first, until it settles (the settled Status is the last).

        A stream lost midway is resumed from the last event seen (``Last-Event-ID``), three
        times in a row at most.

        Raises:
            Unreachable: the stream can't be opened, or is lost more than three times in a row.
            ApiError: the API refused it (401, 404), or the job's record can't be read (422
                ``record-unreadable``: the stream says so as an event and ends; resuming
                would only get it again).
        """
        last_id: str | None = None
        losses = 0
        while True:
            try:
                for message in self._api.stream(
                    job_id, last_event_id=last_id, read_timeout_s=read_timeout_s
                ):
                    if message.event == "error":
                        raise self._api.stream_error(message)
                    if message.event != "status":
                        continue
                    status = _decode_status(job_id, message.data)
                    last_id = message.id or last_id
                    losses = 0
                    yield status
                    if status.settled:
                        return
            except Unreachable:
                if last_id is None or losses >= 3:
                    raise
            losses += 1

    def logs(
        self,
        job_id: str,
        *,
        execution: int | None = None,
        stderr: bool = False,
        offset: int = 0,
        follow: bool = False,
        limit: int | None = None,
    ) -> OutputResponse:
        """An execution's output (``GET /v1/jobs/{job}/logs``): iterate the answer for its
        bytes; its ``location`` says where the output is. ``execution`` is the submission N
        (default: the latest); ``stderr`` reads the standard error; with ``follow`` the
        bytes keep coming until the execution ends (one not launched yet is waited for).
        Use it as a context manager (or ``close()`` it).

        Raises:
            Unreachable: nothing answers at the address; iterating: the answer was cut short.
            ApiError: 404 no such job or execution, 501 the cluster's backend reads no
                output, 503 its observer did not answer.
        """
        return self._api.logs(
            job_id,
            execution=execution,
            stream="stderr" if stderr else "stdout",
            offset=offset,
            follow=follow,
            limit=limit,
        )

    # -- operator commands (seed 002): each answers the job's new Status and the events -----

    def command(
        self, job_id: str, command: str, body: Mapping[str, Any], *, key: str | None = None
    ) -> CommandResponse:
        """Any operator command (``POST /v1/jobs/{job}/{command}``), with a new
        ``Idempotency-Key`` unless ``key`` is given.

        Raises:
            ApiError: 409 with the core's reason (``code``), 400, 401/403, 404.
        """
        return self._api.command(job_id, command, body, key=key or new_idempotency_key())

    def hold(self, job_id: str, reason: str, *, for_s: float | None = None) -> CommandResponse:
        """Hold the job; ``for_s``: seconds until the hold is overdue (escalated)."""
        body: dict[str, Any] = {"reason": reason}
        if for_s is not None:
            body["for_s"] = for_s
        return self.command(job_id, "hold", body)

    def release(self, job_id: str, reason: str) -> CommandResponse:
        """Release an actor's hold."""
        return self.command(job_id, "release", {"reason": reason})

    def resubmit(self, job_id: str, reason: str) -> CommandResponse:
        """Run a new submission of a job under a recovery hold."""
        return self.command(job_id, "resubmit", {"reason": reason})

    def cancel(self, job_id: str, reason: str) -> CommandResponse:
        """Cancel the job."""
        return self.command(job_id, "cancel", {"reason": reason})

    def give_up(self, job_id: str, reason: str) -> CommandResponse:
        """Fail a held job with the cause that ended it."""
        return self.command(job_id, "give-up", {"reason": reason})

    def emergency_stop(self, job_id: str, reason: str) -> CommandResponse:
        """Kill every live object of the job at once."""
        return self.command(job_id, "emergency-stop", {"reason": reason})

    def abandon(
        self,
        job_id: str,
        reason: str,
        *,
        submission: int | None = None,
        attempt: int | None = None,
        foreign: tuple[str, str] | None = None,
    ) -> CommandResponse:
        """Close an unknown launch (``submission``, optionally ``attempt``) or a foreign object
        (``foreign=(cluster, object id)``); exactly one of them."""
        if (submission is None) == (foreign is None):
            raise UsageError("abandon: give either submission= or foreign=(cluster, id)")
        target: dict[str, Any]
        if foreign is not None:
            target = {"foreign": {"cluster": foreign[0], "id": foreign[1]}}
        else:
            target = {"submission": submission}
            if attempt is not None:
                target["attempt"] = attempt
        return self.command(job_id, "abandon", {"reason": reason, "target": target})

    def supersede(
        self, job_id: str, reason: str, *, new_job_id: str | None = None, name: str | None = None
    ) -> CommandResponse:
        """Run a finished job again as a new job (``new_job_id`` on the answer)."""
        body: dict[str, Any] = {"reason": reason}
        if new_job_id:
            body["new_job_id"] = new_job_id
        if name:
            body["name"] = name
        return self.command(job_id, "supersede", body)


async def _in_threads(items: Iterator[T], close: Callable[[], None]) -> AsyncIterator[T]:
    """Yield a blocking iterator's items, each read in a worker thread (the event loop never
    blocks on the network), then ``close`` it (in a thread too), however the caller stops."""
    done = object()
    try:
        while True:
            item = await asyncio.to_thread(next, items, done)
            if item is done:
                return
            yield cast(T, item)
    finally:
        await asyncio.to_thread(close)


class _Closing(Protocol[T_co]):
    """A blocking stream of items that is closed when done (a generator, an HTTP answer)."""

    def __iter__(self) -> Iterator[T_co]: ...

    def close(self) -> None: ...


def _iterated(
    method: Callable[Concatenate[Client, P], _Closing[T]], usage: str
) -> Callable[Concatenate[AsyncClient, P], AsyncIterator[T]]:
    """``method`` of :class:`Client`, a stream, as an async iterator of :class:`AsyncClient`
    (:func:`_in_threads`)."""

    async def call(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        items = await asyncio.to_thread(method, self._sync, *args, **kwargs)
        async for item in _in_threads(iter(items), items.close):
            yield item

    return _named(call, method, f"See :meth:`Client.{method.__name__}`: {usage}.")


def _named(call: C, method: Callable[..., object], doc: str) -> C:
    """``call`` named and documented as ``AsyncClient``'s ``method``."""
    call.__name__ = method.__name__
    call.__qualname__ = f"AsyncClient.{method.__name__}"
    call.__doc__ = doc
    call.__wrapped__ = method  # type: ignore[attr-defined]  # inspect.signature: Client's
    return call


def _decode_status(job_id: str, data: str) -> Status:
    try:
        return _STATUS.decode(data)
    except msgspec.DecodeError as err:
        raise CliError(f"a Status of job {job_id} can't be read by this SDK: {err}") from err


def _in_thread(
    method: Callable[Concatenate[Client, P], T],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """``method`` of :class:`Client` as a method of :class:`AsyncClient`: awaited, run in a
    worker thread on the async client's own :class:`Client`."""

    async def call(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(method, self._sync, *args, **kwargs)

    return _named(call, method, f"See :meth:`Client.{method.__name__}`.")


class AsyncClient:
    """dispatch's API for asyncio code: :class:`Client`'s methods, awaited (each request runs
    in a worker thread, so the event loop never blocks); :meth:`watch` is an async iterator.
    Same arguments and errors as :class:`Client`."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout_s: float = 30.0
    ) -> None:
        self._sync = Client(url, token, timeout_s=timeout_s)

    @property
    def url(self) -> str:
        """The API's base URL."""
        return self._sync.url

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    # Each request runs Client's method in a worker thread (:func:`_in_thread`): the same
    # arguments (typed from Client's), the same errors.
    submit = _in_thread(Client.submit)
    status = _in_thread(Client.status)
    list = _in_thread(Client.list)
    record = _in_thread(Client.record)
    escalations = _in_thread(Client.escalations)
    command = _in_thread(Client.command)
    hold = _in_thread(Client.hold)
    release = _in_thread(Client.release)
    resubmit = _in_thread(Client.resubmit)
    cancel = _in_thread(Client.cancel)
    give_up = _in_thread(Client.give_up)
    emergency_stop = _in_thread(Client.emergency_stop)
    abandon = _in_thread(Client.abandon)
    supersede = _in_thread(Client.supersede)

    # The streams: Client's, each item read in a worker thread, closed however the loop ends.
    watch = _iterated(Client.watch, "``async for status in api.watch(job)``")
    logs = _iterated(Client.logs, "``async for data in api.logs(job, follow=True)``")

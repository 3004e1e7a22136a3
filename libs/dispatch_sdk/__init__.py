"""dispatch's Python SDK: submit jobs, read and watch them, answer escalations, from Python.

Two clients with the same methods, typed with the core's own Structs (``Status``, ``Plan``,
events) and the API's answers:

* :class:`Client`, synchronous::

      from dispatch_sdk import Client

      with Client() as api:                     # DISPATCH_API / DISPATCH_TOKEN, else `dispatch up`
          job = api.submit("examples/local-train.toml").job_id
          for status in api.watch(job):         # every Status change until it settles (SSE)
              print(status.state, status.cause.kind)
          api.supersede(job, reason="fixed the data path")

* :class:`AsyncClient`, the same with ``await`` (``async for`` for :meth:`AsyncClient.watch`).

Errors are the CLI's (:mod:`dispatch_cli.errors`): :class:`ApiError` (``status``, ``code``,
``field``; a 409's message is the core's reason), :class:`Unreachable`, :class:`UsageError`
(a job file that can't be read); each carries the CLI's ``exit_code``. Requests are retried
through tenacity (a 503 after its ``Retry-After``; a connection lost after sending, when
retrying can't record anything twice: every command carries an ``Idempotency-Key``).
"""

from dispatch_cli.client import (
    CommandResponse,
    EscalationList,
    EscalationView,
    JobList,
    JobSummary,
    OutputResponse,
    RecordResponse,
    SubmitResponse,
)
from dispatch_cli.errors import ApiError, CliError, Unreachable, UsageError
from dispatch_core import Cause, CauseKind, State, Status
from dispatch_sdk.client import AsyncClient, Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "Cause",
    "CauseKind",
    "CliError",
    "Client",
    "CommandResponse",
    "EscalationList",
    "EscalationView",
    "JobList",
    "JobSummary",
    "OutputResponse",
    "RecordResponse",
    "State",
    "Status",
    "SubmitResponse",
    "Unreachable",
    "UsageError",
]

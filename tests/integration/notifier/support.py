"""Real receivers for the notifier's tests, and helpers to write and read job records.

* :class:`Receiver`: an aiohttp server on loopback that records every POST (path, headers,
  body, the status it answered, when) and answers 500 while ``down``, for the first
  ``fail_first`` requests, or for the first ``fail_per_id`` requests of each escalation.
* :class:`SmtpSink`: an aiosmtpd SMTP server on loopback, in the test's event loop, that
  keeps every message (or answers 451 while ``down``).
* :func:`create_job`, :func:`escalate`, :func:`read_job`, :func:`delivered_events`: records
  written with the core's events through a real :class:`~dispatch_nats.RecordStore`.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

import msgspec
from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session

from dispatch_core import (
    Actor,
    ActorKind,
    Declarations,
    EscalationCommitted,
    EscalationDelivered,
    Job,
    JobCreated,
    JobEvent,
    JobSpec,
    RecoveryPolicy,
    decode_event,
    encode,
    fold,
    make_plan,
)
from dispatch_nats import ConcurrencyConflict, RecordEntry, RecordStore

__all__ = [
    "Received",
    "Receiver",
    "SmtpSink",
    "append",
    "create_job",
    "delivered_events",
    "escalate",
    "new_job_id",
    "read_job",
    "undelivered",
]

ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
SPEC = JobSpec(cluster="local", command=("python", "train.py"))
DECLARATIONS = Declarations(node_loss_window_s=60.0)


class Received(msgspec.Struct, frozen=True, kw_only=True):
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    """What the receiver answered."""
    at: float
    """``time.monotonic()`` when it arrived."""

    @property
    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.body)

    @property
    def esc_id(self) -> str:
        """The escalation id header."""
        return self.headers.get("X-Dispatch-Escalation-Id", "")

    @property
    def accepted(self) -> bool:
        """Whether it was answered 2xx."""
        return 200 <= self.status < 300


class Receiver:
    """An HTTP server on 127.0.0.1 that records every POST; see the module docstring."""

    def __init__(self) -> None:
        """Prepare; ``start`` listens."""
        self.requests: list[Received] = []
        self.down = False
        self.fail_first = 0
        self.fail_per_id = 0
        self.fail_status = 500
        self.delay_s = 0.0
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._seen: Counter[str] = Counter()

    async def start(self) -> None:
        """Listen on a free loopback port."""
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self._port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, path: str = "/hook") -> str:
        """The URL of ``path`` on this receiver."""
        return f"http://127.0.0.1:{self._port}{path}"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        esc_id = request.headers.get("X-Dispatch-Escalation-Id", "")
        self._seen[esc_id] += 1
        failing = (
            self.down
            or len(self.requests) < self.fail_first
            or self._seen[esc_id] <= self.fail_per_id
        )
        status = self.fail_status if failing else 200
        self.requests.append(
            Received(
                path=request.path,
                headers=dict(request.headers),
                body=body,
                status=status,
                at=time.monotonic(),
            )
        )
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(status=status, text="nope" if failing else "ok")

    def on(self, path: str) -> list[Received]:
        """The requests made to ``path``."""
        return [r for r in self.requests if r.path == path]

    def accepted(self, path: str | None = None) -> list[Received]:
        """The requests answered 2xx (to ``path``, if given)."""
        return [r for r in self.requests if r.accepted and (path is None or r.path == path)]

    def accepted_ids(self, path: str | None = None) -> Counter[str]:
        """How many 2xx answers each escalation id got."""
        return Counter(r.esc_id for r in self.accepted(path))


class SmtpSink:
    """An SMTP server on 127.0.0.1 (aiosmtpd) that keeps every message it accepts."""

    def __init__(self) -> None:
        """Prepare; ``start`` listens."""
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.down = False
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on a free loopback port, served by the running event loop."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: SMTP(self, hostname="sink.test", loop=loop), "127.0.0.1", 0
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        """aiosmtpd's hook: keep the message (or refuse it for now while ``down``)."""
        if self.down:
            return "451 Requested action aborted: try again later"
        content = envelope.original_content or b""
        msg = email.parser.BytesParser(policy=email.policy.default).parsebytes(content)
        assert isinstance(msg, EmailMessage)
        self.messages.append(msg)
        self.envelopes.append((envelope.mail_from or "", list(envelope.rcpt_tos)))
        return "250 OK"


def new_job_id() -> str:
    """A fresh job id."""
    return f"job-{uuid.uuid4().hex[:10]}"


async def create_job(store: RecordStore, job_id: str) -> int:
    """Begin a job's record with ``job.created``; return its seq."""
    policy = RecoveryPolicy()
    event = JobCreated(
        job_id=job_id,
        at=datetime.now(UTC),
        spec=SPEC,
        policy=policy,
        plan=make_plan(SPEC, policy, DECLARATIONS),
        declarations=DECLARATIONS,
        by=ALICE,
    )
    return await store.append(job_id, encode(event), expected_last_seq=0, msg_id=f"{job_id}:c")


async def append(store: RecordStore, event: JobEvent) -> int:
    """Append ``event`` to its job's record (after its last event, whoever wrote it: the
    notifier may be recording a delivery meanwhile); return its seq."""
    msg_id = uuid.uuid4().hex
    while True:
        last = await store.last_seq(event.job_id)
        try:
            return await store.append(
                event.job_id, encode(event), expected_last_seq=last, msg_id=msg_id
            )
        except ConcurrencyConflict:
            continue


async def escalate(store: RecordStore, job_id: str, esc_id: str, detail: str = "") -> int:
    """Commit escalation ``esc_id`` to the job's record; return its seq."""
    event = EscalationCommitted(
        job_id=job_id,
        at=datetime.now(UTC),
        id=esc_id,
        detail=detail or f"{esc_id} needs a person (job {job_id})",
    )
    return await append(store, event)


async def read_job(store: RecordStore, job_id: str) -> Job:
    """Fold the job's record."""
    entries = await store.read(job_id)
    return fold([(e.seq, decode_event(e.payload), e.writer) for e in entries], datetime.now(UTC))


async def delivered_events(
    store: RecordStore, job_id: str
) -> list[tuple[RecordEntry, EscalationDelivered]]:
    """The job's ``escalation.delivered`` events, with their entries."""
    out = []
    for entry in await store.read(job_id):
        event = decode_event(entry.payload)
        if isinstance(event, EscalationDelivered):
            out.append((entry, event))
    return out


def undelivered(job: Job) -> list[str]:
    """Ids of the job's escalations the record doesn't show delivered."""
    return [e.id for e in job.escalations if e.delivered is None]

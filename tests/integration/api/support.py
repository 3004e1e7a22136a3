"""Helpers for the API tests: a client speaking real HTTP to the API under test, and the
writes the supervisor would make (record appends, published Statuses)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from dispatch_core import (
    SUPERVISOR,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Declarations,
    ExecutionEnded,
    GateOpened,
    HoldKind,
    HoldPlaced,
    JobEvent,
    LaunchIntended,
    LaunchRecorded,
    LaunchUnknown,
    ObjectRef,
    Provenance,
    Status,
    SubmissionOpened,
    SubmissionWhy,
    encode,
)
from dispatch_nats import LatestStore, Layout, RecordStore
from services.api.operations import Operations

HUMAN_TOKEN: Final = "alice-0123456789abcdef"
OTHER_HUMAN_TOKEN: Final = "bob-0123456789abcdef"
SERVICE_TOKEN: Final = "ci-0123456789abcdef"
ALICE: Final = Actor(name="alice", kind=ActorKind.HUMAN)
BOB: Final = Actor(name="bob", kind=ActorKind.HUMAN)
CI: Final = Actor(name="ci", kind=ActorKind.SERVICE)

CLUSTERS: Final[dict[str, Declarations]] = {
    "local": Declarations(node_loss_window_s=60.0, cessation_signal=True, emergency_stop=True),
    "other": Declarations(node_loss_window_s=300.0),
}

SPEC: Final[dict[str, Any]] = {"cluster": "local", "command": ["python", "train.py"]}
HOLD_ON_PREEMPTION: Final[dict[str, Any]] = {
    "rules": [
        {"on": ["preempted"], "action": "hold", "hold_for_s": 3600},
        {"on": ["node-lost"], "action": "resubmit", "budget": 2},
    ]
}


@dataclass
class Reply:
    """An HTTP answer: status, headers, and the JSON body (None when it isn't JSON)."""

    status: int
    headers: Mapping[str, str]
    body: Any
    text: str

    @property
    def error(self) -> dict[str, Any]:
        """The ``error`` object of an error answer."""
        assert isinstance(self.body, dict), self.text
        err = self.body["error"]
        assert isinstance(err, dict)
        return err


@dataclass
class Api:
    """The API under test, reached over real HTTP, and the stores behind it."""

    url: str
    session: aiohttp.ClientSession
    app: web.Application
    ops: Operations
    registry: CollectorRegistry
    records: RecordStore
    statuses: LatestStore
    discoveries: LatestStore
    layout: Layout
    sent: list[str] = field(default_factory=list)

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = HUMAN_TOKEN,
        body: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send one request; ``body`` is sent as JSON, ``data`` as raw bytes."""
        sent: dict[str, str] = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        # aiohttp warns about large raw-bytes bodies; a stream says the same thing quietly.
        payload: bytes | io.BytesIO | None = data
        if data is not None and len(data) > 1_000_000:
            payload = io.BytesIO(data)
        async with self.session.request(method, self.url + path, data=payload, headers=sent) as r:
            text = await r.text()
            try:
                parsed = json.loads(text) if text else None
            except ValueError:
                parsed = None
            return Reply(r.status, r.headers, parsed, text)

    async def submit(self, token: str = HUMAN_TOKEN, **fields: Any) -> dict[str, Any]:
        """Submit a job (``spec`` defaults to :data:`SPEC`); assert 201 and return the body."""
        body = {"spec": SPEC, **fields}
        reply = await self.call("POST", "/v1/jobs", token=token, body=body)
        assert reply.status == 201, reply.text
        assert isinstance(reply.body, dict)
        return reply.body

    async def command(
        self,
        job_id: str,
        command: str,
        token: str = HUMAN_TOKEN,
        headers: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> Reply:
        """Give an operator command (``reason`` defaults to a sentence)."""
        body = {"reason": f"test {command}", **fields}
        return await self.call(
            "POST", f"/v1/jobs/{job_id}/{command}", token=token, body=body, headers=headers
        )

    async def events(self, job_id: str) -> list[JobEvent]:
        """The job's record, read from the store (not through the API)."""
        from dispatch_core import decode_event

        return [decode_event(e.payload) for e in await self.records.read(job_id)]

    async def append(self, job_id: str, *events: JobEvent) -> list[int]:
        """Append events to the job's record as the supervisor would (after its last seq)."""
        last = await self.records.last_seq(job_id)
        ids = [f"test-{job_id}-{last}-{i}" for i in range(len(events))]
        return await self.records.append_many(
            job_id, [encode(e) for e in events], expected_last_seq=last, msg_ids=ids
        )

    async def publish(self, status: Status) -> int:
        """Publish a Status as the supervisor does."""
        return await self.statuses.put((status.job_id,), encode(status))

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """The value of a sample of the API's registry (0 when absent)."""
        value = self.registry.get_sample_value(name, dict(labels or {}))
        return 0.0 if value is None else value


def now() -> datetime:
    """The current time (UTC)."""
    return datetime.now(UTC)


def ref(job_id: str, n: int = 1) -> ObjectRef:
    """The object of submission ``n`` on the local cluster."""
    return ObjectRef(cluster="local", id=f"{job_id}-{n}")


def launched(job_id: str) -> list[JobEvent]:
    """Submission 1 opened, launched and running (as the supervisor commits it)."""
    t = now()
    return [
        SubmissionOpened(job_id=job_id, at=t, submission=1, why=SubmissionWhy.INITIAL),
        LaunchIntended(job_id=job_id, at=t, submission=1, attempt=1),
        LaunchRecorded(job_id=job_id, at=t, submission=1, attempt=1, ref=ref(job_id)),
        GateOpened(job_id=job_id, at=t, ref=ref(job_id)),
    ]


def preempted_and_held(job_id: str) -> list[JobEvent]:
    """Submission 1 launched, preempted, and a recovery hold placed by rule 0."""
    t = now()
    cause = Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER, detail="PREEMPTED")
    return [
        *launched(job_id),
        ExecutionEnded(job_id=job_id, at=t, ref=ref(job_id), restart=0, cause=cause, submission=1),
        HoldPlaced(
            job_id=job_id,
            at=t,
            instance=1,
            kind=HoldKind.RECOVERY,
            by=SUPERVISOR,
            reason="rule 0 holds on preempted",
            deadline=t + timedelta(hours=1),
            cause=cause,
            rule=0,
        ),
    ]


def unknown_launch(job_id: str) -> list[JobEvent]:
    """Submission 1 opened and its only launch's outcome unknown (all-unknown:1)."""
    t = now()
    return [
        SubmissionOpened(job_id=job_id, at=t, submission=1, why=SubmissionWhy.INITIAL),
        LaunchIntended(job_id=job_id, at=t, submission=1, attempt=1),
        LaunchUnknown(job_id=job_id, at=t, submission=1, attempt=1, detail="timed out"),
    ]


def by_name(event: JobEvent) -> str | None:
    """The name of the actor an event records, if it records one."""
    actor = getattr(event, "by", None)
    return actor.name if isinstance(actor, Actor) else None


def builtins(obj: object) -> Any:
    """A Struct as JSON builtins (enums by name)."""
    return msgspec.to_builtins(obj)

"""The three client traps measured in the lab (shared/labs/nats-s3-lab.md), each reproduced
against a real nats-server, and the store handling it.

1. nats-py's `publish_async` never resolves its future when JetStream answers an error.
2. A retried append whose expected seq is now stale gets `wrong last sequence` (10071),
   not `duplicate`: JetStream checks the expected seq before the msg id.
3. A publish that timed out may still have been stored.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError

from dispatch_core import WriterKind
from dispatch_nats import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    Layout,
    RecordStore,
    ensure_streams,
)
from tests.integration.nats.support import Eventually, connect
from tests.servers.nats import NatsServer

pytestmark = pytest.mark.integration


# --- trap 1: publish_async hangs on a server error ------------------------------------------


async def test_trap1_publish_async_future_never_resolves_on_a_conflict(
    js: JetStreamContext, streams: Layout, nats_errors: list[Exception]
) -> None:
    """The trap itself (nats-io/nats.py#985): if this starts failing, nats-py fixed it."""
    subject = streams.record_subject("job-1", WriterKind.SUPERVISOR)
    await js.publish(subject, b"a", headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    fut = await js.publish_async(
        subject, b"b", headers={"Nats-Expected-Last-Subject-Sequence": "0"}
    )
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(fut), 1.0)
    assert not fut.done()
    fut.cancel()  # release nats-py's pending slot
    # The error went to the connection's error callback instead of the caller.
    assert any(isinstance(e, BadRequestError) and e.err_code == 10071 for e in nats_errors)


async def test_trap1_store_conflicts_resolve_promptly_under_load(
    store: RecordStore, nats_errors: list[Exception]
) -> None:
    """Many concurrent conflicting appends each raise ConcurrencyConflict: none hangs, and
    no error escapes to the connection's error callback."""
    jobs = [f"job-{i}" for i in range(200)]
    firsts = await asyncio.gather(
        *(store.append(j, b"a", expected_last_seq=0, msg_id=f"{j}:a") for j in jobs)
    )
    t0 = time.monotonic()
    results = await asyncio.gather(
        *(store.append(j, b"b", expected_last_seq=0, msg_id=f"{j}:b") for j in jobs),
        return_exceptions=True,
    )
    elapsed = time.monotonic() - t0
    assert all(isinstance(r, ConcurrencyConflict) for r in results)
    assert [r.actual for r in results if isinstance(r, ConcurrencyConflict)] == firsts
    assert elapsed < 2.0  # the ack timeout: nothing waited for a reply that never came
    assert nats_errors == []


# --- trap 2: a retry with a stale expected seq gets 10071, not duplicate ---------------------


async def test_trap2_raw_retry_gets_wrong_last_sequence(
    js: JetStreamContext, streams: Layout
) -> None:
    """The trap itself: the second try of the same append is refused as a conflict."""
    subject = streams.record_subject("job-1", WriterKind.SUPERVISOR)
    headers = {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Msg-Id": "job-1:e1"}
    await js.publish(subject, b"e1", headers=dict(headers))
    with pytest.raises(BadRequestError) as info:
        await js.publish(subject, b"e1", headers=dict(headers))
    assert info.value.err_code == 10071


async def test_trap2_store_retry_returns_the_first_tries_seq(store: RecordStore) -> None:
    first = await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1")
    # The caller never saw `first` (say its ack was lost) and retries the same append.
    assert await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1") == first
    # Another writer appends; the retry still finds the first try, not just the last event.
    other = await store.append("job-1", b"e2", expected_last_seq=first, msg_id="job-1:e2")
    assert await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1") == first
    assert [e.seq for e in await store.read("job-1")] == [first, other]


# --- trap 3: a publish that timed out may have been stored -----------------------------------


async def _paused_store(server: NatsServer, **options: float) -> tuple[NATS, RecordStore]:
    nc = await connect(server.url)
    await ensure_streams(nc)
    return nc, RecordStore(nc, writer=WriterKind.SUPERVISOR, **options)  # type: ignore[arg-type]


class _ResumeOnTimeout(logging.Handler):
    """Thaws the server when the store reports its first unknown outcome: the publish has
    then certainly timed out, whatever the machine's load did to the timers."""

    def __init__(self, server: NatsServer) -> None:
        super().__init__(logging.WARNING)
        self.server = server
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "record.append.unknown_outcome" and not self.fired:
            self.fired = True
            self.server.resume()


async def _read(nc: NATS, job_id: str) -> list[tuple[int, str | None]]:
    """Read with default timeouts: the stores under test use very short ones on purpose."""
    checker = RecordStore(nc, writer=WriterKind.SUPERVISOR)
    try:
        return [(e.seq, e.msg_id) for e in await checker.read(job_id)]
    finally:
        await checker.aclose()


async def test_trap3_timed_out_append_is_resolved_by_reading(
    private_nats_server: NatsServer,
) -> None:
    """Freeze the server (SIGSTOP) before the append, so the publish sits unread in the
    server's socket buffer and the client's ack wait (0.3 s) expires; thaw it (SIGCONT) as
    soon as the store reports the timeout. The server then stores the message whose publish
    the client gave up on.
    The store must treat the timeout as an unknown outcome: it reads the job's events after
    the expected seq, finds its msg id, and returns that seq; it must neither report a
    failure nor store the event twice.
    """
    server = private_nats_server
    nc, store = await _paused_store(server, ack_timeout_s=0.3, read_timeout_s=0.3, attempts=10)
    try:
        resumer = _ResumeOnTimeout(server)
        logging.getLogger("dispatch_nats.record").addHandler(resumer)
        server.pause()
        try:
            seq = await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1")
        finally:
            logging.getLogger("dispatch_nats.record").removeHandler(resumer)
            server.resume()
        assert resumer.fired  # the publish did time out
        assert await _read(nc, "job-1") == [(seq, "job-1:e1")]
    finally:
        await store.aclose()
        await nc.close()


async def test_trap3_unknown_outcome_is_reported_then_resolved_by_a_retry(
    private_nats_server: NatsServer, eventually: Eventually
) -> None:
    """With the server frozen through the store's only attempt, the append raises
    AppendOutcomeUnknown, yet the message is stored once the server thaws: the trap. A retry
    with the same msg id and expected seq (what a caller does with a retryable error)
    returns the stored seq instead of a conflict, even after another writer appended.
    """
    server = private_nats_server
    nc, store = await _paused_store(server, ack_timeout_s=0.3, read_timeout_s=0.3, attempts=1)
    try:
        server.pause()
        with pytest.raises(AppendOutcomeUnknown) as info:
            await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1")
        assert info.value.retryable
        server.resume()

        async def stored() -> None:
            assert [m for _, m in await _read(nc, "job-1")] == ["job-1:e1"]

        await eventually(stored)  # it was stored although the publish "failed"
        [(landed, _)] = await _read(nc, "job-1")
        patient = RecordStore(nc, writer=WriterKind.SUPERVISOR)
        await patient.append("job-1", b"e2", expected_last_seq=landed, msg_id="job-1:e2")
        retry = await patient.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1")
        await patient.aclose()
        assert retry == landed
        assert len(await _read(nc, "job-1")) == 2
    finally:
        await store.aclose()
        await nc.close()


async def test_trap3_a_retry_never_stores_twice_when_the_first_lands_late(
    private_nats_server: NatsServer,
) -> None:
    """Thaw the server only after the store has re-sent the append several times: every
    copy reaches JetStream, and exactly one is stored (msg id and expected seq both guard)."""
    server = private_nats_server
    nc, store = await _paused_store(server, ack_timeout_s=0.2, read_timeout_s=0.2, attempts=20)
    try:
        server.pause()
        asyncio.get_running_loop().call_later(1.2, server.resume)
        seq = await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1")
        assert await _read(nc, "job-1") == [(seq, "job-1:e1")]
    finally:
        await store.aclose()
        await nc.close()


async def test_store_keeps_working_across_a_server_restart(
    private_nats_server: NatsServer, eventually: Eventually
) -> None:
    server = private_nats_server
    nc, store = await _paused_store(server, ack_timeout_s=1.0, read_timeout_s=1.0, attempts=5)
    try:
        s1 = await store.append("job-1", b"e1", expected_last_seq=0, msg_id="job-1:e1")
        server.restart()

        async def appended() -> None:
            try:
                await store.append("job-1", b"e2", expected_last_seq=s1, msg_id="job-1:e2")
            except Exception as err:
                raise AssertionError(repr(err)) from err

        await eventually(appended, timeout_s=10)
        assert [e.payload for e in await store.read("job-1")] == [b"e1", b"e2"]
    finally:
        await store.aclose()
        await nc.close()


async def test_trap3_timed_out_batch_is_resolved_by_reading(
    private_nats_server: NatsServer,
) -> None:
    """The same freeze for an atomic batch: all its events are found and returned once."""
    server = private_nats_server
    nc, store = await _paused_store(server, ack_timeout_s=0.3, read_timeout_s=0.3, attempts=10)
    try:
        resumer = _ResumeOnTimeout(server)
        logging.getLogger("dispatch_nats.record").addHandler(resumer)
        server.pause()
        try:
            seqs = await store.append_many(
                "job-1", [b"a", b"b", b"c"], expected_last_seq=0, msg_ids=["m1", "m2", "m3"]
            )
        finally:
            logging.getLogger("dispatch_nats.record").removeHandler(resumer)
            server.resume()
        assert resumer.fired  # the commit did time out
        assert await _read(nc, "job-1") == list(zip(seqs, ["m1", "m2", "m3"], strict=True))
    finally:
        await store.aclose()
        await nc.close()

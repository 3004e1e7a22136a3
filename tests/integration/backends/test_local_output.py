"""The local backend's output capability (``OutputReader``; ``dispatch logs``): an object's
stdout/stderr read from a byte offset, bounded, live until the object ended, and answered
over NATS by the observer's ``OutputServer`` to the API's ``OutputClient``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from dispatch_backends import (
    OUTPUT_CHUNK_LIMIT,
    OutputChunk,
    OutputNotFound,
    OutputReader,
    OutputStream,
)
from dispatch_core import encode
from dispatch_core.state import JobSpec, ObjectRef
from dispatch_nats import Layout
from services.api.errors import NotFound, StoreDown
from services.api.output import OutputClient, OutputUnsupported
from services.common.output import OutputErrorCode, OutputRequest
from services.observer.output import OutputServer
from tests.contract.backend_contract import make_launch, new_job_id
from tests.integration.backends.local_harness import CLUSTER, LocalHarness, shell
from tests.integration.nats.support import connect
from tests.servers.nats import NatsServer
from tests.util import assert_eventually

pytestmark = pytest.mark.integration

OUT, ERR = OutputStream.STDOUT, OutputStream.STDERR


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[LocalHarness]:
    harness = LocalHarness(tmp_path / "data", kill_wait_s=0.5)
    try:
        yield harness
    finally:
        await harness.cleanup()


async def _run(harness: LocalHarness, script: str, *, open_gate: bool = True) -> ObjectRef:
    spec = JobSpec(cluster=CLUSTER, command=shell(script))
    ref = await harness.backend.start(make_launch(new_job_id("out"), spec))
    harness.started.append(ref)
    if open_gate:
        await harness.backend.open_gate(ref)
    return ref


async def _read_all(reader: OutputReader, ref: ObjectRef, stream: OutputStream) -> OutputChunk:
    return await reader.read_output(ref, stream, 0, OUTPUT_CHUNK_LIMIT)


async def test_output_is_read_from_an_offset_bounded_and_live_until_the_object_ends(
    harness: LocalHarness, tmp_path: Path
) -> None:
    backend = harness.backend
    assert isinstance(backend, OutputReader)
    flag = tmp_path / "go"
    ref = await _run(
        harness,
        f"echo first; echo oops >&2; while [ ! -e {flag} ]; do sleep 0.05; done; echo second",
    )

    async def printed_first() -> None:
        chunk = await _read_all(backend, ref, OUT)
        assert chunk.data == b"first\n"
        assert chunk.live
        assert not chunk.complete
        assert chunk.size == 6
        assert chunk.next_offset == 6
        assert chunk.where == str(backend.object_dir(ref) / "stdout")

    await assert_eventually(printed_first, timeout_s=30)
    part = await backend.read_output(ref, OUT, 2, 3)  # bounded, from an offset
    assert (part.data, part.offset, part.next_offset, part.size) == (b"rst", 2, 5, 6)
    past = await backend.read_output(ref, OUT, 100, 10)  # past the end: empty there
    assert (past.data, past.offset, past.live) == (b"", 100, True)
    assert (await _read_all(backend, ref, ERR)).data == b"oops\n"
    flag.touch()

    async def ended() -> None:
        rest = await backend.read_output(ref, OUT, 6, OUTPUT_CHUNK_LIMIT)
        assert rest.data == b"second\n"
        assert not rest.live
        assert rest.complete

    await assert_eventually(ended, timeout_s=30)


async def test_a_read_is_capped_at_the_chunk_limit(harness: LocalHarness) -> None:
    backend = harness.backend
    total = OUTPUT_CHUNK_LIMIT + 1000
    ref = await _run(harness, f"head -c {total} /dev/zero")

    async def written() -> None:
        assert not (await backend.read_output(ref, OUT, 0, 0)).live

    await assert_eventually(written, timeout_s=30)
    first = await backend.read_output(ref, OUT, 0, 10 * OUTPUT_CHUNK_LIMIT)
    assert len(first.data) == OUTPUT_CHUNK_LIMIT
    assert first.size == total
    assert not first.complete  # ended, but more is there
    second = await backend.read_output(ref, OUT, first.next_offset, 10 * OUTPUT_CHUNK_LIMIT)
    assert len(second.data) == 1000
    assert second.complete


async def test_a_pending_object_reads_empty_and_live(harness: LocalHarness) -> None:
    ref = await _run(harness, "echo never yet", open_gate=False)
    chunk = await _read_all(harness.backend, ref, OUT)
    assert (chunk.data, chunk.size, chunk.live) == (b"", 0, True)


async def test_an_archived_object_is_still_read_and_ended(harness: LocalHarness) -> None:
    backend = harness.backend
    ref = await _run(harness, "echo kept")

    async def ended() -> None:
        assert not (await _read_all(backend, ref, OUT)).live

    await assert_eventually(ended, timeout_s=30)
    await harness.forget(ref)
    chunk = await _read_all(backend, ref, OUT)
    assert chunk.data == b"kept\n"
    assert chunk.complete
    assert "/archive/" in chunk.where


async def test_an_output_file_deleted_after_the_command_started_is_not_found(
    harness: LocalHarness,
) -> None:
    """A deleted output file is lost output, not an object that printed nothing (read as
    empty, ``dispatch logs`` printed nothing and exited 0); a file the runner has not made
    yet still reads as empty."""
    backend = harness.backend
    ref = await _run(harness, "echo gone")

    async def ended() -> None:
        assert not (await _read_all(backend, ref, OUT)).live

    await assert_eventually(ended, timeout_s=30)
    stdout = backend.object_dir(ref) / "stdout"
    stdout.unlink()
    with pytest.raises(OutputNotFound, match=f"{stdout} is gone"):
        await _read_all(backend, ref, OUT)
    assert (await _read_all(backend, ref, ERR)).data == b""  # still there, empty
    pending = await _run(harness, "echo never yet", open_gate=False)
    assert (await _read_all(backend, pending, OUT)).data == b""


async def test_unknown_objects_and_bad_windows_are_refused(harness: LocalHarness) -> None:
    backend = harness.backend
    for ref in (ObjectRef(cluster=CLUSTER, id="999"), ObjectRef(cluster="other", id="1")):
        with pytest.raises(OutputNotFound):
            await backend.read_output(ref, OUT, 0, 10)
    ref = await _run(harness, "true", open_gate=False)
    with pytest.raises(ValueError, match="offset"):
        await backend.read_output(ref, OUT, -1, 10)
    with pytest.raises(ValueError, match="limit"):
        await backend.read_output(ref, OUT, 0, -1)


# -- over NATS: the observer's OutputServer answers the API's OutputClient ------------------


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats-output") / "store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    conn = await connect(nats_server.url)
    yield conn
    await conn.close()


class _NoOutput:
    """A backend that can't read output (not an OutputReader)."""

    cluster = CLUSTER


async def test_the_observer_answers_output_requests_over_nats(
    harness: LocalHarness, nc: NATS
) -> None:
    layout = Layout(namespace=f"t{new_job_id('').replace('-', '')}")
    client = OutputClient(nc, layout=layout, timeout_s=10, poll_s=0.05)
    ref = await _run(harness, "for i in 1 2 3; do echo line $i; sleep 0.2; done")
    with pytest.raises(StoreDown, match="no observer"):
        await client.read(ref, OUT, 0)
    server = OutputServer(harness.backend, nc, layout=layout)
    await server.start()
    try:
        followed = b"".join(
            [c.data async for c in client.chunks(ref, OUT, 0, follow=True)]
        )  # until the object ended
        assert followed == b"line 1\nline 2\nline 3\n"
        assert (await client.read(ref, OUT, 7, 6)).data == b"line 2"
        bounded = [c.data async for c in client.chunks(ref, OUT, 0, follow=False, limit=9)]
        assert b"".join(bounded) == b"line 1\nli"
        with pytest.raises(NotFound):
            await client.read(ObjectRef(cluster=CLUSTER, id="999"), OUT, 0)
        with pytest.raises(StoreDown, match="no observer"):  # nobody answers for it
            await client.read(ObjectRef(cluster="elsewhere", id="1"), OUT, 0)
        asked = OutputRequest(
            ref=ObjectRef(cluster="elsewhere", id="1"), stream=OUT, offset=0, limit=1
        )
        wrong = await server.answer(encode(asked))  # a request for another cluster's object
        assert wrong.error is OutputErrorCode.INVALID
        assert wrong.chunk is None
        assert (await server.answer(b"{")).error is OutputErrorCode.INVALID
    finally:
        await server.aclose()
    other = OutputServer(_NoOutput(), nc, layout=layout)  # type: ignore[arg-type]
    await other.start()
    try:
        with pytest.raises(OutputUnsupported):
            await client.read(ref, OUT, 0)
    finally:
        await other.aclose()

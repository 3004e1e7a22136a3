"""The contract module against a real nats-server: names, validation, stream creation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext
from nats.js.errors import APIError

from dispatch_core import WriterKind
from dispatch_nats import (
    CONTRACT_VERSION,
    ContractVersionMismatch,
    InvalidName,
    Layout,
    StreamConfigConflict,
    discovery_subject,
    ensure_streams,
    observer_subject,
    record_subject,
    status_subject,
)
from dispatch_nats.contract import DISCOVERY_STREAM, RECORD_STREAM, STATUS_STREAM

pytestmark = pytest.mark.integration


API, SUP, NOTIFIER = WriterKind.API, WriterKind.SUPERVISOR, WriterKind.NOTIFIER


def test_default_names_are_the_contract() -> None:
    assert CONTRACT_VERSION == 2
    assert record_subject("job-1", API) == "dispatch.record.job-1.api"
    assert record_subject("job-1", SUP) == "dispatch.record.job-1.supervisor"
    assert record_subject("job-1", NOTIFIER) == "dispatch.record.job-1.notifier"
    assert discovery_subject("c1", "job-1") == "dispatch.discovery.c1.job-1"
    assert status_subject("job-1") == "dispatch.status.job-1"
    assert observer_subject("gpu-a") == "dispatch.observer.gpu-a"
    layout = Layout()
    assert (
        (layout.record_stream, layout.discovery_stream, layout.status_stream)
        == (
            RECORD_STREAM,
            DISCOVERY_STREAM,
            STATUS_STREAM,
        )
        == ("DISPATCH_RECORD", "DISPATCH_DISCOVERY", "DISPATCH_STATUS")
    )
    assert layout.record_job_filter("job-1") == "dispatch.record.job-1.*"
    assert layout.record_filter == "dispatch.record.*.*"
    assert layout.record_writer_filter(NOTIFIER) == "dispatch.record.*.notifier"
    assert layout.parse_record_subject("dispatch.record.job-1.api") == ("job-1", API)
    assert layout.job_id_from_record_subject("dispatch.record.job-1.api") == "job-1"


@pytest.mark.parametrize(
    "bad",
    [
        "dispatch.record.job-1",  # a v1 subject: no writer
        "dispatch.record.job-1.observer",
        "dispatch.record.job-1.API",
        "dispatch.record.Job.api",
        "dispatch.status.job-1",
        "dispatch.record.job-1.api.x",
    ],
)
def test_a_record_subject_names_a_job_and_a_writer_kind(bad: str) -> None:
    with pytest.raises(InvalidName):
        Layout().parse_record_subject(bad)


def test_writer_filters_name_only_writer_kinds() -> None:
    with pytest.raises(InvalidName, match="writer kind"):
        Layout().record_writer_filter("observer")  # type: ignore[arg-type]
    with pytest.raises(InvalidName, match="writer kind"):
        Layout().record_subject("job-1", "*")  # type: ignore[arg-type]


def test_namespace_prefixes_every_name() -> None:
    layout = Layout(namespace="t-1")
    assert layout.record_subject("j", SUP) == "t-1.dispatch.record.j.supervisor"
    assert layout.record_filter == "t-1.dispatch.record.*.*"
    assert layout.record_stream == "T_1_DISPATCH_RECORD"
    assert layout.observer_subject("c") == "t-1.dispatch.observer.c"


@pytest.mark.parametrize(
    "bad", ["", "Job-1", "job.1", "job 1", "job*", "job>", "jób", "job_1", "a\nb", "job-1."]
)
def test_bad_job_ids_are_refused_by_name(bad: str) -> None:
    with pytest.raises(InvalidName) as info:
        record_subject(bad, API)
    assert repr(bad) in str(info.value)
    assert "job id" in str(info.value)
    with pytest.raises(InvalidName, match="cluster name"):
        discovery_subject(bad, "job-1")
    with pytest.raises(InvalidName, match="job id"):
        status_subject(bad)
    with pytest.raises(InvalidName, match="cluster name"):
        observer_subject(bad)
    with pytest.raises(InvalidName, match="namespace"):
        Layout(namespace=bad or ".")


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40))
def test_every_token_of_the_allowed_alphabet_round_trips(job_id: str) -> None:
    for writer in WriterKind:
        subject = record_subject(job_id, writer)
        assert subject.count(".") == 3
        assert Layout().parse_record_subject(subject) == (job_id, writer)


@given(
    st.text(min_size=1, max_size=20).filter(
        lambda s: not set(s) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    )
)
def test_any_other_character_is_refused(job_id: str) -> None:
    with pytest.raises(InvalidName):
        record_subject(job_id, API)


async def test_streams_are_created_as_the_contract_says(
    js: JetStreamContext, streams: Layout
) -> None:
    record = (await js.stream_info(streams.record_stream)).config
    assert record.subjects == [f"{streams.root}.record.*.*"]
    assert record.deny_delete
    assert record.deny_purge
    assert record.allow_direct
    assert record.max_msgs_per_subject == -1
    assert record.metadata is not None
    assert record.metadata["dispatch.contract"] == str(CONTRACT_VERSION)
    for name in (streams.discovery_stream, streams.status_stream):
        config = (await js.stream_info(name)).config
        assert config.max_msgs_per_subject == 1
        assert config.allow_direct
    assert (await js.stream_info(streams.discovery_stream)).config.subjects == [
        f"{streams.root}.discovery.*.*"
    ]


async def test_ensure_streams_is_idempotent(
    nc: NATS, js: JetStreamContext, streams: Layout
) -> None:
    await js.publish(streams.record_subject("job-1", API), b"e1")
    await ensure_streams(nc, layout=streams)
    await ensure_streams(nc, layout=streams)
    info = await js.stream_info(streams.record_stream)
    assert info.state.messages == 1  # nothing was re-created


async def test_operator_tuning_outside_the_contract_is_accepted(
    nc: NATS, js: JetStreamContext, streams: Layout
) -> None:
    config = (await js.stream_info(streams.status_stream)).config
    config.max_bytes = 10_000_000
    await js.update_stream(config)
    await ensure_streams(nc, layout=streams)


async def test_conflicting_existing_stream_is_reported_not_changed(
    nc: NATS, js: JetStreamContext, streams: Layout
) -> None:
    config = (await js.stream_info(streams.status_stream)).config
    config.max_msgs_per_subject = 5
    await js.update_stream(config)
    with pytest.raises(StreamConfigConflict) as info:
        await ensure_streams(nc, layout=streams)
    assert info.value.stream == streams.status_stream
    assert "max_msgs_per_subject: stream has 5, contract wants 1" in str(info.value)
    assert (await js.stream_info(streams.status_stream)).config.max_msgs_per_subject == 5


async def test_replica_mismatch_is_a_conflict(nc: NATS, streams: Layout) -> None:
    # A single server can't host R3, so asking for 3 over existing R1 streams is reported
    # as a config conflict before anything is attempted.
    with pytest.raises(StreamConfigConflict, match="num_replicas: stream has 1, contract wants 3"):
        await ensure_streams(nc, 3, layout=streams)


async def test_a_stream_of_another_contract_version_is_a_conflict(
    nc: NATS, js: JetStreamContext, streams: Layout
) -> None:
    config = (await js.stream_info(streams.discovery_stream)).config
    config.metadata = {"dispatch.contract": "999"}
    await js.update_stream(config)
    with pytest.raises(ContractVersionMismatch, match=r"made for NATS contract v999"):
        await ensure_streams(nc, layout=streams)


async def test_a_v1_record_stream_is_refused_saying_what_to_do(
    nc: NATS, js: JetStreamContext, layout: Layout
) -> None:
    """A record stream made by a v1 build (one subject per job, no writer kind) is never used
    nor changed: ensure_streams says why and what to do."""
    v1 = {**layout.stream_configs()[0], "subjects": [f"{layout.root}.record.*"]}
    v1["metadata"] = {"dispatch.contract": "1"}
    await js.add_stream(
        name=v1["name"],
        subjects=v1["subjects"],
        metadata=v1["metadata"],
        deny_delete=True,
        deny_purge=True,
        allow_direct=True,
    )
    try:
        with pytest.raises(ContractVersionMismatch) as info:
            await ensure_streams(nc, layout=layout)
        message = str(info.value)
        assert info.value.stream == layout.record_stream
        assert "made for NATS contract v1; this build speaks v2" in message
        assert "dispatch.record.<job>.<writer>" in message
        assert "delete the v1 streams" in message
        config = (await js.stream_info(layout.record_stream)).config
        assert config.subjects == [f"{layout.root}.record.*"]  # left as it was
    finally:
        await js.delete_stream(layout.record_stream)


async def test_foreign_stream_holding_the_subjects_is_a_conflict(
    nc: NATS, js: JetStreamContext, layout: Layout
) -> None:
    await js.add_stream(name=f"FOREIGN_{layout.namespace.upper()}", subjects=[f"{layout.root}.>"])
    try:
        with pytest.raises(StreamConfigConflict, match="another stream already holds subjects"):
            await ensure_streams(nc, layout=layout)
    finally:
        await js.delete_stream(f"FOREIGN_{layout.namespace.upper()}")


async def test_record_stream_refuses_delete_and_purge(
    js: JetStreamContext, streams: Layout
) -> None:
    subject = streams.record_subject("job-1", API)
    ack = await js.publish(subject, b"e1")
    with pytest.raises(APIError) as deleted:
        await js.delete_msg(streams.record_stream, ack.seq)
    assert deleted.value.err_code == 10057
    with pytest.raises(APIError) as purged:
        await js.purge_stream(streams.record_stream)
    assert purged.value.err_code == 10110
    with pytest.raises(APIError):
        await js.purge_stream(streams.record_stream, subject=subject)
    assert (await js.stream_info(streams.record_stream)).state.messages == 1

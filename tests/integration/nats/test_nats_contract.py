"""The contract module against a real nats-server: names, validation, stream creation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext
from nats.js.errors import APIError

from dispatch_nats import (
    CONTRACT_VERSION,
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


def test_default_names_are_the_contract() -> None:
    assert record_subject("job-1") == "dispatch.record.job-1"
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
    assert layout.job_id_from_record_subject("dispatch.record.job-1") == "job-1"


def test_namespace_prefixes_every_name() -> None:
    layout = Layout(namespace="t-1")
    assert layout.record_subject("j") == "t-1.dispatch.record.j"
    assert layout.record_stream == "T_1_DISPATCH_RECORD"
    assert layout.observer_subject("c") == "t-1.dispatch.observer.c"


@pytest.mark.parametrize(
    "bad", ["", "Job-1", "job.1", "job 1", "job*", "job>", "jób", "job_1", "a\nb", "job-1."]
)
def test_bad_job_ids_are_refused_by_name(bad: str) -> None:
    with pytest.raises(InvalidName) as info:
        record_subject(bad)
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
    subject = record_subject(job_id)
    assert subject.count(".") == 2
    assert Layout().job_id_from_record_subject(subject) == job_id


@given(
    st.text(min_size=1, max_size=20).filter(
        lambda s: not set(s) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    )
)
def test_any_other_character_is_refused(job_id: str) -> None:
    with pytest.raises(InvalidName):
        record_subject(job_id)


async def test_streams_are_created_as_the_contract_says(
    js: JetStreamContext, streams: Layout
) -> None:
    record = (await js.stream_info(streams.record_stream)).config
    assert record.subjects == [f"{streams.root}.record.*"]
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
    await js.publish(streams.record_subject("job-1"), b"e1")
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
    with pytest.raises(StreamConfigConflict, match=r"dispatch\.contract: stream has '999'"):
        await ensure_streams(nc, layout=streams)


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
    subject = streams.record_subject("job-1")
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

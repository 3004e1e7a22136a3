"""Poison contained (issue 10, item 4): an event that can't be read is that job's problem,
never another job's. A supervisor (the real service, as a process) leaves a job whose record
holds an undecodable event, or an event its writer may not write, alone: it does not crash,
does not loop on it, counts it and logs the job and seq at ERROR, and supervises another job
to its end meanwhile."""

from __future__ import annotations

import json
import re
import socket
from datetime import UTC, datetime

import aiohttp
import pytest

from dispatch_core import (
    Actor,
    ActorKind,
    CancelRequested,
    ObjectPhase,
    RecoveryPolicy,
    State,
    Status,
    WriterKind,
    encode,
)
from dispatch_nats import RecordStore
from tests.e2e.runtime.harness import Runtime, Subprocess, shell, until_flag
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _metric(port: int, name: str, label: str) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as reply,
    ):
        text = await reply.text()
    match = re.search(rf'^{name}\{{why="{label}"\}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _poison_lines(proc: Subprocess, job_id: str) -> list[dict[str, object]]:
    out = []
    for line in proc.log_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "supervisor.pass_poison" and entry.get("job_id") == job_id:
            out.append(entry)
    return out


async def _poison(rt: Runtime, job_id: str, how: str) -> int:
    """Make the job's record unreadable; return the seq of the event at fault."""
    if how == "undecodable":
        # A privileged raw connection: a payload no build of dispatch wrote, on the API's
        # subject (the supervisor never wakes on its own subject, so poison there is found
        # at the job's next pass, not at once).
        subject = rt.layout.record_subject(job_id, WriterKind.API)
        ack = await rt.nc.jetstream().publish(subject, b'{"type": "no.such.event"}')
        return ack.seq
    if how == "no-writer-kind":
        # The stream takes dispatch.record.*.*: a raw publish may name no writer kind at all.
        # No writer's subject wakes the supervisor for it, so it is found at the job's next
        # pass: here a pass request on the work stream, as a deadline publishes it.
        subject = f"{rt.layout.root}.record.{job_id}.observer"
        seq = (await rt.nc.jetstream().publish(subject, b"{}")).seq
        await rt.nc.jetstream().publish(rt.layout.work_subject(job_id), b"")
        return seq
    # A notifier-kind writer appends an operator's command (its identity may publish only
    # its own subject, but not decide what a person decided).
    notifier = RecordStore(rt.nc, writer=WriterKind.NOTIFIER, layout=rt.layout)
    try:
        forged = CancelRequested(
            job_id=job_id,
            at=datetime.now(UTC),
            by=Actor(name="alice", kind=ActorKind.HUMAN),
            reason="forged by a notifier",
        )
        last = await notifier.last_seq(job_id)
        return await notifier.append(
            job_id, encode(forged), expected_last_seq=last, msg_id=f"forged-{job_id}"
        )
    finally:
        await notifier.aclose()


@pytest.mark.parametrize(
    ("how", "why"),
    [("undecodable", "undecodable"), ("refused-writer", "writer"), ("no-writer-kind", "malformed")],
)
async def test_a_poisoned_job_is_left_alone_and_another_runs_to_its_end(
    runtime: Runtime, how: str, why: str
) -> None:
    rt = runtime
    await rt.observer()
    port = _free_port()
    supervisor = await rt.supervisor_process(http_port=str(port))

    await rt.submit("poisoned", rt.spec(until_flag()), RecoveryPolicy())

    def running(status: Status) -> None:
        assert status.state is State.RUNNING, status

    await rt.wait_status("poisoned", running, timeout_s=60)
    seq = await _poison(rt, "poisoned", how)

    def left_alone() -> None:
        lines = _poison_lines(supervisor, "poisoned")
        assert lines, supervisor.log_tail()
        assert lines[0]["level"] == "error", lines[0]
        assert lines[0]["seq"] == seq, lines[0]
        assert f"event seq {seq}" in str(lines[0]["error"]), lines[0]

    await assert_eventually(left_alone, timeout_s=60)
    assert await _metric(port, "dispatch_supervisor_unreadable_records_total", why) >= 1

    # Another job is supervised to its end meanwhile.
    await rt.submit("healthy", rt.spec(shell("exit 0")), RecoveryPolicy())

    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status
        assert status.settled, status

    await rt.wait_status("healthy", succeeded, timeout_s=90)
    assert supervisor.returncode is None, supervisor.log_tail()

    # Left alone: its object was never stopped (a forged cancel is not carried out), and
    # the job was not passed again and again while the other ran (its work is terminated,
    # not redelivered; no Status, so no deadline wakes it): a hot loop would have passed it
    # hundreds of times in those seconds.
    (obj,) = (await rt.objects())["poisoned"]
    assert obj.phase is ObjectPhase.RUNNING
    assert len(_poison_lines(supervisor, "poisoned")) <= 10, supervisor.log_tail()

"""The observer on a real nats-server and the local backend (docs/runtime.md, "Observer"):
a Discovery per job only when its objects change, an empty one when they vanish, heartbeats
saying whether the scheduler is reachable, and a restart that publishes nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from dispatch_core import ObjectPhase, ObjectRef
from services.observer.heartbeat import Heartbeat, decode_heartbeat
from tests.contract.backend_contract import make_launch
from tests.e2e.runtime.conftest import MakeRuntime
from tests.e2e.runtime.harness import CLUSTER, Runtime, until_flag
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@asynccontextmanager
async def heartbeats(rt: Runtime) -> AsyncIterator[list[Heartbeat]]:
    beats: list[Heartbeat] = []

    async def on_msg(msg: object) -> None:
        beats.append(decode_heartbeat(msg.data))  # type: ignore[attr-defined]

    sub = await rt.nc.subscribe(rt.layout.observer_subject(CLUSTER), cb=on_msg)
    try:
        yield beats
    finally:
        await sub.unsubscribe()


async def _discovery_seqs(rt: Runtime) -> dict[str, int]:
    entries = await rt.discoveries.get_all((CLUSTER,))
    return {e.key[-1]: e.seq for e in entries}


async def _start_object(rt: Runtime, job_id: str) -> ObjectRef:
    ref = await rt.backend.start(make_launch(job_id, rt.spec(until_flag())))
    await rt.backend.open_gate(ref)
    return ref


async def test_unreachable_scheduler_shows_on_the_heartbeat_and_changes_nothing(
    runtime: Runtime,
) -> None:
    rt = runtime
    async with heartbeats(rt) as beats:
        await rt.observer()
        ref = await _start_object(rt, "hb")

        async def running() -> None:
            discovery = await rt.discovery("hb")
            assert discovery is not None
            assert [o.phase for o in discovery.objects] == [ObjectPhase.RUNNING]

        await assert_eventually(running, timeout_s=30)
        assert beats
        assert beats[-1].reachable
        before = await _discovery_seqs(rt)
        await asyncio.to_thread(rt.backend.faults.set_unreachable, True)
        try:
            await rt.preempt(ref)  # the fault injection itself works; discover doesn't

            def unreachable() -> None:
                assert beats
                assert not beats[-1].reachable, beats[-1]
                assert "unreachable" in beats[-1].error

            await assert_eventually(unreachable, timeout_s=30)
            n = len(beats)
            await assert_eventually(lambda: _at_least(beats, n + 3), timeout_s=30)
            assert await _discovery_seqs(rt) == before
        finally:
            await asyncio.to_thread(rt.backend.faults.set_unreachable, False)

        async def ended() -> None:
            discovery = await rt.discovery("hb")
            assert discovery is not None
            assert [o.phase for o in discovery.objects] == [ObjectPhase.ENDED]

        await assert_eventually(ended, timeout_s=30)
        assert beats[-1].reachable
        assert beats[-1].jobs == 1


def _at_least(beats: list[Heartbeat], n: int) -> None:
    assert len(beats) >= n, f"{len(beats)} heartbeats, waiting for {n}"


async def test_a_forgotten_ended_object_keeps_its_discovery_and_a_restart_repeats_nothing(
    make_runtime: MakeRuntime,
) -> None:
    """An object last shown ended that the backend then forgets (its archive time passed)
    keeps its ended Discovery as the latest: a supervisor that was down meanwhile still
    reads how it ended (issue 15, "gone is not ended")."""
    rt = await make_runtime(retain_ended_s=1.0)
    async with heartbeats(rt) as beats:
        observer = await rt.observer()
        ref = await _start_object(rt, "gone")
        await _start_object(rt, "stays")

        async def seen() -> None:
            assert set(await _discovery_seqs(rt)) == {"gone", "stays"}

        await assert_eventually(seen, timeout_s=30)
        await rt.backend.stop(ref)

        async def ended() -> None:
            discovery = await rt.discovery("gone")
            assert discovery is not None
            assert [o.phase for o in discovery.objects] == [ObjectPhase.ENDED], discovery

        await assert_eventually(ended, timeout_s=30)

        async def forgotten() -> None:
            assert "gone" not in await rt.objects()

        await assert_eventually(forgotten, timeout_s=30)
        polled = len(beats) + 2
        await assert_eventually(lambda: _at_least(beats, polled), timeout_s=30)
        await ended()
        await observer.stop()
        before = await _discovery_seqs(rt)
        await observer.start()
        n = len(beats)
        await assert_eventually(lambda: _at_least(beats, n + 3), timeout_s=30)
        assert await _discovery_seqs(rt) == before

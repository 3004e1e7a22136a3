"""The observer on a real nats-server and the local backend (docs/runtime.md, "Observer"):
a Discovery per job only when its objects change, ends kept after the scheduler forgets them,
objects the scheduler has no record of listed vanished, heartbeats saying whether the
scheduler is reachable, and a restart that publishes nothing twice."""

from __future__ import annotations

import asyncio
import shutil
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
        await assert_eventually(lambda: _reachable(beats, jobs=1), timeout_s=30)
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
        await assert_eventually(lambda: _reachable(beats, jobs=1), timeout_s=30)


def _reachable(beats: list[Heartbeat], *, jobs: int) -> None:
    """The latest heartbeat says the scheduler is reachable and shows ``jobs`` jobs.

    Waited for, not asserted on the Discovery's arrival: a poll sends its heartbeat after
    it has published its Discoveries, so the test may read a poll's Discovery before that
    poll's heartbeat arrives (the last one then is the previous poll's)."""
    assert beats, "no heartbeat yet"
    assert beats[-1].reachable, beats[-1]
    assert beats[-1].jobs == jobs, beats[-1]


def _at_least(beats: list[Heartbeat], n: int) -> None:
    assert len(beats) >= n, f"{len(beats)} heartbeats, waiting for {n}"


async def test_an_archived_end_stays_in_the_discovery_and_a_restart_repeats_nothing(
    make_runtime: MakeRuntime,
) -> None:
    """Gone is not ended (issue 15): once the scheduler forgets an ended object (archived
    past ``retain_ended_s``), its job's Discovery keeps showing it ended, so a supervisor that
    reads only the latest Discovery still sees the end; a restart publishes nothing twice."""
    rt = await make_runtime(retain_ended_s=1.0)
    async with heartbeats(rt) as beats:
        observer = await rt.observer()
        ref = await _start_object(rt, "gone")
        await _start_object(rt, "stays")

        async def seen() -> None:
            assert set(await _discovery_seqs(rt)) == {"gone", "stays"}

        await assert_eventually(seen, timeout_s=30)
        await rt.backend.stop(ref)

        async def archived() -> None:
            assert (rt.data_dir / "archive" / ref.id).is_dir()
            assert ref not in {o.ref for o in (await rt.objects()).get("gone", ())}

        await assert_eventually(archived, timeout_s=30)
        discovery = await rt.discovery("gone")
        assert discovery is not None
        assert [(o.ref, o.phase) for o in discovery.objects] == [(ref, ObjectPhase.ENDED)]
        assert discovery.vanished == ()
        await observer.stop()
        before = await _discovery_seqs(rt)
        await observer.start()
        n = len(beats)
        await assert_eventually(lambda: _at_least(beats, n + 3), timeout_s=30)
        assert await _discovery_seqs(rt) == before


async def test_an_object_found_nowhere_is_listed_vanished_after_a_restart(
    make_runtime: MakeRuntime,
) -> None:
    """An object the observer last saw alive, whose directory is then removed (the scheduler
    has no record of it), is listed in ``Discovery.vanished``, also by an observer restarted
    meanwhile (it reads what it expects back from its last Discoveries)."""
    rt = await make_runtime()
    observer = await rt.observer()
    ref = await _start_object(rt, "lost")

    async def running() -> None:
        discovery = await rt.discovery("lost")
        assert discovery is not None
        assert [o.phase for o in discovery.objects] == [ObjectPhase.RUNNING]

    await assert_eventually(running, timeout_s=30)
    await observer.stop()
    await rt.backend.emergency_stop(ref)

    async def dead() -> None:
        shown = (await rt.objects()).get("lost", ())
        assert [o.phase for o in shown] == [ObjectPhase.ENDED], shown
        # The runner writes ``status.json`` (ENDED) before it ends the rest of the group and
        # writes ``ceased.json``, its last file: remove the directory only after that, as a
        # person cleaning up would, or the runner's last write races the removal.
        answer = await rt.backend.cessation(ref, ())
        assert answer.ceased, answer

    await assert_eventually(dead, timeout_s=30)
    await asyncio.to_thread(shutil.rmtree, rt.data_dir / "objects" / ref.id)
    await observer.start()

    async def vanished() -> None:
        discovery = await rt.discovery("lost")
        assert discovery is not None
        assert discovery.vanished == (ref,), discovery
        assert discovery.objects == (), discovery

    await assert_eventually(vanished, timeout_s=30)

"""Issue 10, "a cluster that loses nothing": 100 jobs on a 3-server JetStream cluster (streams
at replicas 3) while its servers are killed and restarted.

The observer, the supervisor (one replica, then two), the API and the notifier run as
processes (``python -m services.<name>``), each given all three servers' URLs. The jobs are
submitted through the API and run on the local backend; its fault injection preempts some
of them at random moments, once or twice, under a policy that resubmits once on
preemption. While they run: kill -9 of the JetStream meta leader, restart; kill -9 of the
record stream's leader, restart; then a rolling restart of all three servers.

At the end:

* no committed event is lost: every job's record read before each fault is a prefix of
  its record at the end, and every server holds the same record stream (its own replica's
  message count and last seq, from its monitor, and the jobs' records read through a
  connection to each server);
* no job is unsupervised or stuck: every job settled;
* every job ended as its policy says: ``succeeded`` if preempted at most once (the
  replacement ran to its end), ``failed`` with cause ``preempted`` if preempted twice (the
  budget of one spent), with its escalation delivered by the notifier;
* no service process exited (each one is still running, then ends with 0 on SIGTERM).

Authorization is on: the servers' configs are rendered by ``dispatch_nats.permissions`` (the
services' identities and permissions, the cluster block; no anonymous user), and each
service connects as its own identity (``conftest.locked_cluster``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import nats
import pytest
from nats.aio.client import Client as NATS

from dispatch_core import CauseKind, Job, ObjectPhase, ObservedObject, State, WriterKind
from dispatch_nats import NatsStoreError, RecordStore
from tests.e2e.cluster.harness import API_TOKEN, ClusterRuntime
from tests.e2e.installation import Subprocess
from tests.integration.notifier.support import Receiver
from tests.servers.locked_nats import LockedNats
from tests.servers.nats import NatsCluster
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.timeout(900)]

JOBS: Final = 100
PREEMPT_ONCE: Final = 20
"""Jobs preempted once: resubmitted, then succeed."""
PREEMPT_TWICE: Final = 10
"""Jobs preempted twice: the budget of one spent, they fail."""
RUN_S: Final = 15
"""How long each execution runs (``sleep``), seconds: long enough to be preempted (even on
a loaded machine, whose injector loop may come round late) and to still be running while
the servers fail."""
POLICY: Final = {"rules": [{"on": ["preempted"], "action": "resubmit", "budget": 1}]}
SETTLE_TIMEOUT_S: Final = 300.0

Snapshot = dict[str, list[tuple[int, str | None]]]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    yield r
    await r.stop()


@contextlib.asynccontextmanager
async def _runtime(site: LockedNats, tmp: Path) -> AsyncIterator[ClusterRuntime]:
    rt = ClusterRuntime(site.url, tmp, replicas=3, site=site, poll_interval_s=0.5, kill_wait_s=1.0)
    await rt.open()
    try:
        yield rt
    finally:
        await rt.close()


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-supervisor", "two-supervisors"])
async def test_a_cluster_that_loses_nothing(
    locked_cluster: LockedNats,
    nats_cluster: NatsCluster,
    receiver: Receiver,
    tmp_path: Path,
    replicas: int,
) -> None:
    rng = random.Random(replicas)
    async with _runtime(locked_cluster, tmp_path / "rt") as rt:
        services: list[Subprocess] = [await rt.process("observer")]
        for i in range(replicas):
            services.append(await rt.process("supervisor", name=f"supervisor-{i}"))
        api = await rt.process("api")
        services.append(api)
        services.append(await rt.process("notifier", webhook_url=receiver.url("/hook")))

        jobs = [f"chaos-{i:03d}" for i in range(JOBS)]
        shuffled = rng.sample(jobs, len(jobs))
        twice = set(shuffled[:PREEMPT_TWICE])
        once = set(shuffled[PREEMPT_TWICE : PREEMPT_TWICE + PREEMPT_ONCE])
        base = f"http://127.0.0.1:{api.env['API_HTTP_PORT']}"
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_TOKEN}"}) as http:
            await asyncio.gather(*(_submit(http, base, job) for job in jobs))

        preemptions: dict[str, int] = {}
        wanted = {job: 1 for job in once} | {job: 2 for job in twice}
        injector = asyncio.ensure_future(_preempt(rt, wanted, preemptions, rng))
        try:
            await _wait_running(rt, JOBS // 2)
            snapshots = [await _snapshot(rt, jobs)]
            for victim in ("meta", "stream"):
                await _kill_leader_and_restart(nats_cluster, rt, victim)
                snapshots.append(await _snapshot(rt, jobs))
                _assert_alive(services)
            await asyncio.to_thread(nats_cluster.rolling_restart)
            snapshots.append(await _snapshot(rt, jobs))
            _assert_alive(services)
            try:
                await asyncio.wait_for(asyncio.shield(injector), SETTLE_TIMEOUT_S)
            except TimeoutError:
                # A bare TimeoutError says nothing: name the jobs it waits for, and show them.
                raise AssertionError(await _unpreempted(rt, wanted, preemptions)) from None
        finally:
            if not injector.done():
                injector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await injector

        # Every job settles, as its policy says.
        async def all_settled() -> dict[str, Job]:
            _assert_alive(services)
            folded = {job: await rt.job(job) for job in jobs}
            statuses = {job: await rt.status(job) for job in jobs}
            unsettled = [j for j, s in statuses.items() if s is None or not s.settled]
            assert not unsettled, f"{len(unsettled)} jobs not settled: {unsettled[:5]}"
            # What the scheduler itself says ended each job's executions (the local
            # backend's runners), not what the supervisor recorded.
            preempted = await _preempted_executions(rt)
            for job, j in folded.items():
                _assert_outcome(job, j, preempted.get(job, 0))
            assert sum(1 for n in preempted.values() if n >= 2) >= PREEMPT_TWICE // 2, (
                f"too few jobs were preempted twice to show anything: {preempted}"
            )
            return folded

        try:
            final_jobs = await assert_eventually(
                all_settled, timeout_s=SETTLE_TIMEOUT_S, interval_s=1.0
            )
        except AssertionError as err:
            stuck = [j for j in jobs if not await _settled(rt, j)][:3]
            dumps = [await rt.dump(j) for j in stuck]
            raise AssertionError(f"{err}\n" + "\n".join(dumps)) from None

        # The notifier delivered every escalation of the jobs that failed.
        async def delivered() -> None:
            for job in twice:
                j = await rt.job(job)
                assert j.escalations, f"{job}: failed without an escalation"
                pending = [e.id for e in j.escalations if e.delivered is None]
                assert not pending, f"{job}: escalations not delivered: {pending}"

        await assert_eventually(delivered, timeout_s=120, interval_s=1.0)
        assert {r.esc_id for r in receiver.accepted()} >= {
            e.id for job in twice for e in (await rt.job(job)).escalations
        }

        # No committed event lost: what was read before each fault is still there.
        final = await _snapshot(rt, jobs)
        for n, snapshot in enumerate(snapshots):
            for job, events in snapshot.items():
                assert final[job][: len(events)] == events, (
                    f"{job}: the record read before fault {n} is not a prefix of the final one"
                )
        assert all(final[job] for job in final_jobs), "a job's record is empty"

        # Every server holds the same record stream, and each serves the same records.
        await _assert_replicas_agree(nats_cluster, rt, final)

        _assert_alive(services)
        for service in services:
            assert await service.stop() == 0, f"{service.name}:\n{service.log_tail()}"
        # Each service's identity was enough for all it did: the server refused it nothing.
        for service in services:
            assert "permissions violation" not in service.log_text().lower(), (
                f"{service.name} was refused something:\n{service.log_tail()}"
            )


async def _submit(http: aiohttp.ClientSession, base: str, job: str) -> None:
    """Submit ``job`` through the API, trying again on a 5xx or a refused connection (the
    same Idempotency-Key makes a retry of a stored submission its replay)."""
    body: dict[str, Any] = {
        "job_id": job,
        "spec": {"cluster": "local", "command": ["/bin/sh", "-c", f"sleep {RUN_S}"]},
        "policy": POLICY,
    }
    for _ in range(60):
        try:
            async with http.post(
                f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": f"submit-{job}"}
            ) as response:
                if response.status == 201:
                    return
                text = await response.text()
                assert response.status >= 500, f"{job}: {response.status} {text}"
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"{job}: the API never accepted it")


async def _preempt(
    rt: ClusterRuntime,
    wanted: dict[str, int],
    preemptions: dict[str, int],
    rng: random.Random,
) -> None:
    """Preempt each job of ``wanted`` as many times as it says, each time its running
    object at a random moment of its run (the first submission's, then the
    replacement's); a job whose execution ended otherwise is dropped from ``wanted``."""
    due: dict[tuple[str, int], float] = {}
    loop = asyncio.get_running_loop()
    while any(preemptions.get(j, 0) < n for j, n in wanted.items()):
        objects = await rt.objects()
        now = loop.time()
        for job, n in list(wanted.items()):
            done = preemptions.get(job, 0)
            if done >= n:
                continue
            mine = objects.get(job, ())
            current = [o for o in mine if o.submission == done + 1]
            if any(o.phase is ObjectPhase.ENDED for o in current) or any(
                o.phase is ObjectPhase.ENDED and not _preempted(o)
                for o in mine
                if o.submission == done
            ):
                # Its execution ended before its moment came (a loaded machine), or the
                # last preemption came as it was exiting on its own (the runner reaps the
                # command before it reads the marker again: no replacement will come). The
                # job is judged by what ended its executions (the backend's own word).
                del wanted[job]
                continue
            for obj in current:
                if obj.phase is not ObjectPhase.RUNNING:
                    continue
                at = due.setdefault((job, done + 1), now + rng.uniform(0.2, 2.0))
                if now >= at:
                    with contextlib.suppress(Exception):  # it may have just ended
                        await asyncio.to_thread(rt.backend.faults.preempt, obj.ref.id)
                        preemptions[job] = done + 1
        await asyncio.sleep(0.3)


def _assert_outcome(job: str, j: Job, preempted: int) -> None:
    if preempted >= 2:
        assert j.outcome is State.FAILED, f"{job}: preempted twice, outcome {j.outcome}"
        assert j.outcome_cause is not None
        assert j.outcome_cause.kind is CauseKind.PREEMPTED, f"{job}: {j.outcome_cause}"
    else:
        assert j.outcome is State.SUCCEEDED, (
            f"{job}: preempted {preempted} time(s), outcome {j.outcome} {j.outcome_cause}"
        )


def _preempted(o: ObservedObject) -> bool:
    """Whether the object ended preempted, as the backend shows it."""
    return (
        o.phase is ObjectPhase.ENDED and o.cause is not None and o.cause.kind is CauseKind.PREEMPTED
    )


async def _preempted_executions(rt: ClusterRuntime) -> dict[str, int]:
    """How many of each job's objects ended preempted, as the local backend shows them."""
    return {
        job: sum(1 for o in objs if _preempted(o)) for job, objs in (await rt.objects()).items()
    }


async def _unpreempted(
    rt: ClusterRuntime, wanted: dict[str, int], preemptions: dict[str, int]
) -> str:
    """Why the injector still waits, for a failure message: the jobs not yet preempted as
    often as planned, and the first few as the record, Status and backend show them."""
    left = sorted(j for j, n in wanted.items() if preemptions.get(j, 0) < n)
    lines = [
        f"the injector still waits to preempt {len(left)} job(s): "
        + ", ".join(f"{j} ({preemptions.get(j, 0)} of {wanted[j]})" for j in left)
    ]
    for job in left[:3]:
        try:
            lines.append(await rt.dump(job))
        except Exception as err:
            lines.append(f"--- {job}: no dump: {err!r}")
    return "\n".join(lines)


async def _settled(rt: ClusterRuntime, job: str) -> bool:
    """Whether the job's Status says settled (False while the cluster can't answer)."""
    try:
        status = await rt.status(job)
    except NatsStoreError:
        return False
    return status is not None and status.settled


async def _wait_running(rt: ClusterRuntime, n: int) -> None:
    async def running() -> None:
        objects = await rt.objects()
        live = sum(
            1 for objs in objects.values() if any(o.phase is ObjectPhase.RUNNING for o in objs)
        )
        assert live >= n, f"{live} jobs running, waiting for {n}"

    await assert_eventually(running, timeout_s=120, interval_s=0.5)


async def _snapshot(rt: ClusterRuntime, jobs: list[str]) -> Snapshot:
    """Every job's record as (seq, msg id), read through the leader-checked store (retried
    while the cluster elects)."""

    async def read(job: str) -> list[tuple[int, str | None]]:
        for _ in range(120):
            try:
                return [(e.seq, e.msg_id) for e in await rt.records.read(job)]
            except Exception:
                await asyncio.sleep(0.5)
        raise AssertionError(f"{job}: the record could not be read")

    return dict(zip(jobs, await asyncio.gather(*(read(j) for j in jobs)), strict=True))


async def _kill_leader_and_restart(cluster: NatsCluster, rt: ClusterRuntime, what: str) -> None:
    """kill -9 the meta leader (``meta``) or the record stream's leader (``stream``), wait
    until the others elected a new one, start it again and wait until it is current."""
    stream = rt.layout.record_stream
    leader = cluster.meta_leader() if what == "meta" else cluster.stream_leader(stream)
    assert leader is not None, f"no {what} leader"
    victim = cluster.index(leader)
    await asyncio.to_thread(cluster.kill, victim)
    survivors = [i for i in range(len(cluster.names)) if i != victim]

    def elected() -> None:
        new = cluster.meta_leader(survivors) if what == "meta" else cluster.stream_leader(stream)
        assert new is not None, f"no new {what} leader yet"
        assert new != leader, f"{what} leader still {new}"

    await assert_eventually(elected, timeout_s=60, interval_s=0.2)
    await asyncio.to_thread(cluster.start_server, victim)
    await asyncio.to_thread(cluster.wait_healthy, victim, 60.0)


def _assert_alive(services: list[Subprocess]) -> None:
    for service in services:
        assert service.returncode is None, (
            f"{service.name} exited {service.returncode}:\n{service.log_tail()}"
        )


async def _assert_replicas_agree(cluster: NatsCluster, rt: ClusterRuntime, final: Snapshot) -> None:
    stream = rt.layout.record_stream

    def same_state() -> None:
        states = [cluster.stream_state(i, stream) for i in range(len(cluster.names))]
        assert len(set(states)) == 1, f"the servers' replicas differ: {states}"
        assert states[0][0] == sum(len(v) for v in final.values()), (
            f"the stream holds {states[0][0]} events, the records {sum(map(len, final.values()))}"
        )

    await assert_eventually(same_state, timeout_s=60, interval_s=0.5)
    for url in cluster.urls:
        assert rt.site is not None
        nc: NATS = await nats.connect([url], max_reconnect_attempts=-1, **rt.site.client_options())
        try:
            store = RecordStore(nc, writer=WriterKind.API, layout=rt.layout, read_timeout_s=20)
            for job, events in final.items():
                got = [(e.seq, e.msg_id) for e in await store.read(job)]
                assert got == events, f"{job} read through {url} differs"
            await store.aclose()
        finally:
            await nc.close()

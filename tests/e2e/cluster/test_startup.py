"""Issue 10, "a cluster that loses nothing": every service's start-up.

Each of the four services runs as ``python -m services.<name>``:

* started while NATS is down, it waits (retrying with backoff), starts once NATS comes up,
  and a SIGTERM while it waits ends it promptly with status 0;
* started against a cluster that has no JetStream quorum (two of three servers down: no
  meta leader, stream creation can't be answered), it keeps retrying ``ensure_streams``
  and is ready once the cluster has elected its leaders.

Authorization is on throughout: each service connects as its own identity to a 3-server
cluster whose configs ``dispatch_nats.permissions`` rendered (``tests.servers.locked_nats``),
given the three URLs, streams at replicas 3.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.cluster.conftest import locked_site
from tests.e2e.cluster.harness import SERVICES, service_env
from tests.e2e.installation import Subprocess
from tests.servers.locked_nats import LockedNats
from tests.servers.nats import NatsCluster
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

PROMPT_EXIT_S = 5.0
"""How soon a service must end after SIGTERM while it waits for NATS, in seconds (it is
under a second on an idle machine; the rest is for a loaded one)."""


def _process(service: str, site: LockedNats, tmp: Path, replicas: int = 1) -> Subprocess:
    """``python -m services.<service>`` as its own identity of ``site``."""
    env = service_env(
        service, nats_url=site.url, namespace=site.layout.namespace, tmp=tmp, site=site
    )
    env[f"{service.upper()}_STREAM_REPLICAS"] = str(replicas)
    env["PYTHONUNBUFFERED"] = "1"
    return Subprocess(service, f"services.{service}", env, tmp / f"{service}.log")


async def _healthz(proc: Subprocess) -> int | None:
    port = proc.env[f"{proc.module.rsplit('.', 1)[-1].upper()}_HTTP_PORT"]
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            return response.status
    except aiohttp.ClientError:
        return None


async def _wait_log(proc: Subprocess, needle: str) -> None:
    def seen() -> None:
        assert proc.returncode is None, f"{proc.name} exited:\n{proc.log_tail()}"
        assert needle in proc.log_text(), f"{proc.name}: no {needle!r} yet:\n{proc.log_tail()}"

    await assert_eventually(seen, timeout_s=60, interval_s=0.1)


async def _stop_promptly(proc: Subprocess) -> None:
    assert proc.proc is not None
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    try:
        code = await proc.wait(timeout_s=PROMPT_EXIT_S)
    except TimeoutError:
        await proc.kill()
        raise AssertionError(
            f"{proc.name} still running {PROMPT_EXIT_S} s after SIGTERM:\n{proc.log_tail()}"
        ) from None
    assert code == 0, f"{proc.name} exited {code}:\n{proc.log_tail()}"
    assert time.monotonic() - started < PROMPT_EXIT_S


@pytest.mark.parametrize("service", SERVICES)
async def test_sigterm_while_nats_is_down_ends_the_service_promptly(
    service: str, tmp_path: Path
) -> None:
    site = locked_site(tmp_path / "site", size=3)  # never started: nobody listens there
    proc = _process(service, site, tmp_path, replicas=3)
    await proc.start(wait_ready=False)
    try:
        await _wait_log(proc, "nats.connect_failed")
        assert await _healthz(proc) != 200
        await _stop_promptly(proc)
    finally:
        await proc.kill()


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_started_before_nats_starts_once_nats_is_up(
    service: str, tmp_path: Path
) -> None:
    site = locked_site(tmp_path / "site", size=3)  # its ports are fixed, not yet listened on
    proc = _process(service, site, tmp_path, replicas=3)
    await proc.start(wait_ready=False)
    try:
        await _wait_log(proc, "nats.connect_failed")
        assert await _healthz(proc) != 200
        await asyncio.to_thread(site.start)

        async def ready() -> None:
            assert proc.returncode is None, f"{service} exited:\n{proc.log_tail()}"
            assert await _healthz(proc) == 200, f"{service} not ready:\n{proc.log_tail()}"

        await assert_eventually(ready, timeout_s=60, interval_s=0.2)
        await _stop_promptly(proc)
    finally:
        await proc.kill()
        await asyncio.to_thread(site.stop)


@pytest.mark.parametrize("service", SERVICES)
async def test_ensure_streams_waits_for_a_cluster_still_electing(
    service: str, locked_cluster: LockedNats, nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    # Two of three servers down: the one left has no JetStream quorum, so no meta leader
    # answers stream info or creation (R3 streams can't be placed either).
    for i in (1, 2):
        await asyncio.to_thread(nats_cluster.kill, i)
    proc = _process(service, locked_cluster, tmp_path, replicas=3)
    await proc.start(wait_ready=False)
    try:
        await _wait_log(proc, "startup.retry")
        assert await _healthz(proc) != 200
        for i in (1, 2):
            await asyncio.to_thread(nats_cluster.start_server, i)

        async def ready() -> None:
            assert proc.returncode is None, f"{service} exited:\n{proc.log_tail()}"
            assert await _healthz(proc) == 200, f"{service} not ready:\n{proc.log_tail()}"

        await assert_eventually(ready, timeout_s=90, interval_s=0.2)
        await _stop_promptly(proc)
    finally:
        await proc.kill()


@pytest.mark.parametrize("service", ["supervisor", "api"])
async def test_sigterm_while_the_cluster_has_no_quorum_ends_the_service_promptly(
    service: str, locked_cluster: LockedNats, nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    for i in (1, 2):
        await asyncio.to_thread(nats_cluster.kill, i)
    proc = _process(service, locked_cluster, tmp_path, replicas=3)
    await proc.start(wait_ready=False)
    try:
        await _wait_log(proc, "startup.retry")
        await _stop_promptly(proc)
    finally:
        await proc.kill()


@pytest.mark.parametrize("service", SERVICES)
async def test_sigterm_after_nats_went_away_ends_the_service_promptly(
    service: str, tmp_path: Path
) -> None:
    site = locked_site(tmp_path / "site", size=3)
    await asyncio.to_thread(site.start)
    proc = _process(service, site, tmp_path, replicas=3)
    try:
        await proc.start()  # ready: connected as its identity, streams made
        assert site.cluster is not None
        for i in range(len(site.cluster.names)):  # the whole cluster goes away
            await asyncio.to_thread(site.cluster.kill, i)
        await _wait_log(proc, "nats.disconnected")
        await _stop_promptly(proc)
    finally:
        await proc.kill()
        await asyncio.to_thread(site.stop)

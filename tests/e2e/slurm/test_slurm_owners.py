"""Jobs run as their owners on the real Slurm test cluster (issue 16 item 1).

The tokens file maps actor ``alice`` to Unix user ``dj-alice`` and ``bob`` to ``dj-bob``
(the two users ``scripts/slurm-cluster.sh`` creates), ``carol`` to ``dj-carol`` (a user the
cluster's ``users`` don't list), and ``oncall`` to none. The API runs in-process on the
test's NATS namespace with the observer and a supervisor, and the cluster's entry lists
``users = ["dj-alice", "dj-bob"]``: the backend submits, releases and cancels through
``sudo -n -u <owner>`` (as root here, sudo needs no rule; a site's rule is in
``deploy/slurm/README.md``).

Shown on the real cluster: ``squeue`` and ``sacct`` report each job under its owner and the
job itself runs as that user; the record holds ``spec.owner``; bob can't cancel alice's job
through dispatch (403, the job still runs), alice can, and Slurm's accounting says the
cancel came from dj-alice's uid; an operator without a Unix user cancels bob's job, again as
dj-bob; carol's submission and alice's claim to submit as dj-bob are refused at the door.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pwd
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from dispatch_core import State, Status, WriterKind
from dispatch_nats import LatestStore, RecordStore
from services.api.app import make_app
from services.api.auth import Authenticator
from services.api.clusters import load_clusters_file
from services.api.metrics import ApiMetrics
from services.api.operations import Operations
from services.common.http import start_http
from tests.e2e.slurm.harness import CLUSTER, SlurmRuntime
from tests.integration.slurm.test_slurm_support import require_cluster, run
from tests.servers.nats import NatsServer
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

USERS: Final = ("dj-alice", "dj-bob")
TOKENS: Final = {"alice": "t-alice", "bob": "t-bob", "carol": "t-carol", "oncall": "t-oncall"}
TOKENS_TOML: Final = """
[[tokens]]
actor = "alice"
kind = "human"
token = "t-alice"
unix_user = "dj-alice"

[[tokens]]
actor = "bob"
kind = "human"
token = "t-bob"
unix_user = "dj-bob"

[[tokens]]
actor = "carol"
kind = "human"
token = "t-carol"
unix_user = "dj-carol"

[[tokens]]
actor = "oncall"
kind = "human"
token = "t-oncall"
"""
SCRIPT: Final = """#!/bin/sh
#SBATCH -p debug
#SBATCH --time=10
#SBATCH --mem=50M
echo "runs as $(id -un)"
exec sleep 600
"""
WAIT_S: Final = 120.0


class Api:
    """The API in-process on the runtime's namespace, called with each actor's token."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def call(
        self, actor: str, method: str, path: str, body: object = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {TOKENS[actor]}"}
        async with self.session.request(
            method, f"{self.url}{path}", json=body, headers=headers
        ) as response:
            return response.status, await response.json()

    async def submit(self, actor: str, **spec: Any) -> tuple[int, Any]:
        body = {
            "name": f"own-{actor}",
            "spec": {"cluster": CLUSTER, "script": SCRIPT, "options": {"chdir": "/tmp"}, **spec},
            "policy": {"rules": []},
        }
        return await self.call(actor, "POST", "/v1/jobs", body)


@pytest.fixture
async def owners(slurm_nats: NatsServer, tmp_path: Path) -> AsyncIterator[tuple[SlurmRuntime, Api]]:
    """The runtime (observer, supervisor) and the API, with the two owners."""
    require_cluster()
    for user in USERS:
        pwd.getpwnam(user)  # scripts/slurm-cluster.sh start creates them
    # The owners' jobs write their output in the runtime's directory: one they can reach
    # (a test's tmp_path is inside directories only root may enter).
    shared = Path(tempfile.mkdtemp(prefix="dispatch-owners-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    runtime = SlurmRuntime(slurm_nats.url, shared, users=USERS)
    os.chmod(runtime.out, 0o1777)
    await runtime.open()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    auth = Authenticator.from_file(tokens)
    clusters = load_clusters_file(runtime.clusters_file)
    registry = CollectorRegistry()
    metrics = ApiMetrics(registry)
    stores = (
        RecordStore(runtime.nc, writer=WriterKind.API, layout=runtime.layout),
        LatestStore.status(runtime.nc, layout=runtime.layout),
        LatestStore.discovery(runtime.nc, layout=runtime.layout),
    )
    ops = Operations(
        records=stores[0],
        statuses=stores[1],
        discoveries=stores[2],
        declarations=clusters.declarations,
        cluster_configs=clusters.configs,
        unix_users=auth.unix_users,
        metrics=metrics,
    )
    ready = asyncio.Event()
    app = make_app(ops, auth, registry=registry, metrics=metrics, ready=ready)
    runner, port = await start_http(app, "127.0.0.1", 0)
    ready.set()
    try:
        async with aiohttp.ClientSession() as session:
            yield runtime, Api(f"http://127.0.0.1:{port}", session)
    finally:
        await runner.cleanup()
        for store in stores:
            await store.aclose()
        await runtime.close()
        shutil.rmtree(shared, ignore_errors=True)


def _squeue(job: str) -> tuple[str, str, str]:
    """(Slurm id, user, state) of the dispatch job's Slurm job."""
    line = run("squeue", "-h", "-t", "all", "-n", f"dj-{job}", "-o", "%i|%u|%T").stdout.strip()
    assert line.count("|") == 2, f"squeue: {line!r}"
    slurm_id, user, state = line.split("|")
    return slurm_id, user, state


def _sacct(slurm_id: str) -> tuple[str, str]:
    """(User, State) of the job's allocation row in accounting."""
    line = run("sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "User,State").stdout.strip()
    assert line.count("|") == 1, f"sacct: {line!r}"
    user, state = line.split("|")
    return user, state


@pytest.mark.timeout(600)
async def test_each_job_runs_as_its_owner_and_one_owner_cannot_cancel_another_s(
    owners: tuple[SlurmRuntime, Api],
) -> None:
    srt, api = owners
    await srt.observer()
    await srt.supervisor()
    jobs: dict[str, str] = {}
    try:
        for actor in ("alice", "bob"):
            code, answer = await api.submit(actor)
            assert code == 201, answer
            jobs[actor] = answer["job_id"]
        for actor in ("alice", "bob"):
            await srt.wait_status(jobs[actor], _in_state(State.RUNNING), timeout_s=WAIT_S)

        slurm_ids: dict[str, str] = {}
        for actor, user in zip(("alice", "bob"), USERS, strict=True):
            slurm_id, squeue_user, state = _squeue(jobs[actor])
            assert (squeue_user, state) == (user, "RUNNING"), (actor, squeue_user, state)
            slurm_ids[actor] = slurm_id
            # accounting learns of the start after squeue does (slurmctld tells slurmdbd later)
            await assert_eventually(
                functools.partial(_accounted, slurm_id, (user, "RUNNING")), timeout_s=60
            )
            await assert_eventually(
                functools.partial(_in, f"runs as {user}", srt.out, slurm_id), timeout_s=60
            )
            code, record = await api.call(actor, "GET", f"/v1/jobs/{jobs[actor]}/record")
            assert code == 200, record
            created = record["events"][0]["event"]
            assert created["type"] == "job.created", created
            assert created["spec"]["owner"] == user, created["spec"]
            assert created["by"]["name"] == actor

        # bob may not cancel alice's job through dispatch: refused, and it still runs
        code, refused = await api.call(
            "bob", "POST", f"/v1/jobs/{jobs['alice']}/cancel", {"reason": "not mine"}
        )
        assert code == 403, refused
        assert "may not cancel job" in refused["error"]["message"], refused
        assert "dj-alice" in refused["error"]["message"], refused
        assert _squeue(jobs["alice"])[1:] == ("dj-alice", "RUNNING")

        # alice cancels her own: scancel runs as dj-alice (Slurm records her uid)
        code, done = await api.call(
            "alice", "POST", f"/v1/jobs/{jobs['alice']}/cancel", {"reason": "done"}
        )
        assert code == 200, done
        alice_uid = pwd.getpwnam("dj-alice").pw_uid
        acct = await assert_eventually(
            lambda: _ended(slurm_ids["alice"]), timeout_s=WAIT_S, interval_s=1.0
        )
        assert acct == ("dj-alice", f"CANCELLED by {alice_uid}"), acct

        # an operator without a Unix user may cancel any job: as its owner, dj-bob
        code, done = await api.call(
            "oncall", "POST", f"/v1/jobs/{jobs['bob']}/cancel", {"reason": "on call"}
        )
        assert code == 200, done
        bob_uid = pwd.getpwnam("dj-bob").pw_uid
        acct = await assert_eventually(
            lambda: _ended(slurm_ids["bob"]), timeout_s=WAIT_S, interval_s=1.0
        )
        assert acct == ("dj-bob", f"CANCELLED by {bob_uid}"), acct
        for actor in ("alice", "bob"):
            await srt.wait_status(jobs[actor], _in_state(State.CANCELLED), timeout_s=WAIT_S)

        # refused at the door: a user the cluster doesn't list, an owner not one's own
        code, refused = await api.submit("carol")
        assert code == 403, refused
        assert refused["error"]["field"] == "spec.owner", refused
        assert "may not act for Unix user 'dj-carol'" in refused["error"]["message"], refused
        code, refused = await api.submit("alice", owner="dj-bob")
        assert code == 403, refused
        assert "may not submit jobs as Unix user 'dj-bob'" in refused["error"]["message"]
        listed = run("squeue", "-h", "-t", "all", "-u", "dj-carol", check=False)
        assert listed.stdout.strip() == "", listed
    finally:
        for job in jobs.values():
            with contextlib.suppress(Exception):
                run("scancel", f"--name=dj-{job}", check=False)


def _accounted(slurm_id: str, expected: tuple[str, str]) -> None:
    acct = _sacct(slurm_id)
    assert acct == expected, acct


def _in(needle: str, out: Path, slurm_id: str) -> None:
    found = sorted(out.glob(f"*-{slurm_id}.out"))
    text = found[0].read_text() if found else ""
    assert needle in text, text


def _ended(slurm_id: str) -> tuple[str, str]:
    user, state = _sacct(slurm_id)
    assert state.startswith("CANCELLED"), state
    return user, state


def _in_state(state: State) -> Callable[[Status], None]:
    def check(status: Status) -> None:
        assert status.state is state, status

    return check

"""``dispatch logs`` end to end on the kubeflow backend, with REAL log bytes: the observer and a
supervisor (in-process, as in test_kubeflow_e2e.py) and the API service (in-process, its real
``run``) on a real nats-server; the observer's KubeflowBackend (the deploy/kubernetes
ServiceAccount) on the real-apiserver lane's kube-apiserver 1.20.2, which reads each pod log
from the fake kubelet (TEST DOUBLE, tests/servers/kubelet.py) its nodes point at; the CLI run
as a user runs it (``python -m dispatch_cli``) against the API.

Proved: the observer answers ``dispatch.logs.<cluster>`` with the trainer node-0 pod's exact
bytes, ``GET /v1/jobs/{job}/logs`` streams them with where they are, ``dispatch logs`` prints
them byte for byte and ``status`` says where they are; ``--follow`` prints bytes written later
and ends (exit 0) when the TrainJob ends; ``--execution N`` reads submission N's TrainJob (after
a Kueue preemption, the first one's pods are gone: a clear not-found naming it); a kubelet that
refuses is a clear error naming the pod, never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from dispatch_backends import OutputStream
from dispatch_core import (
    Action,
    CauseKind,
    JobSpec,
    ObjectRef,
    RecoveryPolicy,
    RecoveryRule,
    State,
    Status,
)
from services.api import service as api_service
from services.api.config import ApiConfig
from services.api.output import OutputClient
from tests.e2e.cli.support import REPO, cli_env
from tests.e2e.installation import InProcess
from tests.e2e.kubeflow.test_kubeflow_e2e import CLUSTER, Installation, running
from tests.integration.backends.test_kubeflow_support import NS, real_simulated
from tests.servers.kube import KubeApiServer
from tests.servers.kubelet import FakeKubelet
from tests.servers.nats import NatsServer
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.timeout(600)]

TOKEN = "t-logs-" + secrets.token_hex(8)
TOKENS_TOML = f'[[tokens]]\nactor = "alice"\nkind = "human"\ntoken = "{TOKEN}"\n'


class LogsInstallation(Installation):
    """The kubeflow installation, plus the API service and the CLI."""

    api_url = ""

    async def api(self) -> str:
        """Start the API service in-process; returns its URL."""
        tokens = self.tmp / "tokens.toml"
        tokens.write_text(TOKENS_TOML)
        cfg = ApiConfig(
            nats_url=(self.nats_url,),
            namespace=self.layout.namespace,
            http_port=0,
            tokens_file=str(tokens),
            clusters_file=str(self.clusters_file),
        )
        ports: list[int] = []

        async def start(stop: asyncio.Event, ready: asyncio.Event) -> None:
            def listening(port: int) -> None:
                ports.append(port)
                ready.set()

            await api_service.run(cfg, stop, registry=CollectorRegistry(), on_listening=listening)

        await self._start(InProcess("api", start))
        self.api_url = f"http://127.0.0.1:{ports[0]}"
        return self.api_url

    def cli_env(self) -> dict[str, str]:
        return cli_env(
            {
                "DISPATCH_API": self.api_url,
                "DISPATCH_TOKEN": TOKEN,
                "DISPATCH_DATA_DIR": str(self.tmp / "cli"),
            }
        )

    async def dispatch(self, *args: str) -> tuple[int, bytes, str]:
        """Run the CLI; its exit status, standard output (bytes) and standard error."""
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "dispatch_cli", *args],
            env=self.cli_env(),
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
        return proc.returncode, proc.stdout, proc.stderr.decode(errors="replace")


class Follower:
    """``dispatch logs JOB --follow`` in the background, its bytes collected as they come."""

    def __init__(self, inst: LogsInstallation, job: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dispatch_cli", "logs", job, "--follow"],
            env=inst.cli_env(),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while data := os.read(fd, 65536):  # as it comes, not when a buffer fills
            self.out += data

    def printed(self, want: bytes) -> Callable[[], None]:
        def check() -> None:
            assert bytes(self.out) == want, bytes(self.out)

        return check

    def ended(self) -> None:
        assert self.proc.poll() is not None, f"still following: {bytes(self.out)!r}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
async def installation(
    nats_server: NatsServer,
    tmp_path: Path,
    kube_lab: KubeApiServer,
    kube_dispatch_token: str,
    kubelet: FakeKubelet,
) -> AsyncIterator[LogsInstallation]:
    with real_simulated(kube_lab, token=kube_dispatch_token, kubelet=kubelet, max_restarts=1) as (
        server,
        cluster,
    ):
        inst = LogsInstallation(nats_server.url, tmp_path / "inst", server, cluster)
        try:
            await inst.open()
            await inst.api()
            yield inst
        finally:
            await inst.close()


async def _write(inst: LogsInstallation, name: str, data: bytes) -> str:
    """Print ``data`` from TrainJob ``name``'s node-0 pod once it runs; the pod's name."""

    def write() -> str:
        try:
            return inst.cluster.write_log(NS, name, data)
        except ValueError as err:  # its pod has not run yet
            raise AssertionError(str(err)) from err

    return await assert_eventually(lambda: asyncio.to_thread(write), timeout_s=60)


def _restarted_pod(inst: LogsInstallation, name: str) -> str:
    """The running node-0 pod of JobSet restart 1 of TrainJob ``name``."""
    pods = [
        p["metadata"]["name"]
        for p in inst.cluster.pods(NS, name)
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/restart-attempt") == "1"
        and p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0"
        and p["status"].get("phase") == "Running"
    ]
    assert pods, f"no node-0 pod of restart 1 of {name} runs yet"
    return str(pods[0])


async def test_dispatch_logs_reads_the_trainer_pod_s_bytes_through_observer_api_and_cli(
    installation: LogsInstallation, kubelet: FakeKubelet
) -> None:
    inst = installation
    job = f"kflogs-{secrets.token_hex(4)}"
    spec = JobSpec(
        cluster=CLUSTER,
        command=("python", "train.py"),
        options={"image": "ghcr.io/example/train:1", "nodes": "2"},
    )
    policy = RecoveryPolicy(
        rules=(
            RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),
            # the JobSet's own restart after a pod's non-zero exit is accepted as this rule's
            # recovery (native), so the TrainJob runs on: under no rule the supervisor stops
            # (deletes) it, its pods and their logs with it (docs/core-semantics.md)
            RecoveryRule(on=(CauseKind.NON_ZERO_EXIT,), action=Action.RESUBMIT, budget=1),
        )
    )
    await inst.submit(job, spec, policy)
    await inst.wait_status(job, running(1))
    name1 = f"dj-{job}-1-1"
    first = b"epoch 1 loss=0.91\n\xff\xfe not UTF-8\r\nstep 2"
    pod1 = await _write(inst, name1, first)
    ref1 = ObjectRef(cluster=CLUSTER, id=f"{NS}/{name1}")

    # the observer answers dispatch.logs.<cluster> with the kubelet's bytes
    asked = OutputClient(inst.nc, layout=inst.layout)
    chunk = await asked.read(ref1, OutputStream.STDOUT, 0)
    assert chunk.data == first
    assert chunk.where == f"pod {NS}/{pod1}"
    assert chunk.live

    # the API streams them, saying where they are
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{inst.api_url}/v1/jobs/{job}/logs", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as answer,
    ):
        assert answer.status == 200, await answer.text()
        assert await answer.read() == first
        assert answer.headers["Dispatch-Object"] == str(ref1)
        assert answer.headers["Dispatch-Execution"] == "1"
        assert answer.headers["Dispatch-Output-Location"] == f"pod {NS}/{pod1}"
        assert answer.headers["Dispatch-Output-Live"] == "true"

    # the CLI prints them byte for byte; status says where they are
    code, out, err = await inst.dispatch("logs", job)
    assert (code, out) == (0, first), err
    code, shown, err = await inst.dispatch("status", job)
    assert code == 0, err
    assert f"output: pod {NS}/{pod1}" in shown.decode(), shown

    # Kueue preempts it: resubmitted as TrainJob 2; the first one's pods (and logs) are gone
    await asyncio.to_thread(inst.cluster.kueue_evict, NS, name1)
    await inst.wait_status(job, running(2))
    name2 = f"dj-{job}-2-1"
    resumed = b"resumed from step 2\n"
    pod2 = await _write(inst, name2, resumed)

    async def first_gone() -> None:
        code, out, err = await inst.dispatch("logs", job, "--execution", "1")
        assert code == 5, (code, out, err)
        assert f"TrainJob {NS}/{name1}" in err
        assert "gone" in err
        assert "Traceback" not in err

    await assert_eventually(first_gone, timeout_s=60)

    follower = Follower(inst, job)  # the latest execution: 2
    try:
        await assert_eventually(follower.printed(resumed), timeout_s=60)
        later = b"epoch 2 loss=0.42\n"
        await asyncio.to_thread(inst.cluster.write_log, NS, name2, later)
        await assert_eventually(follower.printed(resumed + later), timeout_s=60)
        assert follower.proc.poll() is None  # still following while the TrainJob runs
        # a pod fails: the JobSet restarts (maxRestarts 1) with new pods, and a new log (the
        # second rule accepts the restart as its recovery: the TrainJob runs on)
        await asyncio.to_thread(inst.cluster.fail, NS, name2, index=1)
        pod3 = await assert_eventually(
            lambda: asyncio.to_thread(_restarted_pod, inst, name2), timeout_s=60
        )
        assert pod3 != pod2
        again = b"restart 1: resumed from step 2 again\n"
        assert await asyncio.to_thread(inst.cluster.write_log, NS, name2, again) == pod3
        await assert_eventually(follower.printed(resumed + later + again), timeout_s=60)
        last = b"done\n"
        await asyncio.to_thread(inst.cluster.write_log, NS, name2, last)
        await asyncio.to_thread(inst.cluster.succeed, NS, name2)  # the TrainJob ends
        await assert_eventually(follower.ended, timeout_s=60)
        assert follower.proc.returncode == 0
        assert bytes(follower.out) == resumed + later + again + last
    finally:
        follower.close()

    def succeeded(status: Status) -> None:
        assert status.state is State.SUCCEEDED, status

    # the job ends with its TrainJob (the restart was a recovery): nothing stops it, so the
    # reads below come after the supervisor acted on the end, and the TrainJob stays
    await inst.wait_status(job, succeeded)
    # a read now: the log of the TrainJob's node-0 pod of its latest JobSet restart (the
    # restart deleted the first pod, and its log with it)
    code, out, err = await inst.dispatch("logs", job, "--execution", "2")
    assert (code, out) == (0, again + last), err
    assert kubelet.log(NS, pod3) == again + last

    # a kubelet that refuses: a clear error naming the pod, no traceback
    kubelet.refuse(5, status=500, message="failed to get container status: runtime is down")
    code, out, err = await inst.dispatch("logs", job)
    assert code != 0
    assert out == b""
    assert f"pod {NS}/{pod3}" in err
    assert "runtime is down" in err
    assert "Traceback" not in err

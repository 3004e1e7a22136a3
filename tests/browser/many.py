"""Many jobs behind one API, for the jobs list's paging test and ``bench/web_jobs.py``.

Submitting thousands of jobs to ``dispatch up`` would start thousands of local processes,
so this writes the records directly, through the library the tests use: each job's
``JobCreated`` appended to the record stream as the API would (``dispatch_nats``
``RecordStore``, writer ``api``), and its Status, projected by the core from that record,
published as the supervisor would (``LatestStore``). A private nats-server holds them and
the API service runs alone (``python -m services.api``), as deployed: no supervisor, so the
jobs stay pending, and nothing launches them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

import nats

from dispatch_core import (
    Actor,
    ActorKind,
    JobCreated,
    JobSpec,
    RecoveryPolicy,
    WriterKind,
    encode,
    fold,
    make_plan,
    project,
)
from dispatch_nats import LatestStore, Layout, RecordStore, ensure_streams
from services.api.clusters import load_declarations
from tests.e2e.cli.support import REPO, cli_env, eventually
from tests.servers.nats import NatsServer, free_port

__all__ = ["TOKEN", "ManyJobs"]

TOKEN: Final = "many-jobs-token-0123456789abcdef"
_NAMESPACE: Final = "web"


class ManyJobs:
    """A nats-server, ``n`` jobs written into it, and the API service alone in front."""

    def __init__(self, tmp: Path, n: int) -> None:
        self.tmp = tmp
        self.n = n
        self.server = NatsServer(tmp / "store")
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.clusters = tmp / "clusters.toml"
        self.clusters.write_text(
            f'[[clusters]]\nname = "local"\nbackend = "local"\ndata_dir = "{tmp / "local"}"\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def ids(self) -> list[str]:
        """The jobs' ids, in the order the listings sort them."""
        return sorted(f"bulk-{i:05d}" for i in range(self.n))

    def start(self) -> None:
        """Start the server, write the jobs, start the API and wait until it is healthy."""
        self.server.start()
        # In a thread of its own: the caller may be inside an event loop (Playwright's).
        with ThreadPoolExecutor(1) as pool:
            pool.submit(lambda: asyncio.run(self._write())).result()
        tokens = self.tmp / "tokens.toml"
        tokens.write_text(f'[[tokens]]\nactor = "alice"\nkind = "human"\ntoken = "{TOKEN}"\n')
        env = cli_env(
            {
                "API_NATS_URL": self.server.url,
                "API_NAMESPACE": _NAMESPACE,
                "API_HTTP_PORT": str(self.port),
                "API_TOKENS_FILE": str(tokens),
                "API_CLUSTERS_FILE": str(self.clusters),
            }
        )
        self._log = (self.tmp / "api.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.api"],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

        def healthy() -> None:
            assert self.proc is not None
            assert self.proc.poll() is None, self.log()
            try:
                with urllib.request.urlopen(f"{self.api}/healthz", timeout=2) as response:
                    assert response.status == 200
            except OSError as err:
                raise AssertionError(repr(err)) from None

        eventually(healthy, timeout_s=60)

    def log(self) -> str:
        """The API's log."""
        return (self.tmp / "api.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop the API and the server."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            if self._log is not None:
                self._log.close()
            self.server.stop()

    async def _write(self) -> None:
        layout = Layout(namespace=_NAMESPACE)
        declarations = load_declarations(self.clusters)["local"]
        nc = await nats.connect(self.server.url)
        try:
            await ensure_streams(nc, 1, layout=layout)
            records = RecordStore(nc, writer=WriterKind.API, layout=layout)
            statuses = LatestStore.status(nc, layout=layout)
            spec = JobSpec(cluster="local", command=("/bin/true",))
            policy = RecoveryPolicy()
            plan = make_plan(spec, policy, declarations)
            by = Actor(name="alice", kind=ActorKind.HUMAN)
            slots = asyncio.Semaphore(128)

            async def one(job_id: str) -> None:
                async with slots:
                    now = datetime.now(UTC)
                    created = JobCreated(
                        job_id=job_id,
                        at=now,
                        spec=spec,
                        policy=policy,
                        plan=plan,
                        declarations=declarations,
                        by=by,
                    )
                    seq = await records.append(
                        job_id, encode(created), expected_last_seq=0, msg_id=f"bulk:{job_id}"
                    )
                    status = project(fold([(seq, created, WriterKind.API)], now), None, now)
                    await statuses.put((job_id,), encode(status))

            await asyncio.gather(*(one(j) for j in self.ids()))
        finally:
            await nc.close()

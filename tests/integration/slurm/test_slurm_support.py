"""Shared by the slurm backend's tests on the real Slurm test cluster: the cluster fixture,
plain Slurm commands, node control (always put back), and the contract harness.

The cluster must already run (``scripts/test.sh`` starts it with
``scripts/slurm-cluster.sh start``); without it the tests skip, or fail under
``DISPATCH_REQUIRE_SERVICES=1``, as ``test_cluster.py`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar, Final

import pytest

from dispatch_backends.slurm import SlurmBackend, SlurmSettings
from dispatch_core.state import JobSpec, ObjectRef
from tests.contract.backend_contract import FAIL_EXIT_CODE, BackendHarness, Program

__all__ = [
    "CLUSTER",
    "NODES",
    "SLURM_CONF",
    "SlurmHarness",
    "down_node",
    "node_state",
    "output_env",
    "require_cluster",
    "resume_node",
    "run",
    "sbatch",
]

CLUSTER: Final = "test-slurm"
SLURM_CONF: Final = Path("/etc/slurm/slurm.conf")
NODES: Final = tuple(f"node{i}" for i in range(1, int(os.environ.get("SLURM_LAB_NODES", "3")) + 1))
_PRINT_ENV: Final = "env | grep '^DISPATCH_' || true"
_PROGRAMS: Final = {
    Program.SUCCEED: f"{_PRINT_ENV}; exit 0",
    Program.FAIL: f"{_PRINT_ENV}; exit {FAIL_EXIT_CODE}",
    Program.SLEEP: f"{_PRINT_ENV}; exec sleep 3600",
}


def run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a plain Slurm command (as a person at the terminal would)."""
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=timeout)


def require_cluster() -> None:
    """Skip (or fail under ``DISPATCH_REQUIRE_SERVICES=1``) without a running cluster."""
    hint = "start it with: scripts/slurm-cluster.sh start (as root, Debian 12)"
    reason = ""
    if shutil.which("scontrol") is None or not SLURM_CONF.exists():
        reason = f"the Slurm test cluster is not installed; {hint}"
    elif "is UP" not in run("scontrol", "ping", check=False).stdout:
        reason = f"slurmctld does not answer 'scontrol ping'; {hint}"
    if reason:
        if os.environ.get("DISPATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def sbatch(*args: str, script: str | None = None) -> str:
    """Submit with plain ``sbatch --parsable``; return the job id."""
    out = subprocess.run(
        ["sbatch", "--parsable", *args],
        input=script,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip().split(";")[0]


def node_state(node: str) -> str:
    """sinfo's ``%T`` of ``node`` (``idle``, ``allocated``, ``down*``, ...)."""
    return run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.split()[0]


def resume_node(node: str) -> None:
    """Put ``node`` back in service (a node that isn't down is left as it is)."""
    state = node_state(node)
    if any(word in state for word in ("down", "drain", "fail")):
        run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def cluster_report() -> str:
    """What a person would look at when a test's job does not run: every node's state and
    reason (``sinfo -N``) and every job Slurm still knows (``squeue -t all``, with reasons)."""
    nodes = run("sinfo", "-h", "-N", "-o", "%N %T %E", check=False).stdout.strip()
    jobs = run(
        "squeue", "-h", "-t", "all", "-o", "%i %j %u %P %T %r %N", check=False
    ).stdout.strip()
    return f"--- sinfo -N:\n{nodes}\n--- squeue -t all:\n{jobs or '(none)'}"


def restore_cluster(timeout_s: float = 60.0) -> list[str]:
    """Make the shared test cluster whole for the next test: cancel every job still pending
    or running (a failed test's leftovers would take its nodes), resume every node left down
    or drained, and wait until no job is left and every node is idle.

    Returns:
        What was found wrong (e.g. ``["job 12 dj-x RUNNING", "node2 down"]``), empty if the
        cluster was whole.

    Raises:
        AssertionError: the cluster is still not whole after ``timeout_s`` seconds (with
            :func:`cluster_report`).
    """
    found: list[str] = []
    alive = run("squeue", "-h", "-o", "%i %j %T", check=False).stdout.split("\n")
    for line in filter(None, (row.strip() for row in alive)):
        found.append(f"job {line}")
        run("scancel", line.split()[0], check=False)
    for node in NODES:
        state = node_state(node)
        if any(word in state for word in ("down", "drain", "fail")):
            found.append(f"{node} {state}")
            resume_node(node)
    deadline = time.monotonic() + timeout_s
    while True:
        left = run("squeue", "-h", "-o", "%i", check=False).stdout.strip()
        states = [node_state(node) for node in NODES]
        if not left and all(state == "idle" for state in states):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"the Slurm test cluster is not whole\n{cluster_report()}")
        time.sleep(0.5)


@contextlib.contextmanager
def down_node(node: str, reason: str = "dispatch test") -> Iterator[None]:
    """``scontrol update nodename=NODE state=down`` for the body; the node is resumed in a
    ``finally``, whatever happens (never leave the cluster's nodes down)."""
    try:
        run("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}")
        yield
    finally:
        resume_node(node)


def output_env(text: str) -> dict[str, str]:
    """The ``DISPATCH_*`` variables a job printed (the last execution's win)."""
    pairs = (line.partition("=") for line in text.splitlines())
    return {key: value for key, sep, value in pairs if sep and key.startswith("DISPATCH_")}


class SlurmHarness(BackendHarness):
    """A :class:`SlurmBackend` on the test cluster, writing job output under ``tmp``."""

    settle_timeout_s: ClassVar[float] = 90.0
    gate_watch_s: ClassVar[float] = 4.0
    poll_interval_s: ClassVar[float] = 0.5

    def __init__(self, tmp: Path, **settings: Any) -> None:
        super().__init__()
        self.tmp = tmp
        self.out = tmp / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        settings.setdefault("output_dir", str(self.out))
        settings.setdefault("workdir", str(tmp))
        settings.setdefault("open_mode", "append")
        settings.setdefault("node_loss_window_s", 60.0)
        settings.setdefault("accounting_grace_s", 15.0)
        self.settings = SlurmSettings(**settings)
        self._backend = SlurmBackend(CLUSTER, self.settings)
        self.foreign: list[str] = []

    @property
    def backend(self) -> SlurmBackend:
        return self._backend

    def spec(
        self,
        program: Program,
        *,
        checkpoint: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> JobSpec:
        return JobSpec(
            cluster=CLUSTER,
            command=("/bin/sh", "-c", _PROGRAMS[program]),
            checkpoint=checkpoint,
            options=dict(options or {}),
        )

    def output_path(self, ref: ObjectRef) -> Path | None:
        found = sorted(self.out.glob(f"*-{ref.id}.out"))
        return found[0] if found else None

    async def output(self, ref: ObjectRef) -> str:
        def read() -> str:
            path = self.output_path(ref)
            return path.read_text() if path is not None else ""

        return await asyncio.to_thread(read)

    async def execution_env(self, ref: ObjectRef) -> Mapping[str, str] | None:
        env = output_env(await self.output(ref))
        return env or None

    async def inject_foreign(self, job_id: str) -> None:
        """A person's job named like dispatch's, without dispatch's comment."""
        job = await asyncio.to_thread(
            sbatch, f"--job-name=dj-{job_id}", "--output=/dev/null", "--wrap", "sleep 3600"
        )
        self.foreign.append(job)

    def unreachable(self) -> AbstractAsyncContextManager[None]:
        """Point the backend's commands at a copy of slurm.conf whose controller port is
        closed: every command then really fails with Slurm's ``Unable to contact slurm
        controller (connect failure)``."""
        bogus = self.tmp / "unreachable-slurm.conf"
        text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=6999", SLURM_CONF.read_text())
        bogus.write_text(text)

        @contextlib.asynccontextmanager
        async def outage() -> AsyncIterator[None]:
            self._backend.commands.extra_env["SLURM_CONF"] = str(bogus)
            try:
                yield
            finally:
                self._backend.commands.extra_env.pop("SLURM_CONF", None)

        return outage()

    async def cleanup(self) -> None:
        ids = [ref.id for ref in self.started] + self.foreign
        if ids:
            await asyncio.to_thread(run, "scancel", *ids, check=False)

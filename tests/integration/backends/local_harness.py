"""The local backend's plug-in for the contract suite, and helpers its own tests share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar

import dispatch_backends
from dispatch_backends.local import LocalBackend, kill_all
from dispatch_core.state import JobSpec, ObjectRef
from tests.contract.backend_contract import FAIL_EXIT_CODE, BackendHarness, Program

__all__ = ["CLUSTER", "CliResult", "LocalHarness", "cli", "shell"]

CLUSTER = "test-local"
_LIBS = str(Path(dispatch_backends.__file__).resolve().parent.parent)
"""Where dispatch's packages are, for the PYTHONPATH of CLI subprocesses."""
_PRINT_ENV = "env | grep '^DISPATCH_' || true"
_PROGRAMS: Mapping[Program, str] = {
    Program.SUCCEED: f"{_PRINT_ENV}; exit 0",
    Program.FAIL: f"{_PRINT_ENV}; exit {FAIL_EXIT_CODE}",
    Program.SLEEP: f"{_PRINT_ENV}; exec sleep 3600",
}


def shell(script: str) -> tuple[str, ...]:
    """A command running ``script`` with ``/bin/sh``."""
    return ("/bin/sh", "-c", script)


class LocalHarness(BackendHarness):
    """A :class:`LocalBackend` on a private data directory, with short kill waits."""

    settle_timeout_s: ClassVar[float] = 30.0

    def __init__(self, data_dir: Path, **options: Any) -> None:
        super().__init__()
        options.setdefault("kill_wait_s", 0.5)
        options.setdefault("node_loss_window_s", 5.0)
        self.data_dir = data_dir
        self._backend = LocalBackend(CLUSTER, data_dir, **options)

    @property
    def backend(self) -> LocalBackend:
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
            command=shell(_PROGRAMS[program]),
            checkpoint=checkpoint,
            options=dict(options or {}),
        )

    async def output(self, ref: ObjectRef, name: str = "stdout") -> str:
        """The object's ``stdout`` (or ``stderr``) so far."""
        path = self._backend.object_dir(ref) / name

        def read() -> str:
            try:
                return path.read_text()
            except FileNotFoundError:
                return ""

        return await asyncio.to_thread(read)

    async def execution_env(self, ref: ObjectRef) -> Mapping[str, str] | None:
        text = await self.output(ref)
        if not text:
            return None
        pairs = (line.partition("=") for line in text.splitlines())
        return {key: value for key, sep, value in pairs if sep and key.startswith("DISPATCH_")}

    async def inject_foreign(self, job_id: str) -> None:
        await asyncio.to_thread(self._backend.faults.foreign, job_id)

    def unreachable(self) -> AbstractAsyncContextManager[None]:
        @contextlib.asynccontextmanager
        async def outage() -> AsyncIterator[None]:
            await asyncio.to_thread(self._backend.faults.set_unreachable, True)
            try:
                yield
            finally:
                await asyncio.to_thread(self._backend.faults.set_unreachable, False)

        return outage()

    async def forget(self, ref: ObjectRef) -> None:
        """Archive the ended ``ref`` as the backend does past ``retain_ended_s``: a second
        backend on the same directory that retains nothing discovers once."""
        sweeper = LocalBackend(CLUSTER, self.data_dir, retain_ended_s=0.0)
        await sweeper.discover()
        assert (self.data_dir / "archive" / ref.id).is_dir(), f"{ref} was not archived"

    async def cleanup(self) -> None:
        await asyncio.to_thread(kill_all, self.data_dir)


class CliResult:
    """What a CLI run printed and returned."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"CliResult({self.returncode}, stdout={self.stdout!r}, stderr={self.stderr!r})"


async def cli(*args: str | os.PathLike[str], check: bool = True) -> CliResult:
    """Run ``python -m dispatch_backends.local ARGS`` in another process (as ``dispatch demo``
    or an operator would).

    Raises:
        AssertionError: ``check`` and it exited non-zero.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_LIBS, env.get("PYTHONPATH")) if p)
    argv: Sequence[str] = [str(a) for a in args]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch_backends.local",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    result = CliResult(proc.returncode or 0, out.decode(), err.decode())
    if check:
        assert result.returncode == 0, f"local CLI {argv} failed: {result}"
    return result

"""A dispatch runtime for the end-to-end tests on the local backend: an
:class:`~tests.e2e.installation.Installation` with a local backend's data directory and
clusters file, and jobs that print their ``DISPATCH_*`` environment and wait for a flag file.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from dispatch_backends.local import LocalBackend, kill_all
from dispatch_core import JobSpec, ObjectRef
from tests.e2e.installation import ALICE, InProcess, Installation, Subprocess
from tests.util import assert_eventually

__all__ = [
    "ALICE",
    "CLUSTER",
    "PRINT_ENV",
    "InProcess",
    "Runtime",
    "Subprocess",
    "shell",
    "until_flag",
]

CLUSTER: Final = "local"
PRINT_ENV: Final = "env | grep '^DISPATCH_' || true"


def shell(script: str) -> tuple[str, ...]:
    """A command running ``script`` with ``/bin/sh``."""
    return ("/bin/sh", "-c", script)


def until_flag(prefix: str = "") -> tuple[str, ...]:
    """A job that prints its ``DISPATCH_*`` environment, runs ``prefix``, then waits until
    the file ``$FLAG`` exists and exits 0."""
    return shell(f'{PRINT_ENV}; {prefix} while [ ! -e "$FLAG" ]; do sleep 0.1; done; exit 0')


class Runtime(Installation[LocalBackend]):
    """One dispatch installation on the local backend, for one test (see the module
    docstring)."""

    def __init__(
        self,
        nats_url: str,
        tmp: Path,
        *,
        poll_interval_s: float = 0.2,
        kill_wait_s: float = 1.0,
        node_loss_window_s: float = 60.0,
        retain_ended_s: float = 600.0,
        idempotent_start: bool = True,
    ) -> None:
        self.data_dir = tmp / "local"
        self.flag = tmp / "flag"
        super().__init__(
            nats_url,
            tmp,
            LocalBackend(
                CLUSTER,
                self.data_dir,
                kill_wait_s=kill_wait_s,
                node_loss_window_s=node_loss_window_s,
                retain_ended_s=retain_ended_s,
                workdir=tmp,
                idempotent_start=idempotent_start,
            ),
            clusters_toml=(
                "[[clusters]]\n"
                f'name = "{CLUSTER}"\n'
                'backend = "local"\n'
                f'data_dir = "{self.data_dir}"\n'
                f"kill_wait_s = {kill_wait_s}\n"
                f"node_loss_window_s = {node_loss_window_s}\n"
                f"retain_ended_s = {retain_ended_s}\n"
                f'workdir = "{tmp}"\n'
                f"idempotent_start = {'true' if idempotent_start else 'false'}\n"
            ),
            poll_interval_s=poll_interval_s,
        )

    async def _clear_backend(self) -> None:
        await asyncio.to_thread(kill_all, self.data_dir)

    # -- jobs -----------------------------------------------------------------------------------

    def spec(self, command: tuple[str, ...], **fields: Any) -> JobSpec:
        env = {"FLAG": str(self.flag), **fields.pop("env", {})}
        return JobSpec(cluster=CLUSTER, command=command, env=env, **fields)

    # -- the backend ---------------------------------------------------------------------------

    async def output(self, ref: ObjectRef) -> str:
        path = self.backend.object_dir(ref) / "stdout"

        def read() -> str:
            try:
                return path.read_text()
            except FileNotFoundError:
                return ""

        return await asyncio.to_thread(read)

    async def execution_env(self, ref: ObjectRef) -> dict[str, str]:
        """The ``DISPATCH_*`` variables the object's job printed (waits for them)."""

        async def probe() -> dict[str, str]:
            text = await self.output(ref)
            pairs = (line.partition("=") for line in text.splitlines())
            env = {k: v for k, sep, v in pairs if sep and k.startswith("DISPATCH_")}
            assert "DISPATCH_EPOCH" in env, f"{ref}: no DISPATCH_EPOCH printed yet: {text!r}"
            return env

        return await assert_eventually(probe, timeout_s=30.0, interval_s=0.1)

    async def ended_at(self, ref: ObjectRef) -> datetime:
        """When the object's processes ended, as its runner recorded it (``status.json``)."""
        path = self.backend.object_dir(ref) / "status.json"
        raw = msgspec.json.decode(await asyncio.to_thread(path.read_bytes))
        return datetime.fromisoformat(raw["ended_at"])

    async def preempt(self, ref: ObjectRef) -> None:
        await asyncio.to_thread(self.backend.faults.preempt, ref.id)

    async def node_lost(self, ref: ObjectRef) -> None:
        await asyncio.to_thread(self.backend.faults.node_lost, ref.id)

    async def foreign(self, job_id: str) -> ObjectRef:
        object_id = await asyncio.to_thread(self.backend.faults.foreign, job_id)
        return ObjectRef(cluster=CLUSTER, id=object_id)

    def release(self) -> None:
        """Create ``$FLAG``: jobs running :func:`until_flag` exit 0."""
        self.flag.touch()

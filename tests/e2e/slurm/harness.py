"""A dispatch installation on the Slurm test cluster for the end-to-end walkthrough: an
:class:`~tests.e2e.installation.Installation` whose clusters file names the cluster (``lab``,
the slurm backend), with the observer and a supervisor replica run in-process (as tasks of the
test's event loop) and the escalations the supervisor delivers kept in a list.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import ClassVar, Final

from dispatch_backends.slurm import SlurmBackend, SlurmSettings
from dispatch_core import Escalation
from dispatch_core.state import ObjectRef, ObservedObject
from tests.e2e.installation import Installation

__all__ = ["CLUSTER", "SlurmRuntime"]

CLUSTER: Final = "lab"


class SlurmRuntime(Installation[SlurmBackend]):
    """One dispatch installation on the Slurm test cluster, for one test."""

    namespace_prefix: ClassVar[str] = "s"
    log_level: ClassVar[str] = "warning"
    wait_timeout_s: ClassVar[float] = 120.0
    wait_interval_s: ClassVar[float] = 0.5

    def __init__(
        self,
        nats_url: str,
        tmp: Path,
        *,
        poll_interval_s: float = 1.0,
        node_loss_window_s: float = 60.0,
        accounting_grace_s: float = 20.0,
        users: tuple[str, ...] = (),
    ) -> None:
        self.out = tmp / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.settings = SlurmSettings(
            node_loss_window_s=node_loss_window_s,
            accounting_grace_s=accounting_grace_s,
            output_dir=str(self.out),
            workdir=str(tmp),
            open_mode="append",
            users=users,
        )
        self.escalations: list[tuple[str, Escalation]] = []
        super().__init__(
            nats_url,
            tmp,
            SlurmBackend(CLUSTER, self.settings),
            clusters_toml=(
                "[[clusters]]\n"
                f'name = "{CLUSTER}"\n'
                'backend = "slurm"\n'
                f"node_loss_window_s = {node_loss_window_s}\n"
                f"accounting_grace_s = {accounting_grace_s}\n"
                f'output_dir = "{self.out}"\n'
                f'workdir = "{tmp}"\n'
                'open_mode = "append"\n'
                f"users = {list(users)!r}\n".replace("'", '"')
            ),
            poll_interval_s=poll_interval_s,
            deliver=self._escalated,
        )

    async def _escalated(self, job_id: str, escalation: Escalation) -> None:
        """The supervisor's ``deliver``: keep the escalation in :attr:`escalations`."""
        self.escalations.append((job_id, escalation))

    async def _clear_backend(self) -> None:
        """Stop the test's Slurm jobs still alive (the cluster is shared)."""
        with contextlib.suppress(Exception):
            objects = await self.objects()
            for ref in [o.ref for j in self.jobs for o in objects.get(j, ()) if o.alive]:
                await self.backend.stop(ref)

    def _dump_extra(self, job_id: str) -> list[str]:
        return [f"--- escalations: {self.escalations}"]

    # -- the cluster ---------------------------------------------------------------------------

    async def observed(self, job_id: str, ref: ObjectRef) -> ObservedObject | None:
        objects = await self.objects()
        return next((o for o in objects.get(job_id, ()) if o.ref == ref), None)

    def output(self, ref: ObjectRef) -> str:
        """Everything the object's executions printed (one file, appended)."""
        found = sorted(self.out.glob(f"*-{ref.id}.out"))
        return found[0].read_text() if found else ""

"""A dispatch installation on the Slurm test cluster for the end-to-end walkthrough: an
:class:`~tests.e2e.installation.Installation` whose clusters file names the cluster (``lab``,
the slurm backend), with the observer and a supervisor replica run in-process (as tasks of the
test's event loop) and the escalations the supervisor delivers kept in a list.

With ``local=True`` the clusters file also names a local cluster (``local``, the local
backend, its data directory in the test's own), for jobs that fail over from Slurm to this
machine (issue 14 part 2): :attr:`SlurmRuntime.local` reads its objects' output, and
:meth:`SlurmRuntime.observer` with ``cluster=LOCAL`` runs its observer.

:func:`all_nodes_down` sets every node of the test cluster down for a block and resumes them in
a ``finally``, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, Final

from dispatch_backends.local import LocalBackend, ObjectNotFound, kill_all
from dispatch_backends.slurm import SlurmBackend, SlurmSettings
from dispatch_core import Escalation
from dispatch_core.state import ObjectRef, ObservedObject
from tests.e2e.installation import Installation
from tests.integration.slurm.test_slurm_support import resume_node, run

__all__ = ["CLUSTER", "LOCAL", "SlurmRuntime", "all_nodes_down", "nodes"]

CLUSTER: Final = "lab"
LOCAL: Final = "local"
"""The local cluster's name, when the installation has one (``local=True``)."""


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
        local: bool = False,
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
        self.local_dir = tmp / "local"
        self.local: LocalBackend | None = None
        local_toml = ""
        if local:
            self.local = LocalBackend(LOCAL, self.local_dir, kill_wait_s=1.0, workdir=tmp)
            local_toml = (
                "\n[[clusters]]\n"
                f'name = "{LOCAL}"\n'
                'backend = "local"\n'
                f'data_dir = "{self.local_dir}"\n'
                "kill_wait_s = 1.0\n"
                f'workdir = "{tmp}"\n'
            )
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
                + local_toml
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
        if self.local is not None:
            await asyncio.to_thread(kill_all, self.local_dir)

    def _dump_extra(self, job_id: str) -> list[str]:
        return [f"--- escalations: {self.escalations}"]

    # -- the cluster ---------------------------------------------------------------------------

    async def observed(self, job_id: str, ref: ObjectRef) -> ObservedObject | None:
        objects = await self.objects()
        return next((o for o in objects.get(job_id, ()) if o.ref == ref), None)

    def output(self, ref: ObjectRef) -> str:
        """Everything the object's executions printed (one file, appended)."""
        if ref.cluster == LOCAL:
            assert self.local is not None
            try:
                return (self.local.object_dir(ref) / "stdout").read_text()
            except (FileNotFoundError, ObjectNotFound):
                return ""
        found = sorted(self.out.glob(f"*-{ref.id}.out"))
        return found[0].read_text() if found else ""


def nodes() -> list[str]:
    """Every node of the test cluster (``node1`` ...)."""
    return sorted(set(run("sinfo", "-h", "-N", "-o", "%N").stdout.split()))


@contextlib.contextmanager
def all_nodes_down(reason: str = "dispatch test") -> Iterator[list[str]]:
    """``scontrol update nodename=<every node> state=down`` for the body (the cluster has no
    capacity left: jobs running there end ``NODE_FAIL``); every node is resumed in a
    ``finally``, whatever happens, so later tests find the cluster whole."""
    every = nodes()
    try:
        run("scontrol", "update", f"nodename={','.join(every)}", "state=down", f"reason={reason}")
        yield every
    finally:
        for node in every:
            with contextlib.suppress(Exception):
                resume_node(node)

"""Plain PyTorch: save a state into the execution folder and publish it; load the latest.

    from dispatch_ckpt.integrations.torch import TorchCheckpoints

    ckpts = TorchCheckpoints(root)                      # reads DISPATCH_ATTEMPT/EPOCH
    resumed = ckpts.load_latest()                       # None on a first execution
    if resumed is not None:
        model.load_state_dict(resumed.state["model"]); start = resumed.publication.step
    ...
    ckpts.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)

Each save is one ``torch.save`` file, ``<root>/exec/<attempt>/step-<step:020d>.pt``, written
whole before it is published (POSIX: temporary name, fsync, rename inside the execution's
own folder; S3: one PUT), so a publication never points at a half-written file (seed 004).
The state is serialized in memory first; for states too large for that, save with PyTorch
DCP and publish with ``dispatch-ckpt watch``.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import msgspec
import torch

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.errors import AlreadyPublished, IncompatibleSave
from dispatch_ckpt.integrations import opened
from dispatch_ckpt.names import Publication, encode_name
from dispatch_ckpt.store import PUB_DIR

__all__ = ["Resumed", "TorchCheckpoints"]


class Resumed(msgspec.Struct, frozen=True, kw_only=True):
    """The latest published state, loaded."""

    publication: Publication
    """Which save it is (epoch, step, path under the root)."""
    state: Any
    """What ``torch.load`` returned: the object given to :meth:`TorchCheckpoints.save`."""


class TorchCheckpoints:
    """Save and publish ``torch.save`` states; load the latest (seed 004)."""

    def __init__(
        self,
        root: str | None = None,
        *,
        ckpt: Checkpoints | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """Open the root for this execution.

        Args:
            root, ckpt, environ: the root to publish to (:func:`opened`).

        Raises:
            ValueError: neither or both of ``root`` and ``ckpt`` given.
            InvalidRoot, InvalidEnvironment: see :meth:`Checkpoints.open`.
        """
        self.ckpt = opened(root, ckpt, environ)

    def save_relpath(self, step: int) -> str:
        """Return where :meth:`save` puts ``step``: ``exec/<attempt>/step-<step:020d>.pt``."""
        return f"{self.ckpt.exec_relpath()}/step-{step:020d}.pt"

    def save(self, state: object, step: int) -> Publication:
        """Write ``state`` with ``torch.save`` into the execution folder, then publish it.

        Args:
            state: what to save (typically a dict of ``state_dict()`` s).
            step: the training step it belongs to.

        Returns:
            The publication.

        Raises:
            MissingEnvironment: ``DISPATCH_ATTEMPT`` or ``DISPATCH_EPOCH`` missing.
            AlreadyPublished: this step was published already by this execution (found
                before anything is written, so the published file is left as it was).
            StoreError: the store failed.
        """
        self.ckpt.exec_dir()
        relpath = self.save_relpath(step)
        name = encode_name(self.ckpt.env.require_epoch("save"), step, relpath)
        if self.ckpt.store.exists(f"{PUB_DIR}/{name}"):
            # Checked before writing: rewriting the file would change a published save.
            # Nothing but this execution writes its folder, so the check can't go stale.
            raise AlreadyPublished(name, self.ckpt.store.location(f"{PUB_DIR}/{name}"))
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.ckpt.store.write_bytes(relpath, buffer.getvalue())
        return self.ckpt.publish_relpath(step, relpath)

    def load_latest(
        self, *, map_location: str | torch.device | None = "cpu", weights_only: bool = True
    ) -> Resumed | None:
        """Load the latest publication (greatest epoch, then step), wherever it was saved.

        A superseding job reading a root it shares with the job it superseded loads that
        job's latest save until it publishes its own (seed 004).

        Args:
            map_location: passed to ``torch.load``.
            weights_only: passed to ``torch.load`` (``True``: tensors and plain containers
                only, PyTorch's safe default).

        Returns:
            The state and its publication, or ``None`` when nothing is published.

        Raises:
            MalformedName: an entry in ``pub/`` doesn't parse.
            IncompatibleSave: the latest save is not a file (e.g. a folder another tool
                published).
            StoreError: the store failed.
        """
        pub = self.ckpt.latest()
        if pub is None:
            return None
        raw = self.ckpt.store.read_bytes(pub.path)
        if raw is None:
            raise IncompatibleSave(
                self.ckpt.location(pub), "expected a torch.save file, found no file there"
            )
        state = torch.load(io.BytesIO(raw), map_location=map_location, weights_only=weights_only)
        return Resumed(publication=pub, state=state)

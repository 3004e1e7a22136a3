"""PyTorch Lightning: a ``ModelCheckpoint`` that saves into the execution folder and
publishes each checkpoint (seed 004).

    from dispatch_ckpt.integrations.lightning import DispatchModelCheckpoint

    cb = DispatchModelCheckpoint(root, every_n_train_steps=500)   # DISPATCH_ATTEMPT/EPOCH
    trainer = lightning.Trainer(callbacks=[cb], ...)
    trainer.fit(model, ckpt_path=cb.resume_path())

Lightning's ``trainer.save_checkpoint`` returns once every rank has written (it ends with a
barrier); then the global rank zero publishes the file at ``trainer.global_step``. The
checkpoints go to ``<root>/exec/<attempt>/`` unless ``dirpath`` names a folder inside it;
``save_top_k`` deletes only this execution's files there. ``resume_path()`` is the latest
publication, this job's or (for a superseding job sharing the root) the superseded job's.
Resuming another execution's file, Lightning warns "The dirpath has changed" and leaves that
folder's top-k bookkeeping behind: as intended, this execution never rotates another's files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.errors import InvalidPath
from dispatch_ckpt.integrations import opened
from dispatch_ckpt.names import Publication

__all__ = ["DispatchModelCheckpoint"]


class DispatchModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` into the execution folder, publishing every file it saves."""

    def __init__(
        self,
        root: str | None = None,
        *,
        ckpt: Checkpoints | None = None,
        environ: Mapping[str, str] | None = None,
        dirpath: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Open the root for this execution and configure ``ModelCheckpoint``.

        Args:
            root, ckpt, environ: the root to publish to (:func:`opened`).
            dirpath: where to save, inside the execution folder; default: the folder itself.
            **kwargs: the other ``ModelCheckpoint`` arguments (``every_n_train_steps``,
                ``save_top_k``, ``filename``, ...).

        Raises:
            ValueError: neither or both of ``root`` and ``ckpt`` given.
            InvalidPath: ``dirpath`` is outside the execution folder.
            MissingEnvironment: ``DISPATCH_ATTEMPT`` missing.
        """
        self.ckpt = opened(root, ckpt, environ)
        exec_dir = self.ckpt.exec_dir()
        if dirpath is None:
            dirpath = exec_dir
        else:
            exec_rel = self.ckpt.exec_relpath()
            rel = self.ckpt.store.relpath(dirpath)
            if rel != exec_rel and not rel.startswith(exec_rel + "/"):
                raise InvalidPath(
                    dirpath,
                    self.ckpt.root,
                    f"expected a folder inside the execution folder {exec_dir}",
                )
        super().__init__(dirpath=dirpath, **kwargs)
        #: Publications this callback made, oldest first.
        self.published: list[Publication] = []

    def resume_path(self) -> str | None:
        """Return the latest publication's file, for ``trainer.fit(ckpt_path=...)``.

        Returns:
            Its location, or ``None`` when nothing is published (start from scratch).

        Raises:
            MalformedName: an entry in ``pub/`` doesn't parse.
            StoreError: the store failed.
        """
        pub = self.ckpt.latest()
        return None if pub is None else self.ckpt.location(pub)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        # ModelCheckpoint's one place that writes a file (top-k, last, on exception).
        super()._save_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            self.published.append(self.ckpt.publish(int(trainer.global_step), filepath))

"""Hugging Face Trainer: publish each save, resume from the latest publication (seed 004).

    from dispatch_ckpt.integrations.hf import DispatchCallback

    cb = DispatchCallback(root)                       # reads DISPATCH_ATTEMPT/EPOCH
    args = TrainingArguments(output_dir=cb.output_dir, save_steps=500, ...)
    trainer = Trainer(model=model, args=args, callbacks=[cb], ...)
    trainer.train(resume_from_checkpoint=cb.resume_from_checkpoint())

The Trainer saves ``checkpoint-<step>`` folders into the execution's own folder, where its
rotation (``save_total_limit``) can only delete this execution's saves. After each save
(model, optimizer, scheduler, RNG and ``trainer_state.json`` written) every rank waits for
the others, then the world's process zero publishes the folder. ``resume_from_checkpoint``
is the latest publication: this job's, or, for a superseding job sharing the root, the
superseded job's, until this one publishes.

The Trainer writes to local folders, so the root must be a path (a shared file system for
several nodes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.errors import InvalidPath, InvalidRoot
from dispatch_ckpt.integrations import opened
from dispatch_ckpt.names import Publication
from dispatch_ckpt.posix import PosixStore

__all__ = ["DispatchCallback"]


class DispatchCallback(TrainerCallback):
    """A ``TrainerCallback`` that publishes each ``checkpoint-<step>`` the Trainer saves."""

    def __init__(
        self,
        root: str | None = None,
        *,
        ckpt: Checkpoints | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """Open the root for this execution.

        Args:
            root, ckpt, environ: the root to publish to (:func:`opened`); a path.

        Raises:
            ValueError: neither or both of ``root`` and ``ckpt`` given.
            InvalidRoot: the root is not a path (the Trainer saves to local folders).
            InvalidEnvironment: see :meth:`Checkpoints.open`.
        """
        self.ckpt = opened(root, ckpt, environ)
        if not isinstance(self.ckpt.store, PosixStore):
            raise InvalidRoot(
                self.ckpt.root,
                "expected a path: the Hugging Face Trainer saves to local folders",
            )
        #: Publications this callback made, oldest first.
        self.published: list[Publication] = []

    @property
    def output_dir(self) -> str:
        """The execution folder, ``<root>/exec/<DISPATCH_ATTEMPT>`` (created): give it to
        ``TrainingArguments(output_dir=...)``.

        Raises:
            MissingEnvironment: ``DISPATCH_ATTEMPT`` missing.
        """
        return self.ckpt.exec_dir()

    def resume_from_checkpoint(self) -> str | None:
        """Return the latest publication's folder, for ``trainer.train(resume_from_checkpoint=)``.

        Returns:
            The folder's path, or ``None`` when nothing is published (start from scratch).

        Raises:
            MalformedName: an entry in ``pub/`` doesn't parse.
            StoreError: the store failed.
        """
        pub = self.ckpt.latest()
        return None if pub is None else self.ckpt.location(pub)

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Refuse an ``output_dir`` outside the execution folder (seed 004: each execution
        writes into its own folder, where no other execution's rotation reaches).

        Raises:
            InvalidPath: ``args.output_dir`` is not inside ``<root>/exec/<attempt>``.
        """
        exec_dir = os.path.realpath(self.output_dir)
        out = os.path.realpath(str(args.output_dir))
        if out != exec_dir and not out.startswith(exec_dir + os.sep):
            raise InvalidPath(
                str(args.output_dir),
                self.ckpt.root,
                f"expected the Trainer's output_dir inside the execution folder {exec_dir}",
            )

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Publish ``<output_dir>/checkpoint-<global_step>`` once every rank has saved.

        Raises:
            AlreadyPublished, StoreError, MissingEnvironment: see :meth:`Checkpoints.publish`.
        """
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank's shards are written before the save is published
        if not state.is_world_process_zero:
            return
        folder = os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self.published.append(self.ckpt.publish(int(state.global_step), folder))

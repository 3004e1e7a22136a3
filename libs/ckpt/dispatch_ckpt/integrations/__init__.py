"""Framework integrations of the checkpoint helper (seed 004).

Each module imports its framework when it is imported itself, and ``dispatch_ckpt`` never
imports them, so the core install needs none of the frameworks (extras ``torch``, ``hf``,
``lightning``):

* :mod:`dispatch_ckpt.integrations.torch`: ``TorchCheckpoints.save(state, step)`` into the
  execution folder and publish; ``load_latest()``;
* :mod:`dispatch_ckpt.integrations.hf`: a Hugging Face ``TrainerCallback`` that publishes
  each save and gives the checkpoint to resume from;
* :mod:`dispatch_ckpt.integrations.lightning`: a PyTorch Lightning ``ModelCheckpoint`` that
  saves into the execution folder and publishes each checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dispatch_ckpt.checkpoints import Checkpoints

__all__ = ["opened"]


def opened(
    root: str | None, ckpt: Checkpoints | None, environ: Mapping[str, str] | None
) -> Checkpoints:
    """The root an integration publishes to: ``ckpt`` (an opened root: its attempt and
    epoch are used), or ``root`` opened for this execution (a path, or
    ``s3://bucket/prefix``), reading ``DISPATCH_ATTEMPT`` / ``DISPATCH_EPOCH`` from
    ``environ`` (default ``os.environ``).

    Raises:
        ValueError: neither or both of ``root`` and ``ckpt`` given.
        InvalidRoot, InvalidEnvironment: see :meth:`Checkpoints.open`.
    """
    if (root is None) == (ckpt is None):
        raise ValueError("give exactly one of root and ckpt")
    return ckpt if ckpt is not None else Checkpoints.open(str(root), environ or os.environ)

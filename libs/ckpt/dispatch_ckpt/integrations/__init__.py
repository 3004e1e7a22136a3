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

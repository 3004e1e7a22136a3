"""The PyTorch Lightning callback with real Lightning on CPU: checkpoints go into the
execution folder and each is published; a replacement resumes from the latest publication
and outranks the old run (seed 004)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from dispatch_ckpt import Checkpoints, InvalidPath
from dispatch_ckpt.integrations.lightning import DispatchModelCheckpoint
from dispatch_core.epoch import epoch

OLD = epoch(0, 1, 0)
NEW = epoch(0, 2, 0)

pytestmark = pytest.mark.filterwarnings(
    # Lightning's advice for a 2-core test box, not a fault: few workers, few batches.
    "ignore:The '.*dataloader' does not have many workers:UserWarning",
    "ignore:The number of training batches .* is smaller than the logging interval:UserWarning",
    "ignore:.*`LightningModule.configure_optimizers` returned `None`:UserWarning",
    "ignore:GPU available but not used:UserWarning",
    "ignore:.*litlogger.*:UserWarning",
    # This machine has Slurm's srun (the Slurm lab); the test runs outside any allocation.
    "ignore:The `srun` command is available on your system but is not used",
    # Lightning 2.6 still calls a torch.utils._pytree API that torch 2.13 deprecates.
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning",
    # Expected when a replacement resumes another execution's checkpoint: Lightning keeps
    # the old folder's top-k bookkeeping out of the new folder, which is what isolation wants.
    "ignore:The dirpath has changed from:UserWarning",
    # The test saves every 2 steps, mid-epoch, with a plain DataLoader.
    "ignore:You're resuming from a checkpoint that ended before the epoch ended",
)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss: torch.Tensor = (self.layer(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader() -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    )
    return torch.utils.data.DataLoader(data, batch_size=8)


def fit(cb: DispatchModelCheckpoint, max_steps: int, ckpt_path: str | None) -> pl.Trainer:
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=[cb],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), train_dataloaders=loader(), ckpt_path=ckpt_path)
    return trainer


def identity(attempt: str, ep: int) -> dict[str, str]:
    return {"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(ep)}


def test_lightning_publishes_each_checkpoint_and_a_replacement_resumes(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    old_cb = DispatchModelCheckpoint(
        root, environ=identity("old", OLD), every_n_train_steps=2, save_top_k=-1
    )
    assert old_cb.resume_path() is None
    fit(old_cb, max_steps=4, ckpt_path=old_cb.resume_path())
    assert [(p.epoch, p.step) for p in old_cb.published] == [(OLD, 2), (OLD, 4)]
    for pub in old_cb.published:
        assert pub.path.startswith("exec/old/")
        assert os.path.isfile(old_cb.ckpt.location(pub))

    new_cb = DispatchModelCheckpoint(
        root, environ=identity("new", NEW), every_n_train_steps=2, save_top_k=-1
    )
    resume = new_cb.resume_path()
    assert resume == old_cb.ckpt.location(old_cb.published[-1])
    trainer = fit(new_cb, max_steps=6, ckpt_path=resume)
    assert trainer.global_step == 6
    assert [p.step for p in new_cb.published] == [6]
    assert all(p.path.startswith("exec/new/") for p in new_cb.published)

    latest = Checkpoints.open(root).latest()
    assert latest is not None
    assert (latest.epoch, latest.step) == (NEW, 6)


def test_dirpath_outside_the_execution_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidPath, match="inside the execution folder"):
        DispatchModelCheckpoint(
            str(tmp_path / "ckpt"), environ=identity("a", OLD), dirpath=str(tmp_path / "ckpt" / "x")
        )
    inside = DispatchModelCheckpoint(
        str(tmp_path / "ckpt"),
        environ=identity("a", OLD),
        dirpath=str(tmp_path / "ckpt" / "exec" / "a" / "lightning"),
    )
    assert str(inside.dirpath).endswith("exec/a/lightning")

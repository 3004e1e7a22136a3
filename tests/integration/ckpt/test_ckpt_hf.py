"""The Hugging Face TrainerCallback, driving a real transformers Trainer on CPU with a tiny
GPT-2 built from a config (nothing downloaded): it publishes each save, and a replacement
(higher epoch) resumes from the latest publication and outranks the old run (seed 004)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from dispatch_ckpt import Checkpoints, InvalidPath, InvalidRoot
from dispatch_ckpt.integrations.hf import DispatchCallback
from dispatch_core.epoch import epoch

OLD = epoch(0, 1, 0)
NEW = epoch(0, 2, 0)


class TinyText(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """32 sequences of 8 tokens from a 64-token vocabulary."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 64, (32, 8), generator=gen)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    return GPT2LMHeadModel(config)


def trainer_for(cb: DispatchCallback, max_steps: int, output_dir: str | None = None) -> Trainer:
    args = TrainingArguments(
        output_dir=output_dir or cb.output_dir,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        seed=0,
    )
    return Trainer(model=tiny_model(), args=args, train_dataset=TinyText(), callbacks=[cb])


def identity(attempt: str, ep: int) -> dict[str, str]:
    return {"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(ep)}


def test_trainer_publishes_each_save_and_a_replacement_resumes(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    old_cb = DispatchCallback(root, environ=identity("old", OLD))
    assert old_cb.resume_from_checkpoint() is None
    old = trainer_for(old_cb, max_steps=4)
    old.train(resume_from_checkpoint=old_cb.resume_from_checkpoint())
    assert [(p.epoch, p.step, p.path) for p in old_cb.published] == [
        (OLD, 2, "exec/old/checkpoint-2"),
        (OLD, 4, "exec/old/checkpoint-4"),
    ]
    for pub in old_cb.published:
        folder = Path(old_cb.ckpt.location(pub))
        assert (folder / "trainer_state.json").is_file()  # a complete save was published

    # The replacement resumes from the old run's latest save, in its own folder.
    new_cb = DispatchCallback(root, environ=identity("new", NEW))
    resume = new_cb.resume_from_checkpoint()
    assert resume == os.path.realpath(tmp_path / "ckpt" / "exec" / "old" / "checkpoint-4")
    new = trainer_for(new_cb, max_steps=6)
    new.train(resume_from_checkpoint=resume)
    assert new.state.global_step == 6
    assert [p.step for p in new_cb.published] == [6]  # steps 1-4 came from the resume
    assert sorted(os.listdir(tmp_path / "ckpt" / "exec" / "new")) == ["checkpoint-6"]

    latest = Checkpoints.open(root).latest()
    assert latest is not None
    assert (latest.epoch, latest.step, latest.path) == (NEW, 6, "exec/new/checkpoint-6")

    # The old run, still alive, trains on and saves higher steps: never the latest.
    old_cb_late = DispatchCallback(root, environ=identity("old", OLD))
    late = trainer_for(old_cb_late, max_steps=8)
    late.train(resume_from_checkpoint=str(tmp_path / "ckpt" / "exec" / "old" / "checkpoint-4"))
    assert [p.step for p in old_cb_late.published] == [6, 8]
    latest = Checkpoints.open(root).latest()
    assert latest is not None
    assert (latest.epoch, latest.step) == (NEW, 6)


def test_output_dir_outside_the_execution_folder_is_refused(tmp_path: Path) -> None:
    cb = DispatchCallback(str(tmp_path / "ckpt"), environ=identity("a", OLD))
    trainer = trainer_for(cb, max_steps=2, output_dir=str(tmp_path / "shared"))
    with pytest.raises(InvalidPath, match="inside the execution folder"):
        trainer.train()


def test_s3_root_is_refused_for_the_trainer() -> None:
    with pytest.raises(InvalidRoot, match="local folders"):
        DispatchCallback("s3://bucket/job", environ=identity("a", OLD))

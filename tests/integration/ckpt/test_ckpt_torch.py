"""The plain-PyTorch helper with real torch (seed 004): save(state, step) into the execution
folder and publish; load_latest() picks the greatest epoch, then step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dispatch_ckpt import AlreadyPublished, Checkpoints, IncompatibleSave
from dispatch_ckpt.integrations.torch import TorchCheckpoints
from dispatch_core.epoch import epoch

OLD = epoch(0, 1, 0)
NEW = epoch(0, 2, 0)


def identity(attempt: str, ep: int) -> dict[str, str]:
    return {"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(ep)}


def train_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=gen)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def check_helper(root: str) -> None:
    old = TorchCheckpoints(root, environ=identity("old", OLD))
    assert old.load_latest() is None  # a first execution starts from scratch
    model, opt = make()
    train_steps(model, opt, 3)
    pub = old.save({"model": model.state_dict(), "optim": opt.state_dict()}, 3)
    assert pub.path == "exec/old/step-00000000000000000003.pt"
    with pytest.raises(AlreadyPublished):
        old.save({"model": model.state_dict()}, 3)

    # The replacement resumes from the old execution's save and continues.
    new = TorchCheckpoints(root, environ=identity("new", NEW))
    resumed = new.load_latest()
    assert resumed is not None
    assert resumed.publication == pub
    model2, opt2 = make()
    model2.load_state_dict(resumed.state["model"])
    opt2.load_state_dict(resumed.state["optim"])
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    train_steps(model2, opt2, 1)
    mine = new.save({"model": model2.state_dict(), "optim": opt2.state_dict()}, 4)

    # The old run, still alive, saves a far higher step late: it never outranks.
    old.save({"model": model.state_dict(), "optim": opt.state_dict()}, 10_000)
    latest = new.load_latest()
    assert latest is not None
    assert latest.publication == mine
    assert torch.equal(latest.state["model"]["weight"], model2.state_dict()["weight"])


def test_torch_helper_on_posix(tmp_path: Path) -> None:
    check_helper(str(tmp_path))


@pytest.mark.integration
def test_torch_helper_on_s3(s3_root: str) -> None:
    check_helper(s3_root)


def test_load_latest_refuses_a_save_it_cannot_read(tmp_path: Path) -> None:
    ckpt = Checkpoints.open(str(tmp_path), identity("a", OLD))
    folder = Path(ckpt.exec_dir()) / "checkpoint-5"
    folder.mkdir()
    ckpt.publish(5, str(folder))
    with pytest.raises(IncompatibleSave, match=r"expected a torch\.save file"):
        TorchCheckpoints(ckpt=ckpt).load_latest()

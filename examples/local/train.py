"""Train a small MLP on scikit-learn's digits, on CPU, checkpointing through dispatch_ckpt.

The training job of ``dispatch demo`` (and of ``examples/local-train.toml``). Each epoch
ends with a checkpoint saved into this execution's own folder and published
(``TorchCheckpoints.save``); a new execution resumes from the latest published one
(``load_latest``), so a preempted run continues where its last checkpoint left it. Batches
are shuffled by a generator seeded with (seed, epoch), so a resumed run sees the same data
in the same order as one that was never interrupted.

    python examples/local/train.py --epochs 12                   # no checkpoints
    dispatch submit examples/local-train.toml --watch            # under dispatch

Without scikit-learn (the ``examples`` extra) it trains on a seeded synthetic data set of
the same shape instead, and says so.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import torch
from torch import nn

from dispatch_ckpt.integrations.torch import TorchCheckpoints


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The digits (8x8 images scaled to [0, 1], labels 0-9), or a synthetic stand-in."""
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        g = torch.Generator().manual_seed(seed)
        centers = torch.rand(10, 64, generator=g)
        labels = torch.randint(0, 10, (1797,), generator=g)
        x = (centers[labels] + 0.25 * torch.randn(1797, 64, generator=g)).clamp(0, 1)
        return x, labels, "synthetic digits-shaped data (scikit-learn is not installed)"
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return x, y, "scikit-learn digits (1797 8x8 images)"


def main(argv: list[str] | None = None) -> int:
    """Train; return the exit status."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--epochs", type=int, default=12, help="epochs to train in all")
    parser.add_argument("--epoch-s", type=float, default=0.0, help="least seconds per epoch")
    parser.add_argument("--batch", type=int, default=64, help="examples per step")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data split and order")
    parser.add_argument(
        "--root",
        default=os.environ.get("DISPATCH_CHECKPOINT"),
        help="checkpoint root (dispatch sets DISPATCH_CHECKPOINT; none: no checkpoints)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: one thread is fastest and leaves a core free
    torch.manual_seed(args.seed)

    for name in ("DISPATCH_JOB", "DISPATCH_SUBMISSION", "DISPATCH_EPOCH", "DISPATCH_ATTEMPT"):
        if name in os.environ:
            print(f"{name}={os.environ[name]}")

    x, y, source = load_data(args.seed)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    cut = int(0.8 * len(x))
    train_x, train_y = x[order[:cut]], y[order[:cut]]
    test_x, test_y = x[order[cut:]], y[order[cut:]]
    print(f"data: {source}; {len(train_x)} to train on, {len(test_x)} to test")

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    ckpts = TorchCheckpoints(args.root) if args.root else None
    start_epoch, step = 0, 0
    loss_value = float("nan")  # the last epoch's mean training loss (saved with each checkpoint)
    resumed = ckpts.load_latest() if ckpts is not None else None
    if resumed is not None:
        state: dict[str, Any] = resumed.state
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, step = int(state["epoch"]), int(state["step"])
        loss_value = float(state.get("loss", float("nan")))
        print(
            f"resumed from checkpoint step {step} (after epoch {start_epoch}, published "
            f"with DISPATCH_EPOCH {resumed.publication.epoch})"
        )
    elif ckpts is not None:
        print("no checkpoint published yet: starting from step 0")

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        print(f"SIGTERM at step {step}: stopping (the latest published checkpoint survives)")
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)

    def test_accuracy() -> float:
        model.eval()
        with torch.no_grad():
            return float((model(test_x).argmax(1) == test_y).float().mean())

    for epoch in range(start_epoch, args.epochs):
        began = time.monotonic()
        model.train()
        perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(
            args.seed * 100_003 + epoch))  # fmt: skip
        total, batches = 0.0, 0
        for i in range(0, len(perm), args.batch):
            idx = perm[i : i + args.batch]
            optimizer.zero_grad()
            loss = loss_fn(model(train_x[idx]), train_y[idx])
            loss.backward()
            optimizer.step()
            step += 1
            total += loss.item()
            batches += 1
        loss_value = total / batches
        accuracy = test_accuracy()
        note = ""
        if ckpts is not None:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch + 1,
                "step": step,
                "loss": loss_value,
            }
            ckpts.save(state, step)
            note = f"  checkpoint step {step} published"
        print(
            f"epoch {epoch + 1}/{args.epochs}  step {step}  loss {loss_value:.4f}  "
            f"test accuracy {accuracy:.3f}{note}"
        )
        time.sleep(max(0.0, args.epoch_s - (time.monotonic() - began)))
    if start_epoch >= args.epochs:
        print("the checkpoint already holds every epoch: nothing left to train")
    accuracy = test_accuracy()
    print(f"done: final loss {loss_value:.4f}  test accuracy {accuracy:.3f}  after {step} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a small MLP on scikit-learn's handwritten digits, on CPU, under Slurm and dispatch.

The main job of ``examples/slurm/`` (README: "Run on Slurm"). Every epoch ends with a
checkpoint saved into this execution's own folder and published through ``dispatch_ckpt``
(``TorchCheckpoints.save``: ``<root>/exec/<DISPATCH_ATTEMPT>/step-<epochs done>.pt``, then a
publication in ``<root>/pub/``); an execution starts from the latest publication
(``load_latest``: greatest ``DISPATCH_EPOCH``, then step), so a preempted, node-lost or
timed-out run continues where its last checkpoint left it.

It is reproducible: the data split, the initial weights and each epoch's batch order come
from ``--seed`` (the order of epoch k from a generator seeded with ``(seed, k)``), the model,
the optimizer's momentum and the epoch are all in the checkpoint, and torch runs on one
thread. So a run interrupted any number of times ends with the same final loss as one that
never was (the walkthrough checks it to 1e-6; in practice it is bit for bit).

    python examples/slurm/train.py                       # once, no checkpoints (the reference)
    sbatch ... / dispatch submit examples/slurm/digits.toml  # under Slurm and dispatch

Output, one line each: the ``DISPATCH_*`` variables, ``resumed <path> epoch=<E> step=<S>``
(or ``fresh start``), ``epoch <k> loss <L> saved step=<S>``, and at the end
``final loss <L> accuracy <A>``; ``--result FILE`` also writes them as JSON.

``--straggle-s S`` is for the REQUEUE walkthrough only: on SIGTERM (Slurm preempting the
job) the process starts a detached straggler, in a session of its own, that re-publishes this
execution's last checkpoint S seconds later under step ``1000000``, the way an old run cut off
from the scheduler publishes late (seed 004). Slurm's ``proctrack/linuxproc`` does not track a
process reparented to init (slurm-lab README, "Escapes"), so Slurm doesn't kill it; its
publication carries the old execution's epoch, which never outranks the replacement's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn

from dispatch_ckpt.integrations.torch import TorchCheckpoints

STRAGGLER_STEP = 1_000_000
"""The step a straggler publishes under: higher than any real one, to show it still loses."""


def load_digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits: 1797 8x8 images scaled to [0, 1], labels 0-9."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped,unused-ignore]

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return x, y


def _straggle(root: str, delay_s: float, source: str) -> int:
    """The straggler: wait, then publish the state saved at ``source`` again (as the old
    execution: its DISPATCH_ATTEMPT and DISPATCH_EPOCH are inherited)."""
    time.sleep(delay_s)
    ckpts = TorchCheckpoints(root)
    state = torch.load(source, map_location="cpu", weights_only=True)
    pub = ckpts.save(state, STRAGGLER_STEP)
    print(f"straggler published {pub.path} epoch={pub.epoch} step={pub.step}", flush=True)
    return 0


def _evaluate(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(loss_fn(model(x), y))


def main(argv: list[str] | None = None) -> int:
    """Train; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--epoch-s", type=float, default=0.0, help="least seconds per epoch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default=os.environ.get("DISPATCH_CHECKPOINT"))
    parser.add_argument("--result", default=None, help="write the final metrics here (JSON)")
    parser.add_argument("--straggle-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--straggler-from", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.straggler_from is not None:
        return _straggle(args.root, args.straggle_s, args.straggler_from)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in ("DISPATCH_JOB", "DISPATCH_SUBMISSION", "DISPATCH_EPOCH", "DISPATCH_ATTEMPT"):
        if name in os.environ:
            print(f"{name}={os.environ[name]}", flush=True)
    print(
        f"node={os.environ.get('SLURMD_NODENAME', '-')} job={os.environ.get('SLURM_JOB_ID', '-')}"
    )

    x, y = load_digits_data()
    split = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    cut = int(0.8 * len(x))
    train_x, train_y = x[split[:cut]], y[split[:cut]]
    test_x, test_y = x[split[cut:]], y[split[cut:]]

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    ckpts = TorchCheckpoints(args.root) if args.root else None
    start = 0
    last_save: list[str] = []
    if ckpts is not None:
        resumed = ckpts.load_latest()
        if resumed is None:
            print("fresh start", flush=True)
        else:
            state: dict[str, Any] = resumed.state
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
            start = int(state["epochs_done"])
            pub = resumed.publication
            print(f"resumed {pub.path} epoch={pub.epoch} step={pub.step}", flush=True)
        if args.straggle_s > 0:

            def straggle(signum: int, frame: FrameType | None) -> None:
                del frame
                if last_save:
                    subprocess.Popen(  # reparented to init when this process exits
                        [
                            sys.executable,
                            os.path.abspath(__file__),
                            "--root",
                            args.root,
                            "--straggle-s",
                            str(args.straggle_s),
                            "--straggler-from",
                            last_save[-1],
                        ],
                        start_new_session=True,
                        stdout=sys.stdout,
                        stderr=sys.stderr,
                    )
                os._exit(128 + signum)

            signal.signal(signal.SIGTERM, straggle)

    for epoch in range(start, args.epochs):
        began = time.monotonic()
        order = torch.randperm(
            cut, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch)
        )
        total, batches = 0.0, 0
        for i in range(0, cut, args.batch):
            index = order[i : i + args.batch]
            optimizer.zero_grad()
            loss = loss_fn(model(train_x[index]), train_y[index])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        saved = ""
        if ckpts is not None:
            state = {
                "model": model.state_dict(),
                "optim": optimizer.state_dict(),
                "epochs_done": epoch + 1,
            }
            pub = ckpts.save(state, epoch + 1)
            last_save.append(os.path.join(args.root, pub.path))
            saved = f" saved step={pub.step}"
        print(f"epoch {epoch} loss {total / batches:.6f}{saved}", flush=True)
        time.sleep(max(0.0, args.epoch_s - (time.monotonic() - began)))

    final = _evaluate(model, loss_fn, train_x, train_y)
    with torch.no_grad():
        accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
    print(f"final loss {final:.10f} accuracy {accuracy:.4f}", flush=True)
    if args.result:
        Path(args.result).write_text(
            json.dumps({"final_loss": final, "accuracy": accuracy, "epochs": args.epochs})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

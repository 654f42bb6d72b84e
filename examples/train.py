"""A real PyTorch training job that checkpoints with hafo and resumes after any move.

A small MLP learns a fixed random linear map from synthetic data. Every ``--every`` steps it
saves model and optimizer state with ``save_async(snapshot="background")``: the copy to host
memory and the write both run beside the training loop, and ``ck.guard(optimizer)`` makes the
next ``optimizer.step()`` wait until the copy is taken (the loop stalls only if the copy takes
longer than a forward and backward pass); when a planned move asks for a checkpoint (SIGUSR1 ->
``should_checkpoint()``) it saves synchronously and exits, and the next instance resumes at
exactly that step. Runs on CUDA where present, else on the CPU.

    HAFO_CHECKPOINT_DIR=/tmp/ck python examples/train.py --steps 200
    hafo submit examples/train.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from hafo.checkpoint import Checkpointer


def batch(step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of ``step``: the same on every node, so a resume is exact."""
    gen = torch.Generator().manual_seed(step)
    truth = torch.Generator().manual_seed(12345)
    weights = torch.randn(16, 1, generator=truth)
    x = torch.randn(64, 16, generator=gen)
    return x.to(device), (x @ weights).to(device)


def main(argv: list[str] | None = None) -> int:
    """Train until ``--steps`` (0: forever); exit 0 when done or when moved."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--every", type=int, default=20, help="checkpoint period in steps")
    parser.add_argument("--sleep", type=float, default=0.02, help="pause per step (demo pace)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ck = Checkpointer()
    ck.guard(optimizer)  # optimizer.step() waits for a background snapshot still copying
    step = 0
    latest = ck.load_latest()
    if latest is not None:
        model.load_state_dict(latest.state["model"])
        optimizer.load_state_dict(latest.state["optim"])
        step = latest.step
    print(f"node {os.environ.get('HAFO_NODE')} epoch {os.environ.get('HAFO_EPOCH')} "
          f"device {device}: starting at step {step}", flush=True)

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    while args.steps == 0 or step < args.steps:
        x, y = batch(step, device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if ck.should_checkpoint():
            ck.save(state(), step=step)
            print(f"step {step}: checkpointed for a planned move, exiting", flush=True)
            return 0
        if step % args.every == 0:
            ck.save_async(state(), step=step, snapshot="background")
        time.sleep(args.sleep)
    ck.save(state(), step=step)
    print(f"done at step {step}, loss {loss.item():.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

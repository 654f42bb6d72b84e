"""A data-parallel PyTorch job whose survivors stay warm when a member is lost.

The reference workload of a gang with ``warm: true`` (docs/reference/checkpoint-sdk.md, "Warm
survivors"): ``examples/ddp_train.py --tiers`` run under ``hafo.checkpoint.run_warm``, one
process per node, without torchrun (hafo sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``HAFO_EPOCH``). When a member's node is lost, the survivors leave their
process group, park, and are handed the gang's next epoch: the same process joins the new
group and restores from the RAM tiers, keeping its interpreter, imports, model and optimizer.

Built once per process: the model, the optimizer, the progress log. Built per epoch (in
``train``): the ``TieredCheckpointer`` (it reads the epoch's environment), this rank's data
stream (the rank can change from one epoch to the next), the DDP wrapper. Every step: a
snapshot into this node's RAM and the next rank's node's RAM, on disk every ``--every`` steps;
``heartbeat`` before the step's collectives, ``synced`` after them.

Every rank appends one JSON line per step to ``$HAFO_CHECKPOINT_DIR/progress.jsonl`` (as
``ddp_train.py``): ``epoch`` is always the epoch the process is in, so a warm process logs
its new epoch's number after the hand-over. ``start`` says ``resumed_from``, ``tier``,
``restored``, ``world`` and ``warm`` (the process ran an earlier epoch); ``parked`` (with the
old epoch) is logged when the process parks.

Planned stop: SIGUSR1 (``should_checkpoint()``), summed across ranks every step: every rank
saves that step, all meet at a barrier, log ``preempted`` and exit 0. A failure that hafo does
not answer with a park request within the SDK's ``park_wait`` exits 3: the gang restarts cold.

Under hafo: ``hafo submit examples/warm.yaml``. By hand, two "nodes" on one machine (the
second in another shell with ``RANK=1``):

    HAFO_CHECKPOINT_DIR=/tmp/ck HAFO_EPOCH=1 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \\
        MASTER_PORT=29555 python examples/warm_train.py --steps 100
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hafo.checkpoint import TieredCheckpointer, WarmEpoch, run_warm
from hafo.model.warm import Parked

EXIT_PEER_LOST = 3


def truth() -> torch.Tensor:
    """The fixed linear map the model learns."""
    return torch.randn(16, 1, generator=torch.Generator().manual_seed(12345))


class RankStream:
    """One rank's own data stream: its generator, the samples it consumed and the sum of its
    local losses exist on this rank only (saved in its snapshot, restored from it)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.gen = torch.Generator().manual_seed(7919 + rank)
        self.seen = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        self.weights = truth()

    def next(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rank's next batch."""
        x = torch.randn(64, 16, generator=self.gen)
        self.seen += x.shape[0]
        return x.to(device), (x @ self.weights).to(device)

    def state(self) -> dict[str, Any]:
        """What goes into this rank's snapshot."""
        return {"rank": self.rank, "seen": self.seen, "rng": self.gen.get_state(),
                "loss_sum": self.loss_sum.clone()}

    def load(self, state: dict[str, Any]) -> None:
        """Go on from a snapshot's stream; RuntimeError if it is another rank's."""
        if int(state["rank"]) != self.rank:
            raise RuntimeError(f"rank {self.rank} restored the stream of rank {state['rank']}")
        self.gen.set_state(state["rng"])
        self.seen = int(state["seen"])
        self.loss_sum = state["loss_sum"].clone().to(torch.float64)


def summarize(own: dict[str, Any]) -> dict[str, Any]:
    """A rank's stream state as JSON: plain values and a digest of the generator."""
    rng = own["rng"].contiguous().numpy().tobytes()
    return {"rank": int(own["rank"]), "seen": int(own["seen"]),
            "loss_sum": float(own["loss_sum"]), "rng": hashlib.sha256(rng).hexdigest()[:16]}


class ProgressLog:
    """Appends JSON lines to ``progress.jsonl``, one ``os.write`` on an O_APPEND descriptor
    each; ``identity`` (epoch, rank) is updated when the process is handed an epoch."""

    def __init__(self, path: str, identity: dict[str, Any]) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.identity = identity

    def record(self, **fields: Any) -> None:
        """Append one line: the identity, the time and ``fields``."""
        line = json.dumps({**self.identity, "t": time.time(), **fields}) + "\n"
        os.write(self.fd, line.encode())


def main(argv: list[str] | None = None) -> int:
    """Train until ``--steps`` (0: forever) across epochs; exit 0 when done or stopped for a
    planned move, 3 when the gang is lost without a hand-over."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=0, help="stop after this step (0: never)")
    parser.add_argument("--every", type=int, default=10, help="durable checkpoint period")
    parser.add_argument("--sleep", type=float, default=0.05, help="pause per step (demo pace)")
    parser.add_argument("--keep-last", type=int, default=3,
                        help="checkpoints kept (older ones are removed)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("hafo.checkpoint").setLevel(logging.INFO)  # park, resume, restore
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    # What a fresh member starts from: a warm one goes back to it if no snapshot exists yet.
    initial = {"model": {k: v.clone() for k, v in model.state_dict().items()},
               "optim": copy.deepcopy(optimizer.state_dict())}
    log = ProgressLog(os.path.join(os.environ["HAFO_CHECKPOINT_DIR"], "progress.jsonl"),
                      {"workload": os.environ.get("HAFO_WORKLOAD"), "epoch": None,
                       "node": os.environ.get("HAFO_NODE"), "rank": None, "pid": os.getpid()})
    timeout = timedelta(seconds=float(os.environ.get("HAFO_DDP_TIMEOUT", "20")))
    at = {"step": 0}
    logged: list[BaseException] = []  # errors train logged already

    def train(warm: WarmEpoch) -> str:
        log.identity.update(epoch=warm.epoch, rank=warm.rank)
        ck = TieredCheckpointer(keep_last=args.keep_last, durable_every=max(args.every, 0))
        stream = RankStream(warm.rank)
        step, loss_value, failed = 0, None, True
        at["step"] = 0

        def state() -> dict[str, Any]:
            return {"model": model.state_dict(), "optim": optimizer.state_dict(),
                    "loss": loss_value, "world": warm.world_size, "own": stream.state()}

        try:
            latest = ck.load_latest()
            if latest is not None:
                model.load_state_dict(latest.state["model"])
                optimizer.load_state_dict(latest.state["optim"])
                stream.load(latest.state["own"])
                step, loss_value = latest.step, latest.state["loss"]
            elif warm.warm:
                model.load_state_dict(initial["model"])
                optimizer.load_state_dict(initial["optim"])
            at["step"] = step
            log.record(event="start", resumed_from=step, loss=loss_value,
                       world=warm.world_size, warm=warm.warm,
                       tier=None if latest is None else latest.tier,
                       restored=None if latest is None else summarize(latest.state["own"]))
            print(f"rank {warm.rank}/{warm.world_size} epoch {warm.epoch} "
                  f"{'warm' if warm.warm else 'cold'} on {device}: starting at step {step}",
                  flush=True)
            agreed = torch.tensor([step, -step], device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            if int(agreed[0]) != step or int(-agreed[1]) != step:
                raise RuntimeError(f"ranks resumed from different steps "
                                   f"({int(-agreed[1])}..{int(agreed[0])})")
            ddp = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
            while args.steps == 0 or step < args.steps:
                warm.check()  # asked to park: stop here rather than in the next collective
                x, y = stream.next(device)
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                ck.heartbeat(step + 1)  # right before the step's first collective
                optimizer.zero_grad()
                loss.backward()  # gradients all-reduced by DDP
                optimizer.step()
                step += 1
                at["step"] = step
                stream.loss_sum += loss.item()
                shared = torch.tensor([loss.item(), 1.0 if ck.should_checkpoint() else 0.0],
                                      device=device)
                dist.all_reduce(shared, op=dist.ReduceOp.SUM)
                ck.synced()
                loss_value = shared[0].item() / warm.world_size
                log.record(event="step", step=step, loss=loss_value)
                if shared[1].item() > 0:  # a planned stop: durable now, then leave
                    ck.save(state(), step)
                    dist.barrier()
                    log.record(event="preempted", step=step)
                    failed = False
                    return "preempted"
                ck.snapshot(state(), step)  # durable too, every --every steps
                time.sleep(args.sleep)
            if args.every <= 0 or step % args.every != 0:
                ck.save(state(), step)
            dist.barrier()
            log.record(event="done", step=step, loss=loss_value)
            print(f"rank {warm.rank} done at step {step}, loss {loss_value}", flush=True)
            failed = False
            return "done"
        except Exception as exc:
            logged.append(exc)
            log.record(event="error", step=step, error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            if failed:  # not close(): it waits for a durable save a lost peer never commits
                ck.server.close()
            else:
                ck.close()

    def parked(done: Parked) -> None:
        log.record(event="parked", step=at["step"], parked_at=done.t)
        print(f"rank {log.identity['rank']} parked epoch {done.epoch} at step {at['step']}",
              flush=True)

    try:
        run_warm(train, timeout=timeout, on_park=parked)
    except Exception as exc:
        if not any(exc is seen for seen in logged):  # the rendezvous, not train
            log.record(event="error", step=at["step"],
                       error=f"{type(exc).__name__}: {exc}"[:500])
        print(f"exiting: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_PEER_LOST
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: a native thread of torch's (the store client,
    # the process group) can block it (see examples/ddp_train.py).
    os._exit(code)

"""A real multi-node data-parallel PyTorch job that checkpoints with hafo and resumes as a gang.

DistributedDataParallel over a small MLP that learns a fixed random linear map from synthetic,
deterministic per-step batches (each rank its own shard). The backend is gloo on the CPU and
nccl where CUDA is present. Every rank resumes from the newest checkpoint; only global rank 0
saves (every ``--every`` steps), except with ``--sharded``. Every rank appends one JSON line
per step to ``$HAFO_CHECKPOINT_DIR/progress.jsonl`` (the format of ``hafo.local.workload``,
plus ``rank`` and ``loss``).

Sharded (``--sharded``): every rank saves a shard of its own with
``hafo.checkpoint.sharded.ShardedCheckpointer`` (rank 0 writes the commit record once every
shard is durable), at the same steps, and every rank resumes from its own shard of the newest
committed checkpoint. A shard holds the rank's own part of the state, its data stream: in this
mode each rank draws its batches from a generator of its own, so the generator's state, the
number of samples the rank consumed and the sum of its local losses exist on that rank only
and a resume is exact only if the rank gets its own shard back. Every rank also saves its own
copy of the model and the optimizer (identical on every rank under DDP): each rank then
restores from its own shard alone, with no broadcast after the load and no rank reading
another's shard, and the ranks write in parallel, so a save takes about as long as one copy
(the price is ``world size`` copies on disk, nothing for a model this size; a model too big
for that is what FSDP/ZeRO shard, where each rank's part differs anyway). Members meet inside
the save with ``torch.distributed.barrier``, so a peer lost during a save ends the process
like any failed collective. The progress log says what each rank saved (``saved``, with
``own``: its rank, samples seen, local loss sum and a digest of its generator state) and what
it restored (``start``: ``resumed_from`` and ``restored``, the same fields read from its
shard).

Tiered (``--tiers``): every rank takes a snapshot every step with
``hafo.checkpoint.TieredCheckpointer``: into its node's RAM (``$HAFO_MEMORY_DIR``) and a copy
into the next rank's node's RAM, written in the background; every ``--every`` steps also a
sharded checkpoint on disk. A restart restores from the newest step every rank still holds
somewhere: its own node's RAM, else the copy on its peer's node (a lost node), else the disk.
As with ``--sharded``, each rank's data stream is its own, and the ``start`` line says which
tier it came from (``tier``: ``own``, ``peer`` or ``disk``).

Progress: every rank calls ``ck.heartbeat(step + 1)`` once per step, after the forward pass
and right before the step's first collective (``loss.backward()``, which all-reduces the
gradients under DDP; this model has no buffers, so DDP's forward pass runs none): the step it
works on has reached its collectives. In a hang the rank that never reached the collective then
shows the oldest progress (the lowest step; the others report the next step and wait in its
all-reduce), which is the rank hafo's ``hang_timeout`` names.

After the step's last collective every rank calls ``ck.synced()``: the time from there to its
next heartbeat is its own work in a step, which hafo compares across members for
``straggler_lag`` (a rank slower than the others makes them wait in the collectives).

Fault injection, for tests and demos: ``--stall-rank R --stall-at S`` makes rank R stall once S
steps are done, as it starts step S + 1 (inside the step, before the forward pass: outside any
collective; its last heartbeat said S, the other ranks report S + 1 and wait for it in that
step's all-reduce), for ``--stall-seconds`` (default 3600), by ``--stall-how sleep``
(``time.sleep``) or ``spin`` (a busy loop on the CPU). It stalls once per checkpoint directory:
it leaves the marker ``stalled-rank-R-at-S`` there first and skips the stall when the marker
exists, so the restarted gang trains on. The stall is logged (``event: stall``) and printed.
``--slow-node NODE --slow-by S`` makes the ranks on node NODE stragglers, as slow hardware
would: S seconds slower in every step, wherever their rank.

Planned stop: hafo sends SIGUSR1 to the workers (``Checkpointer.should_checkpoint()``); the
flag is summed across ranks every step (with the loss, logged as the gang's mean), so when any
rank has it, rank 0 (with ``--sharded``: every rank) saves at that very step, all ranks meet at
a barrier, log ``preempted`` and exit 0: no step is lost.
Lost peer: a collective that fails (a peer died; or stuck past ``$HAFO_DDP_TIMEOUT`` seconds,
default 20) is logged and the process exits 3 at once, no retry: the gang restarts as a whole.
A watchdog does the same when no step completes for twice that long (gloo's connection setup
in ``init_process_group`` can block past its timeout, e.g. on a stale peer address). Both are
last resorts: with hafo's ``hang_timeout`` set, keep ``$HAFO_DDP_TIMEOUT`` well above it, so
that hafo, which names the rank that stalled first, acts first.

Under hafo (one member per node; hafo sets torchrun's PET_* variables, so torchrun's default
static rendezvous needs no arguments):

    hafo submit examples/ddp.yaml

By hand, two "nodes" on one machine (the second command in another shell, NODE_RANK=1):

    HAFO_CHECKPOINT_DIR=/tmp/ck HAFO_EPOCH=1 torchrun --nnodes 2 --node-rank 0 \\
        --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29555 \\
        examples/ddp_train.py --steps 100
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hafo.checkpoint import Checkpointer
from hafo.checkpoint.sharded import ShardedCheckpointer, ShardedCommitTimeout, StaleEpoch
from hafo.checkpoint.tiered import TieredCheckpointer

EXIT_PEER_LOST = 3


def truth() -> torch.Tensor:
    """The fixed linear map the model learns."""
    return torch.randn(16, 1, generator=torch.Generator().manual_seed(12345))


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of ``rank`` at ``step``: deterministic, so a resume is exact."""
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(64, 16, generator=gen)
    return x.to(device), (x @ truth()).to(device)


class RankStream:
    """One rank's own data stream (``--sharded``): batches drawn from a generator of this rank
    alone, so its state, the samples consumed and the sum of the rank's local losses are state
    that only this rank has; saved in its shard, restored from it."""

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
        """What goes into this rank's shard."""
        return {"rank": self.rank, "seen": self.seen, "rng": self.gen.get_state(),
                "loss_sum": self.loss_sum.clone()}

    def load(self, state: dict[str, Any]) -> None:
        """Go on from a shard's stream; RuntimeError if it is another rank's."""
        if int(state["rank"]) != self.rank:
            raise RuntimeError(f"rank {self.rank} restored the shard of rank {state['rank']}")
        self.gen.set_state(state["rng"])
        self.seen = int(state["seen"])
        self.loss_sum = state["loss_sum"].clone().to(torch.float64)

    def summary(self) -> dict[str, Any]:
        """Its state in the progress log: plain values and a digest of the generator."""
        return summarize(self.state())


def summarize(own: dict[str, Any]) -> dict[str, Any]:
    """A rank's stream state (``RankStream.state()``, or as read from a shard) as JSON."""
    rng = own["rng"].contiguous().numpy().tobytes()
    return {"rank": int(own["rank"]), "seen": int(own["seen"]),
            "loss_sum": float(own["loss_sum"]), "rng": hashlib.sha256(rng).hexdigest()[:16]}


class ProgressLog:
    """Appends JSON lines to ``progress.jsonl``: one ``os.write`` on an O_APPEND descriptor per
    line, so lines of several processes (and nodes, on a shared filesystem) never interleave."""

    def __init__(self, path: os.PathLike[str] | str, identity: dict[str, Any]) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.identity = identity

    def record(self, **fields: Any) -> None:
        """Append one line: the identity, the time and ``fields``."""
        line = json.dumps({**self.identity, "t": time.time(), **fields}) + "\n"
        os.write(self.fd, line.encode())

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self.fd)


class Watchdog:
    """Ends the process (exit 3) when ``kick()`` was not called for ``limit`` seconds: the
    last resort against a hang that no collective's timeout catches."""

    def __init__(self, limit: float, on_fire: Any) -> None:
        self.limit = limit
        self.on_fire = on_fire
        self.last = time.monotonic()
        self.stopped = threading.Event()
        threading.Thread(target=self._watch, name="ddp-watchdog", daemon=True).start()

    def kick(self) -> None:
        """Progress was made."""
        self.last = time.monotonic()

    def stop(self) -> None:
        """Disarm."""
        self.stopped.set()

    def _watch(self) -> None:
        while not self.stopped.wait(min(1.0, self.limit / 4)):
            idle = time.monotonic() - self.last
            if idle > self.limit:
                self.on_fire(f"watchdog: no progress for {idle:.0f}s")
                os._exit(EXIT_PEER_LOST)


def stall(seconds: float, how: str) -> None:
    """Stall for ``seconds``: asleep (``sleep``) or busy on the CPU (``spin``)."""
    if how == "sleep":
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    """Train until ``--steps`` (0: forever); exit 0 when done or stopped for a planned move,
    3 when a peer is lost."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=0, help="stop after this step (0: never)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint period in steps")
    parser.add_argument("--sleep", type=float, default=0.05, help="pause per step (demo pace)")
    parser.add_argument("--sharded", action="store_true",
                        help="every rank saves and restores a shard of its own")
    parser.add_argument("--keep-last", type=int, default=3,
                        help="checkpoints kept (older ones are removed)")
    parser.add_argument("--stall-rank", type=int, default=-1,
                        help="fault injection: this rank stalls once (-1: none)")
    parser.add_argument("--stall-at", type=int, default=0,
                        help="it stalls once this many steps are done, in the next one")
    parser.add_argument("--stall-seconds", type=float, default=3600.0,
                        help="how long it stalls")
    parser.add_argument("--stall-how", choices=("sleep", "spin"), default="sleep",
                        help="asleep, or busy on the CPU")
    parser.add_argument("--tiers", action="store_true",
                        help="snapshot every step into node RAM and a peer node's RAM; "
                             "durable every --every steps")
    parser.add_argument("--slow-node", default="",
                        help="fault injection: the ranks on this node (HAFO_NODE) are slower "
                             "every step, as on slow hardware")
    parser.add_argument("--slow-by", type=float, default=0.0,
                        help="by this many seconds per step")
    args = parser.parse_args(argv)
    # Either installs the SIGUSR1 handler first thing.
    ck: Checkpointer | ShardedCheckpointer | TieredCheckpointer = (
        TieredCheckpointer(keep_last=args.keep_last, durable_every=max(args.every, 0))
        if args.tiers
        else ShardedCheckpointer(keep_last=args.keep_last, barrier=dist.barrier)
        if args.sharded else Checkpointer(keep_last=args.keep_last))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    log = ProgressLog(ck.root / "progress.jsonl", {
        "workload": os.environ.get("HAFO_WORKLOAD"), "epoch": ck.epoch,
        "node": os.environ.get("HAFO_NODE"), "rank": rank, "pid": os.getpid()})

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    stream = RankStream(rank) if args.sharded or args.tiers else None
    saves = args.sharded or args.tiers or rank == 0  # does this rank write checkpoints
    step, loss_value = 0, None
    # Load before joining the group: rank 0 cannot save a newer checkpoint until every rank
    # has joined, so all ranks read the same one.
    latest = ck.load_latest()
    if latest is not None:
        model.load_state_dict(latest.state["model"])
        optimizer.load_state_dict(latest.state["optim"])
        step = latest.step
        loss_value = float(latest.state["loss"])
        if stream is not None:
            stream.load(latest.state["own"])
    extra = {} if stream is None else {
        "restored": None if latest is None else summarize(latest.state["own"]),
        "tier": None if latest is None else latest.tier}
    log.record(event="start", resumed_from=step, loss=loss_value, world=world, **extra)
    print(f"rank {rank}/{world} node {os.environ.get('HAFO_NODE')} epoch {ck.epoch} "
          f"{backend} on {device}: starting at step {step} (loss {loss_value})", flush=True)

    def state() -> dict[str, Any]:
        full = {"model": model.state_dict(), "optim": optimizer.state_dict(),
                "loss": loss_value, "world": world}
        return full if stream is None else {**full, "own": stream.state()}

    def save() -> None:
        ck.save(state(), step=step)
        if stream is not None:  # save returned: the gang checkpoint is committed
            log.record(event="saved", step=step, own=stream.summary())

    timeout = timedelta(seconds=float(os.environ.get("HAFO_DDP_TIMEOUT", "20")))

    def fired(reason: str) -> None:
        log.record(event="error", step=step, error=reason)
        print(f"rank {rank} step {step}: {reason}, exiting", file=sys.stderr, flush=True)

    watchdog = Watchdog(2 * timeout.total_seconds() + args.sleep, fired)
    try:
        dist.init_process_group(backend, timeout=timeout)
        agreed = torch.tensor([step, -step], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        if int(agreed[0]) != step or int(-agreed[1]) != step:
            raise RuntimeError(f"ranks resumed from different steps "
                               f"({int(-agreed[1])}..{int(agreed[0])})")
        ddp = DistributedDataParallel(
            model, device_ids=[local_rank] if device.type == "cuda" else None)
        stall_marker = ck.root / f"stalled-rank-{args.stall_rank}-at-{args.stall_at}"
        slow_here = bool(args.slow_node) and args.slow_by > 0 \
            and os.environ.get("HAFO_NODE") == args.slow_node
        while args.steps == 0 or step < args.steps:
            if rank == args.stall_rank and step == args.stall_at and not stall_marker.exists():
                stall_marker.touch()  # once per checkpoint directory: a restart trains on
                log.record(event="stall", step=step, seconds=args.stall_seconds,
                           how=args.stall_how)
                print(f"rank {rank} step {step}: stalling for {args.stall_seconds:g}s "
                      f"({args.stall_how})", flush=True)
                stall(args.stall_seconds, args.stall_how)
            if slow_here:
                time.sleep(args.slow_by)  # fault injection: a straggler, every step
            x, y = batch(step, rank, device) if stream is None else stream.next(device)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            # Progress, right before the step's first collective: in a hang, the rank that
            # never reached it shows the oldest step.
            ck.heartbeat(step + 1)
            optimizer.zero_grad()
            loss.backward()  # gradients all-reduced by DDP
            optimizer.step()
            step += 1
            if stream is not None:
                stream.loss_sum += loss.item()
            # One collective per step: the gang's mean loss, and whether any rank was asked
            # for a checkpoint (a planned stop).
            shared = torch.tensor([loss.item(), 1.0 if ck.should_checkpoint() else 0.0],
                                  device=device)
            dist.all_reduce(shared, op=dist.ReduceOp.SUM)
            ck.synced()  # the step's collectives are done: its own work runs to the heartbeat
            loss_value = shared[0].item() / world
            watchdog.kick()
            log.record(event="step", step=step, loss=loss_value)
            if step % 10 == 0:
                print(f"rank {rank} step {step} loss {loss_value:.5f}", flush=True)
            if shared[1].item() > 0:
                if saves:
                    save()
                dist.barrier()  # the checkpoint is durable before anyone leaves
                log.record(event="preempted", step=step)
                print(f"rank {rank} step {step}: checkpointed for a planned move, exiting",
                      flush=True)
                break
            if isinstance(ck, TieredCheckpointer):
                ck.snapshot(state(), step)  # durable too, every --every steps
            elif saves and args.every > 0 and step % args.every == 0:
                save()
            time.sleep(args.sleep)
        else:
            if saves and (args.every <= 0 or step % args.every != 0):
                save()
            dist.barrier()
            log.record(event="done", step=step, loss=loss_value)
            print(f"rank {rank} done at step {step}, loss {loss_value}", flush=True)
    # a peer died or a collective timed out (with --sharded: or the checkpoint did not commit)
    except (RuntimeError, ShardedCommitTimeout, StaleEpoch) as exc:
        watchdog.stop()
        log.record(event="error", step=step, error=f"{type(exc).__name__}: {exc}"[:500])
        print(f"rank {rank} step {step}: collective failed, exiting: {exc}", file=sys.stderr,
              flush=True)
        log.close()
        os._exit(EXIT_PEER_LOST)  # no teardown: destroying a broken group can block
    watchdog.stop()
    ck.wait()  # a background write, old checkpoints' deletion
    dist.destroy_process_group()
    log.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: a native thread of torch's (the store client,
    # the process group) blocked it for minutes once in about 60 runs on a busy machine, and
    # torchrun's agents wait for every worker in their exit barrier.
    os._exit(code)

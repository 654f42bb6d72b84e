"""Sharded checkpoints with several ranks: torch.distributed.checkpoint (DCP) against hafo's
ShardedCheckpointer, in real processes (gloo on 127.0.0.1), each rank saving its own part of
the state (distinct keys) on one shared directory.

Run by benchmarks/checkpoint.py (``--ranks N``); a rank process is this file run as a
script. Times are rank 0's wall clock between two barriers, so they cover every rank.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from ckpt_methods import make_state, preload, state_bytes
from cold_cache import evict

OPS = ("dcp_save", "sharded_save", "dcp_load", "sharded_load")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(mib: int, world: int, repeat: int, root: Path,
              timeout: float = 600.0) -> dict[str, Any]:
    """Start ``world`` rank processes; returns rank 0's samples (seconds per op) and the
    total state bytes. Every process is killed by pid if it outlives ``timeout``."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / "rank0.json"
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(rank), str(world), str(port),
                               str(mib), str(repeat), str(root), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    try:
        deadline = time.monotonic() + timeout
        errors = []
        for rank, proc in enumerate(procs):
            _stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0:
                tail = (stderr.strip().splitlines() or ["no output"])[-1]
                errors.append(f"rank {rank} exited {proc.returncode}: {tail}")
        if errors:
            raise RuntimeError("; ".join(errors))
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _rank_main(rank: int, world: int, port: int, mib: int, repeat: int, root: Path,
               out: Path) -> None:
    from torch.distributed.checkpoint import state_dict_loader as dcp_load
    from torch.distributed.checkpoint import state_dict_saver as dcp

    from hafo.checkpoint.sharded import ShardedCheckpointer

    preload()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    state = {f"rank{rank}.{k}": v for k, v in make_state(max(1, mib // world)).items()}
    extra: dict[str, Any] = {}
    if "barrier" in inspect.signature(ShardedCheckpointer).parameters:
        extra["barrier"] = dist.barrier
    ck = ShardedCheckpointer(root / "hafo", rank=rank, world_size=world, epoch=1, keep_last=2,
                             handle_signal=False, **extra)
    samples: dict[str, list[float]] = {op: [] for op in OPS}

    def timed(op: str, fn: Any) -> Any:
        dist.barrier()
        started = time.perf_counter()
        value = fn()
        dist.barrier()
        samples[op].append(time.perf_counter() - started)
        return value

    for step in range(1, repeat + 1):
        if rank == 0:
            shutil.rmtree(root / "dcp", ignore_errors=True)
        timed("dcp_save", lambda: dcp.save(state, checkpoint_id=str(root / "dcp")))
        timed("sharded_save", lambda s=step: ck.save(state, step=s))
        evict(root / "dcp")
        timed("dcp_load", lambda: dcp_load.load(state, checkpoint_id=str(root / "dcp")))
        evict(root / "hafo")
        restored = timed("sharded_load", ck.load_latest)
        if restored is None or set(restored.state) != set(state):
            raise RuntimeError(f"rank {rank}: sharded load_latest did not return its shard")
        del restored
    nbytes = torch.tensor([state_bytes(state)], dtype=torch.int64)
    dist.all_reduce(nbytes)
    if rank == 0:
        out.write_text(json.dumps({"samples": samples, "bytes": int(nbytes.item())}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = sys.argv[1:]
    _rank_main(int(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4]),
               Path(argv[5]), Path(argv[6]))

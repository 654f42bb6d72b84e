"""Checkpoint format and stall: hafo's format against torch.save of the whole state, measured
in the same run on the same disk.

    python benchmarks/checkpoint.py --mib 128 --repeat 3

For a state of N MiB of float32 tensors (CPU here; CUDA where present), it times:
- baseline: ``torch.save(state)`` to one file + fsync, and ``torch.load``;
- hafo ``save`` (durable on return: temp dir, per-blob sha256, fsync, atomic rename) and
  ``load_latest`` (checksums verified);
- hafo ``save_async``: how long the training loop is stalled (staging to host memory) and how
  long until the checkpoint is committed in the background.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from hafo.checkpoint import Checkpointer


def timed(fn: object, repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(mib: int, repeat: int) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    per = 16 * 1024 * 1024 // 4  # 16 MiB of float32 per tensor
    state = {"model": {f"layer{i}": torch.randn(per, device=device) for i in range(mib // 16)},
             "step": 1, "note": "benchmark"}
    root = Path(tempfile.mkdtemp(prefix="hafo-ckbench-"))
    try:
        baseline_path = root / "baseline.pt"

        def baseline_save() -> None:
            with open(baseline_path, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())

        ck = Checkpointer(root / "hafo", keep_last=2, epoch=1, handle_signal=False)
        step = iter(range(1, 10_000))
        t_base_save = timed(baseline_save, repeat)
        t_base_load = timed(lambda: torch.load(baseline_path, weights_only=True), repeat)
        t_save = timed(lambda: ck.save(state, step=next(step)), repeat)
        t_load = timed(ck.load_latest, repeat)
        stalls, commits = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            ck.save_async(state, step=next(step))
            stalls.append(time.perf_counter() - started)
            ck.wait()
            commits.append(time.perf_counter() - started)
        t_stall, t_commit = statistics.median(stalls), statistics.median(commits)
        print(f"state {mib} MiB on {device}, median of {repeat}")
        print(f"{'':34s} {'seconds':>8s} {'ratio':>8s}")
        print(f"{'baseline torch.save + fsync':34s} {t_base_save:8.3f} {1.0:8.2f}")
        print(f"{'hafo save (durable, checksummed)':34s} {t_save:8.3f} "
              f"{t_save / t_base_save:8.2f}  vs baseline save")
        print(f"{'baseline torch.load':34s} {t_base_load:8.3f} {1.0:8.2f}")
        print(f"{'hafo load_latest (verified)':34s} {t_load:8.3f} "
              f"{t_load / t_base_load:8.2f}  vs baseline load")
        print(f"{'hafo save_async: training stall':34s} {t_stall:8.3f} "
              f"{t_stall / t_save:8.2f}  vs hafo save")
        print(f"{'hafo save_async: until committed':34s} {t_commit:8.3f} "
              f"{t_commit / t_save:8.2f}  vs hafo save")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.exit(main(args.mib, args.repeat))

"""Checkpoint save/load against raw I/O and torch.save, all in one run on one directory.

    python benchmarks/checkpoint.py --mib 256 1024 --repeat 3

For each state size (float32 tensors; CUDA where present, else CPU), every repetition runs,
interleaved so that the page cache and writeback treat them alike:
- raw: the same bytes written sequentially to one file + fsync, and read back;
- torch: ``torch.save`` of the whole state + fsync, and ``torch.load``;
- hafo: ``save`` (durable: temp dir, CRC-32 per item, fsync, atomic rename, pruning) and
  ``load_latest`` (checksums verified); ``save_async`` (the stall, and until committed).
Ratios are throughputs against the baselines (>1 is faster than the baseline). Peak RSS
during ``save`` is measured in a fresh process, as the growth over the state itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from bench_main import run_main

from hafo.checkpoint import Checkpointer

PER = 16 * 1024 * 1024 // 4  # float32 elements in 16 MiB


def make_state(mib: int, device: str) -> dict[str, object]:
    return {"model": {f"layer{i}": torch.randn(PER, device=device) for i in range(mib // 16)},
            "step": 1}


def raw_bytes(state: dict[str, object]) -> list[memoryview]:
    model = state["model"]
    assert isinstance(model, dict)
    return [memoryview(t.cpu().numpy()).cast("B") for t in model.values()]


def clock(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def drop_cache(path: Path) -> None:
    """Evict a file from the page cache, so reads measure the disk where possible."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def rss_child(mib: int, root: str) -> None:
    state = make_state(mib, "cpu")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = _status_kib("VmRSS")
    Checkpointer(root, epoch=1, handle_signal=False).save(state, step=1)
    peak = _status_kib("VmHWM")
    print(max(0, peak - before) / (mib * 1024))


def bench(mib: int, repeat: int, root: Path, device: str) -> None:
    state = make_state(mib, device)
    raw = raw_bytes(state)
    ck = Checkpointer(root / "hafo", keep_last=2, epoch=1, handle_signal=False)
    t: dict[str, list[float]] = {k: [] for k in ("raw_w", "raw_r", "torch_w", "torch_r",
                                                 "save", "load", "stall", "commit")}
    raw_path, torch_path = root / "raw.bin", root / "torch.pt"

    def raw_write() -> None:
        with open(raw_path, "wb", buffering=0) as fh:
            for part in raw:
                fh.write(part)
            os.fsync(fh.fileno())

    def raw_read() -> None:
        with open(raw_path, "rb", buffering=0) as fh:
            buffer = bytearray(os.path.getsize(raw_path))
            fh.readinto(buffer)

    def torch_write() -> None:
        with open(torch_path, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())

    for n in range(repeat):
        t["raw_w"].append(clock(raw_write))
        t["torch_w"].append(clock(torch_write))
        t["save"].append(clock(lambda n=n: ck.save(state, step=2 * n + 1)))
        started = time.perf_counter()
        ck.save_async(state, step=2 * n + 2)
        t["stall"].append(time.perf_counter() - started)
        ck.wait()
        t["commit"].append(time.perf_counter() - started)
        drop_cache(raw_path)
        t["raw_r"].append(clock(raw_read))
        drop_cache(torch_path)
        t["torch_r"].append(clock(lambda: torch.load(torch_path, weights_only=True)))
        newest = sorted((root / "hafo").glob("ckpt-*"))[-1] / "data.bin"
        drop_cache(newest)
        t["load"].append(clock(ck.load_latest))
    m = {k: statistics.median(v) for k, v in t.items()}
    rss = subprocess.run([sys.executable, __file__, "--rss-child", str(mib),
                          str(root / "rss")], capture_output=True, text=True, check=True)
    growth = float(rss.stdout.strip())
    print(f"\n{mib} MiB of float32 on {device}, median of {repeat}")
    print(f"{'':36s} {'seconds':>8s}  throughput ratio")
    print(f"{'raw write + fsync (baseline a)':36s} {m['raw_w']:8.3f}")
    print(f"{'torch.save + fsync (baseline b)':36s} {m['torch_w']:8.3f}")
    print(f"{'hafo save':36s} {m['save']:8.3f}  {m['raw_w'] / m['save']:5.2f}x raw "
          f"(goal >= 0.8), {m['torch_w'] / m['save']:5.2f}x torch.save (goal >= 1.0)")
    print(f"{'raw read (baseline a)':36s} {m['raw_r']:8.3f}")
    print(f"{'torch.load (baseline b)':36s} {m['torch_r']:8.3f}")
    print(f"{'hafo load_latest (verified)':36s} {m['load']:8.3f}  {m['raw_r'] / m['load']:5.2f}x "
          f"raw (goal >= 0.8), {m['torch_r'] / m['load']:5.2f}x torch.load")
    print(f"{'hafo save_async stall':36s} {m['stall']:8.3f}  {m['stall'] / m['save']:5.2f} of "
          f"save (goal <= 0.1); committed after {m['commit']:.3f}s")
    print(f"{'peak RSS growth during save':36s} {growth * 100:7.1f}% of the state (goal <= 10%)")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rss-child":
        rss_child(int(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    root = Path(tempfile.mkdtemp(prefix="hafo-ckbench-", dir=os.environ.get("HAFO_BENCH_DIR")))
    try:
        for mib in args.mib:
            bench(mib, args.repeat, root, device)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    run_main(main)

"""Checkpoint save/load: hafo against what users would pick, all in one run on the same bytes.

    python benchmarks/checkpoint.py --mib 256 1024 --repeat 3 [--json FILE] [--drop-caches]

For each state size, one state dict of 64 CPU tensors (bfloat16 and float32 matrices, float32
norms, a 0-d step; benchmarks/ckpt_methods.py) is saved and loaded by every method, in the same
process, on one directory per method, repetitions interleaved (the order rotates each time):
- raw: the tensors' memory written to one file (os.write) + fsync, and read back into one
  buffer: the disk's limit;
- torch.save + fsync / torch.load, and torch.load(mmap=True) with every page touched;
- safetensors save_file + fsync / load_file;
- torch.distributed.checkpoint (DCP) save, async_save (default: staged before it returns;
  and with DefaultStager's async staging, the counterpart of hafo's background snapshot) and
  load (in place), one process;
- hafo's Checkpointer save, save_async, load_latest and load_into (where this version has it).
Every save is durable on return. Before each load the method's files are fsynced and evicted
from the page cache (posix_fadvise DONTNEED; with --drop-caches, as root, the whole cache is
dropped too). The first repetition checks that every load returned the saved tensors. Times
are medians with their min-max; ratios are throughputs against the baselines (>1: faster).
Peak RSS growth is measured per method in a fresh process (VmHWM reset after the state is
built), as a share of the state; two such processes run at a time up to 2 GiB states.
The goals of issue 18 are printed PASS/MISS per size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from bench_main import run_main
from ckpt_methods import (
    ASYNCS,
    COMPUTE_S,
    IN_PLACE,
    LOADS,
    SAVES,
    Methods,
    check_loaded,
    make_state,
    preload,
    prepare_check,
    state_bytes,
)
from ckpt_ranks import run_ranks
from ckpt_report import SizeResult, render
from cold_cache import can_drop_caches, drop_caches, evict

RSS_FLAG = "--rss-child"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def rss_child(op: str, mib: int, root: str) -> None:
    """In a fresh process: build what ``op`` needs, reset the peak RSS, run ``op`` once and
    print the peak's growth in bytes (JSON)."""
    preload()
    needs_state = op in SAVES or op in ASYNCS or op in IN_PLACE
    state = make_state(mib, random=False) if needs_state else {}
    methods = Methods(Path(root), state)
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from VmRSS
    before = _status_kib("VmRSS")
    if op in SAVES:
        methods.save(op)
        kept: Any = None
    elif op in ASYNCS:
        methods.save_async(op)
        methods.close()
        kept = None
    else:
        kept = methods.load(op)
    peak = _status_kib("VmHWM")
    del kept
    print(json.dumps({"op": op, "growth_bytes": max(0, peak - before) * 1024}))


def measure_rss(op: str, mib: int, root: Path, nbytes: int) -> float:
    """Peak RSS growth of ``op`` in a fresh process, as a share of the state's bytes."""
    out = subprocess.run([sys.executable, __file__, RSS_FLAG, op, str(mib), str(root)],
                         capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"RSS measurement of {op} failed: {tail}")
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth_bytes"]
    return float(growth) / nbytes


def _rotate(ops: list[str], by: int) -> list[str]:
    by %= len(ops)
    return ops[by:] + ops[:by]


def bench(mib: int, repeat: int, root: Path, drop: bool, rss: bool,
          ranks: int, compute_s: float = COMPUTE_S) -> SizeResult:
    """Every method at one size; returns what was measured."""
    state = make_state(mib)
    methods = Methods(root, state, compute_s=compute_s)
    loads = [op for op in LOADS if methods.available(op)]
    samples: dict[str, list[float]] = defaultdict(list)
    for rep in range(repeat):
        for op in _rotate([*SAVES, *ASYNCS], rep):
            methods.clear(op)
            methods.settle()
            if op in ASYNCS:
                methods.copied = None
                stall, total = methods.save_async(op)
                samples[f"{op}:stall"].append(stall)
                if op == "memcpy":
                    continue
                samples[f"{op}:total"].append(total)
                if methods.copied is not None:
                    samples[f"{op}:copy"].append(methods.copied)
            else:
                started = time.perf_counter()
                methods.save(op)
                samples[op].append(time.perf_counter() - started)
        for op in _rotate(loads, rep):
            zeroed = prepare_check(methods, op) if rep == 0 else {}
            methods.settle()
            evict(methods.files_of(op))
            if drop:
                drop_caches()
            started = time.perf_counter()
            loaded = methods.load(op)
            samples[op].append(time.perf_counter() - started)
            if rep == 0:
                check_loaded(op, loaded, state, zeroed)
            del loaded
    methods.close()
    result = SizeResult(
        mib=mib, nbytes=state_bytes(state), tensors=len(state),
        dtypes=sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}),
        repeat=repeat, cold="fadvise DONTNEED" + (" + drop_caches" if drop else ""),
        samples=dict(samples), missing=[op for op in LOADS if op not in loads],
        compute_s=compute_s)
    del state, methods
    if rss:
        # loads read the files the last repetition left; each save writes a directory of
        # its own. Processes run side by side where memory allows: a peak RSS is per process
        jobs = 2 if result.nbytes <= 2 * 2**30 else 1
        saves = [op for op in (*SAVES, *ASYNCS) if op != "memcpy"]
        where = {op: root for op in loads} | {op: root / f"rss-{op}" for op in saves}
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            growth = pool.map(lambda op: measure_rss(op, mib, where[op], result.nbytes), where)
            result.rss = dict(zip(where, growth, strict=True))
        for op in saves:
            shutil.rmtree(where[op], ignore_errors=True)
    result.ranks_note = ranks_skipped(ranks)
    if not result.ranks_note:
        result.ranks = {"world": ranks, **run_ranks(mib, ranks, repeat, root / "ranks")}
        shutil.rmtree(root / "ranks", ignore_errors=True)
    return result


def ranks_skipped(ranks: int) -> str:
    """Why the multi-rank comparison does not run ("" when it does)."""
    if ranks < 2:
        return "DCP with several ranks vs hafo sharded: skipped (--ranks 0)"
    if importlib.util.find_spec("hafo.checkpoint.sharded") is None:
        return "DCP with several ranks vs hafo sharded: skipped (hafo.checkpoint.sharded " \
               "is not present)"
    return ""


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == RSS_FLAG:
        rss_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[256, 1024, 4096],
                        help="state sizes in MiB (default: 256 1024 4096)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default: 3)")
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--drop-caches", action="store_true",
                        help="also drop the whole page cache before each load (root only)")
    parser.add_argument("--ranks", type=int, default=2,
                        help="ranks for DCP vs hafo sharded, in processes (0: skip; default 2)")
    parser.add_argument("--compute-s", type=float, default=COMPUTE_S,
                        help="seconds of forward and backward pass in the background-snapshot "
                             f"loop, the host idle as while a GPU computes (default {COMPUTE_S})")
    parser.add_argument("--no-rss", action="store_true",
                        help="skip the peak-RSS measurements (one fresh process per method)")
    args = parser.parse_args()
    if args.repeat < 1 or any(m < 1 for m in args.mib):
        raise ValueError("--repeat and --mib must be positive")
    if args.compute_s < 0:
        raise ValueError("--compute-s must not be negative")
    if args.drop_caches and not can_drop_caches():
        raise ValueError("--drop-caches needs root and a writable /proc/sys/vm/drop_caches")
    preload()
    base = Path(tempfile.mkdtemp(prefix="hafo-ckbench-", dir=os.environ.get("HAFO_BENCH_DIR")))
    started = time.monotonic()
    results = []
    try:
        for mib in args.mib:
            result = bench(mib, args.repeat, base / f"{mib}mib", args.drop_caches,
                           not args.no_rss, args.ranks, args.compute_s)
            shutil.rmtree(base / f"{mib}mib", ignore_errors=True)
            print(render(result), flush=True)
            results.append(result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"\ntotal {elapsed:.0f} s; directory under "
          f"{os.environ.get('HAFO_BENCH_DIR') or tempfile.gettempdir()}")
    if args.json:
        args.json.write_text(json.dumps({
            "command": sys.argv, "torch": torch.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(), "elapsed_s": elapsed,
            "sizes": [r.to_json() for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)

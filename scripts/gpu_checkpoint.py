#!/usr/bin/env python3
"""Checkpoint throughput on a machine WITH an NVIDIA GPU (not run in CI; a few minutes).

    python scripts/gpu_checkpoint.py [--mib 1024 4096] [--repeat 2] [--dir DIR]

Measures, on GPU 0:
1. device-to-host copy throughput into pinned host memory (one large copy per chunk size,
   several sizes; pageable memory for reference) against the PCIe link's limit, computed from
   its generation and width (nvidia-smi, or pynvml where present) read while a copy runs;
2. the end-to-end save of a CUDA state dict (the benchmark's 64-tensor layout,
   benchmarks/ckpt_methods.py) with hafo's Checkpointer: ``save`` (durable), ``save_async``
   (the stall: until the call returns and the state may change; and until committed), against
   ``torch.save`` + fsync of the same state and a raw write + fsync of the same bytes from
   pinned host memory (the disk's limit).
Prints one table and exits 0; exits 2 with one line when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

GB = 1e9
GIB = 2**30
#: usable GB/s per lane and direction, after line encoding (8b/10b to gen 2, 128b/130b to
#: gen 5, FLIT mode from gen 6)
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8,
             5: 32 * 128 / 130 / 8, 6: 64 * 242 / 256 / 8}
CHUNKS_MIB = (64, 256, 1024, 4096)


def no_cuda_reason() -> str | None:
    """Why this script cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def link_info(index: int = 0) -> dict[str, Any]:
    """PCIe generation and width (current and max) of GPU ``index``: pynvml, else
    nvidia-smi; empty where neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return {"gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                    "width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
                    "gen_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                    "width_max": pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle), "via": "pynvml"}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # any NVML problem (none installed, no driver): try nvidia-smi
        pass
    if shutil.which("nvidia-smi") is None:
        return {}
    out = subprocess.run(
        ["nvidia-smi", f"--id={index}", "--query-gpu=pcie.link.gen.current,"
         "pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max",
         "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
        check=False)
    try:
        gen, width, gen_max, width_max = (int(v.strip()) for v in out.stdout.split(","))
    except ValueError:
        return {}
    return {"gen": gen, "width": width, "gen_max": gen_max, "width_max": width_max,
            "via": "nvidia-smi"}


def link_limit_gbps(info: dict[str, Any]) -> float | None:
    """The link's theoretical GB/s per direction (current generation and width)."""
    gen, width = info.get("gen"), info.get("width")
    if gen not in LANE_GBPS or not width:
        return None
    return float(LANE_GBPS[gen] * width)


def link_under_load(torch: Any) -> dict[str, Any]:
    """Read the link while device-to-host copies run (an idle link trains down)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    stop = threading.Event()

    def copy() -> None:
        while not stop.is_set():
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        return link_info()
    finally:
        stop.set()
        thread.join()


def median_time(fn: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def d2h(torch: Any, repeat: int) -> list[tuple[int, float, float]]:
    """(chunk MiB, pinned GB/s, pageable GB/s) per chunk size."""
    rows = []
    for mib in CHUNKS_MIB:
        src = torch.empty(mib << 20, dtype=torch.uint8, device="cuda").fill_(7)
        pinned = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
        pageable = torch.empty(mib << 20, dtype=torch.uint8)
        pageable.fill_(0)  # fault its pages in first

        def to(dst: Any, src: Any = src) -> Callable[[], None]:
            def run() -> None:
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
            return run

        to(pinned)()  # warm up
        fast = median_time(to(pinned), max(3, repeat))
        slow = median_time(to(pageable), max(2, repeat))
        rows.append((mib, (mib << 20) / fast / GB, (mib << 20) / slow / GB))
        del src, pinned, pageable
    return rows


def save_rows(torch: Any, mib: int, repeat: int, root: Path) -> dict[str, float]:
    """Median seconds of each save of a ``mib`` MiB CUDA state dict."""
    from ckpt_methods import make_state, state_bytes, tensor_memory

    from hafo.checkpoint import Checkpointer

    state = {k: v.cuda() for k, v in make_state(mib, random=False).items()}
    torch.cuda.synchronize()
    host = {k: v.cpu().pin_memory() for k, v in state.items()}
    ck = Checkpointer(root / f"hafo-{mib}", keep_last=1, epoch=1, handle_signal=False)
    raw_path, torch_path = root / "raw.bin", root / "torch.pt"
    out: dict[str, list[float]] = {k: [] for k in ("raw", "torch", "save", "stall", "commit")}
    step = 0

    def raw() -> None:
        fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for tensor in host.values():
                view, done = tensor_memory(tensor), 0
                while done < view.nbytes:
                    done += os.write(fd, view[done:done + GIB])
            os.fsync(fd)
        finally:
            os.close(fd)

    def torch_save() -> None:
        with open(torch_path, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())

    for _ in range(repeat):
        raw_path.unlink(missing_ok=True)
        out["raw"].append(median_time(raw, 1))
        raw_path.unlink(missing_ok=True)
        torch_path.unlink(missing_ok=True)
        out["torch"].append(median_time(torch_save, 1))
        torch_path.unlink(missing_ok=True)
        step += 1

        def save(step: int = step) -> None:
            ck.save(state, step=step)

        out["save"].append(median_time(save, 1))
        step += 1
        started = time.perf_counter()
        ck.save_async(state, step=step)
        out["stall"].append(time.perf_counter() - started)
        ck.wait()
        out["commit"].append(time.perf_counter() - started)
    shutil.rmtree(root / f"hafo-{mib}", ignore_errors=True)
    result = {k: statistics.median(v) for k, v in out.items()}
    result["bytes"] = float(state_bytes(host))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temp dir under $HAFO_BENCH_DIR or /tmp)")
    args = parser.parse_args()
    reason = no_cuda_reason()
    if reason is not None:
        print(f"gpu_checkpoint.py: {reason}; nothing measured", file=sys.stderr)
        return 2
    import torch

    started = time.monotonic()
    torch.cuda.init()  # type: ignore[no-untyped-call]
    link = link_under_load(torch)
    limit = link_limit_gbps(link)
    copies = d2h(torch, args.repeat)
    root = Path(tempfile.mkdtemp(prefix="hafo-gpuckpt-",
                                 dir=args.dir or os.environ.get("HAFO_BENCH_DIR")))
    try:
        saves = {mib: save_rows(torch, mib, args.repeat, root) for mib in args.mib}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    name = torch.cuda.get_device_name(0)
    where = (f"PCIe gen {link['gen']} x{link['width']} (max gen {link.get('gen_max')} "
             f"x{link.get('width_max')}, via {link['via']})" if link else "PCIe link unknown")
    print(f"{name}; {where}; link limit "
          + (f"{limit:.1f} GB/s per direction" if limit else "unknown")
          + f"; torch {torch.__version__}")
    print(f"\n{'device-to-host copy, chunk':28s} {'pinned GB/s':>12s} {'% of link':>10s} "
          f"{'pageable GB/s':>14s}")
    for mib, fast, slow in copies:
        share = f"{fast / limit * 100:9.0f}%" if limit else f"{'n/a':>10s}"
        print(f"{f'{mib} MiB':28s} {fast:12.1f} {share} {slow:14.1f}")
    print(f"\n{'CUDA state dict, median of ' + str(args.repeat):28s} {'seconds':>8s} "
          f"{'GB/s':>6s}  ratio")
    for mib, row in saves.items():
        size = row["bytes"]
        print(f"{mib} MiB ({size / GIB:.3f} GiB, 64 tensors)")
        for key, label, note in (
                ("raw", "raw write + fsync (host)", ""),
                ("torch", "torch.save + fsync", ""),
                ("save", "hafo save", f"{row['raw'] / row['save']:.2f}x raw, "
                 f"{row['torch'] / row['save']:.2f}x torch.save"),
                ("stall", "hafo save_async stall", f"{row['stall'] / row['save']:.3f} of save"),
                ("commit", "hafo save_async committed", "")):
            speed = "" if key == "stall" else f"{size / row[key] / GB:6.2f}"
            print(f"  {label:26s} {row[key]:8.3f} {speed:>6s}  {note}".rstrip())
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

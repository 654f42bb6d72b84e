#!/usr/bin/env python3
"""hafo's warm-gang path and snapshot tiers on a machine WITH an NVIDIA GPU: one short run
(under 3 minutes on one H100/H200) that says PASS or FAIL per check.

    .venv/bin/python scripts/gpu_warm_check.py [--device cuda|cpu] [--mib N] [--peer-mib N]
        [--json FILE] [--only CHECK[,CHECK]] [--env NAME=VALUE ...] [--debug]

e.g. ``--env TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` runs the warm members with torch's NCCL
watchdog told not to end the process on a failed collective (to compare with the default).

No hafo cluster is needed: the script plays hafo's guard itself (the warm protocol files in
``$HAFO_WARM_DIR``, the rendezvous stores, the gang's environment), as the unit tests do
(tests/unit/test_warm_sdk.py, tests/unit/test_tiered.py), with real processes on this
machine. ``--device cpu`` runs the same checks with CPU tensors and gloo (2 ranks), so the
script itself is tested without a GPU (tests/unit/test_gpu_warm_check.py).

The checks (``--only`` picks some; ``env`` always runs):

- ``env``: torch and CUDA versions, the GPUs, NCCL's version, the driver (nvidia-smi), the
  NCCL variables in force. Proves the machine can run the rest (NCCL present with CUDA).
- ``pcie``: the device-to-host bandwidth of one ``--mib`` MiB copy into pinned host memory
  (``copy_(non_blocking=True)`` + synchronize; median of several) and into pageable
  memory, against the link's theoretical limit where nvidia-smi says it. On the CPU: a host
  memcpy of the same size (the floor of any snapshot). This is the limit the next check's
  snapshot is held against.
- ``tiers``: ``TieredCheckpointer`` with a ``--mib`` MiB state on the device (random bits:
  NaN payloads too), a gang of one on this node (its own RAM tier, in /dev/shm where it has
  room): the ``snapshot()`` call (``copy="now"`` and ``copy="background"``) against the
  pinned device-to-host copy of the same tensors (the ratio says how close the snapshot's
  copy comes to the PCIe limit), then ``load_latest()`` in the next epoch and the copy back
  onto the device, compared bit for bit. Then a gang of two processes (``--peer-mib``; on one
  GPU both use it: the peer tier goes over TCP, not NCCL) whose rank 1 loses its node's RAM:
  it must restore from its peer's copy, bit for bit. Proves the RAM tiers keep CUDA state
  exactly, and what a snapshot costs against the hardware.
- ``warm``: ``run_warm`` in one process per GPU (NCCL forbids two ranks on one GPU; on the
  CPU 2 ranks with gloo), each all-reducing a device tensor in a loop and checking the sum.
  While they are in their collectives the script asks a park (``park.json``), waits for
  every ``parked.json`` (bounded: ``PARK_LIMIT_S``), hands over the next epoch
  (``epoch.json``: a new store's ``MASTER_PORT``, the ranks swapped) and checks that the same
  processes (pids) join the new group, all-reduce correctly again, and that a device tensor
  allocated before the park still holds its values (the CUDA context survived). Proves the
  SDK's abort of an NCCL group and the re-join, with the park and re-join times.
- ``preflight``: ``python -m hafo.agent.preflight`` (skipped if hafo has none) with one rank
  per GPU (2 on the CPU), the command ``python -c`` printing ok: it must pass, report the
  expected backend, and exec the command in the same process. Reports its figures (backend,
  all-reduce latency and bus bandwidth).

Every check prints its figures and one ``PASS``/``FAIL``/``SKIP`` line; a summary follows.
Exit status: 0 if no check failed, 1 if one did, 2 (one line) with ``--device cuda`` and no
CUDA. ``--json FILE`` writes every figure. Every child process is killed by its pid at the
end; temp files go to ``$TMPDIR`` and /dev/shm and are removed (the logs are kept when a
check failed: the path is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECKS = ("env", "pcie", "tiers", "warm", "preflight")
CHILD_FLAG = "--child"
GB = 1e9
MIB = 2**20
SHM = Path("/dev/shm")
#: The most a park may take, from park.json to every parked.json (the SDK's own teardown
#: bound is 5 s; the unit tests see well under 2 s with gloo).
PARK_LIMIT_S = 10.0
#: All-reduces each rank runs in the handed-over epoch before it returns.
REJOIN_STEPS = 50
#: A device tensor kept across the park (float32 elements).
KEEP_ELEMENTS = 1 << 20
#: Elements of the all-reduced tensor.
REDUCE_ELEMENTS = 1 << 14


class CheckFailed(Exception):
    """An expected failure of a check: its one-line reason."""


@dataclass
class Check:
    """One check's outcome."""

    name: str
    status: str = "PASS"  # PASS, FAIL or SKIP
    reason: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What the checks share: the options, the device, the temp dirs, the children."""

    args: argparse.Namespace
    cuda: bool
    base: Path  # on disk: logs, checkpoint records, reports
    shm: Path  # RAM where /dev/shm has room, else under base
    gpus: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES value per GPU
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stores: list[Any] = field(default_factory=list)

    @property
    def device(self) -> str:
        return "cuda:0" if self.cuda else "cpu"

    def ranks(self) -> int:
        """One rank per GPU (NCCL: one GPU per rank), 2 on the CPU."""
        return max(1, len(self.gpus)) if self.cuda else 2

    def child_env(self, rank: int | None = None, **extra: str) -> dict[str, str]:
        """The environment of a child: this one without hafo's variables, the repo on the
        path, one GPU per rank (none on the CPU), then ``--env`` and ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}
        env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if self.cuda:
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")  # one machine: loopback only
            if rank is not None and self.gpus:
                env["CUDA_VISIBLE_DEVICES"] = self.gpus[rank % len(self.gpus)]
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # --device cpu: gloo, CPU tensors only
        for item in self.args.env:
            name, _, value = item.partition("=")
            env[name] = value
        env.update(extra)
        return env

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start a child (its output to ``log``); it is killed by its pid at the end."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.base)
        self.procs.append(proc)
        return proc

    def kill_children(self) -> None:
        """Kill every child still running, by its pid, and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()

    def store(self) -> int:
        """A new rendezvous store on 127.0.0.1 (the children join it as an agent's store, as
        hafo's members join their epoch's); its port."""
        import torch.distributed as dist

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = int(listener.getsockname()[1])
        store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", port, is_master=True, wait_for_workers=False,
            master_listen_fd=listener.detach(), timeout=timedelta(seconds=60))
        self.stores.append(store)
        return port


# -- small helpers ------------------------------------------------------------------------


def one_line(error: BaseException, limit: int = 240) -> str:
    """``Type: first line of the message``, at most ``limit`` characters."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0].strip()}" if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def tail(path: Path, limit: int = 200) -> str:
    """The last non-empty line of a log (to say why a child failed)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "(no log)"
    text = lines[-1] if lines else "(empty log)"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def median_time(fn: Callable[[], None], repeat: int) -> float:
    """The median seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def wait_until(what: str, ready: Callable[[], Any], timeout: float,
               alive: Callable[[], str | None] | None = None) -> Any:
    """Poll ``ready`` until it returns a true value; CheckFailed after ``timeout`` or as soon
    as ``alive`` says why it cannot come any more."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if alive is not None:
            dead = alive()
            if dead:
                raise CheckFailed(f"{what}: {dead}")
        if time.monotonic() >= deadline:
            raise CheckFailed(f"{what}: not within {timeout:g}s")
        time.sleep(0.01)


def exit_text(code: int | None) -> str:
    """``exited 3`` or ``was killed by SIGABRT``."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited {code}"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` by a rename (as hafo's guard writes its files)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sync(device: str) -> None:
    """Wait for the device's queued work."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def file_barrier(directory: Path, name: str, rank: int, world: int, timeout: float) -> None:
    """Every rank of a child gang reaches ``name`` (a file each in ``directory``)."""
    (directory / f"{name}-{rank}").touch()
    deadline = time.monotonic() + timeout
    while not all((directory / f"{name}-{r}").exists() for r in range(world)):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"barrier {name}: not every rank within {timeout:g}s")
        time.sleep(0.01)


# -- the state the tier checks snapshot -------------------------------------------------


def make_state(mib: float, device: str, seed: int) -> dict[str, Any]:
    """A model-like state of about ``mib`` MiB on ``device``: 8 float32 tensors of random
    bits (NaN payloads, denormals: any change shows in a bitwise compare), a bfloat16 one, a
    counter and the step."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    count = max(1, int(mib * MIB) // 8 // 4)

    def bits(n: int, dtype: Any, view: Any) -> Any:
        low, high = (-2**31, 2**31 - 1) if dtype == torch.int32 else (-2**15, 2**15 - 1)
        raw = torch.randint(low, high, (n,), dtype=dtype, generator=generator, device=device)
        return raw.view(view)

    return {"layers": {f"w{i}": bits(count, torch.int32, torch.float32) for i in range(8)},
            "half": bits(4096, torch.int16, torch.bfloat16),
            "counter": torch.zeros(1, dtype=torch.int64, device=device), "step": 0}


def tensors(state: dict[str, Any]) -> dict[str, Any]:
    """The state's tensors by a dotted name."""
    import torch

    out: dict[str, Any] = {}

    def walk(value: Any, name: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{name}.{key}" if name else str(key))
        elif isinstance(value, torch.Tensor):
            out[name] = value

    walk(state, "")
    return out


def state_bytes(state: dict[str, Any]) -> int:
    """The bytes of the state's tensors."""
    return sum(t.numel() * t.element_size() for t in tensors(state).values())


def mutate(state: dict[str, Any], step: int) -> None:
    """Change the state for ``step`` (on the device), as a training step would."""
    import torch

    state["counter"].fill_(step)
    state["step"] = step
    first = state["layers"]["w0"].view(torch.int32)
    first[:256].bitwise_xor_(step)


def to_device(state: Any, device: str) -> Any:
    """A restored state's tensors moved onto ``device``."""
    import torch

    if isinstance(state, dict):
        return {k: to_device(v, device) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


def mismatches(live: dict[str, Any], restored: dict[str, Any]) -> list[str]:
    """The names of the tensors (and values) of ``restored`` that differ from ``live``, bit
    for bit."""
    import torch

    wrong: list[str] = []
    ours, theirs = tensors(live), tensors(restored)
    for name, tensor in ours.items():
        other = theirs.get(name)
        if (other is None or other.dtype != tensor.dtype or other.shape != tensor.shape
                or other.device != tensor.device
                or not torch.equal(other.reshape(-1).view(torch.uint8),
                                   tensor.reshape(-1).view(torch.uint8))):
            wrong.append(name)
    wrong += sorted(set(theirs) - set(ours))
    if restored.get("step") != live.get("step"):
        wrong.append("step")
    return wrong


def copy_floor(state: dict[str, Any], device: str, repeat: int = 5) -> float:
    """The median seconds of one copy of every tensor of the state into host buffers kept
    from copy to copy (pinned for a device): the snapshot's floor (the PCIe limit)."""
    import torch

    sources = list(tensors(state).values())
    cuda = device.startswith("cuda")
    buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in sources]

    def copy() -> None:
        for buffer, source in zip(buffers, sources, strict=True):
            buffer.copy_(source, non_blocking=cuda)
        sync(device)

    copy()  # first touch
    seconds = median_time(copy, repeat)
    buffers.clear()  # the pinned memory back before the snapshots take theirs
    return seconds


# -- check: env ---------------------------------------------------------------------------


def nvidia_smi() -> str | None:
    """nvidia-smi's line for each GPU (name, driver, memory, PCIe link), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,"
             "pcie.link.gen.current,pcie.link.width.current", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {one_line(exc)}"
    return (done.stdout.strip() or done.stderr.strip()).replace("\n", " | ") or None


def check_env(ctx: Context, check: Check) -> None:
    import torch
    import torch.distributed as dist

    f = check.figures
    f.update(torch=torch.__version__, python=platform.python_version(),
             cuda_available=torch.cuda.is_available(), cuda_build=torch.version.cuda,
             cpus=os.cpu_count(), gloo=dist.is_gloo_available(),
             nccl_available=dist.is_nccl_available(),
             env={k: v for k, v in sorted(os.environ.items())
                  if k.startswith(("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES"))},
             child_env=list(ctx.args.env), shm=str(ctx.shm), shm_is_ram=is_ram(ctx.shm))
    print(f"  torch {f['torch']} (CUDA build {f['cuda_build']}), python {f['python']}, "
          f"{f['cpus']} CPUs; CUDA available: {f['cuda_available']}")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        f["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
        f["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        f["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        try:
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            f["nccl"] = (".".join(map(str, version)) if isinstance(version, tuple)
                         else str(version))
        except Exception as exc:  # a build without NCCL: said, and judged below
            f["nccl"] = f"none ({one_line(exc)})"
        print(f"  {count} GPU(s): {', '.join(f['gpus'])} (capability {f['capability']}, "
              f"{f['gpu_memory_gib']} GiB); NCCL {f['nccl']}")
    f["nvidia_smi"] = nvidia_smi()
    if f["nvidia_smi"]:
        print(f"  nvidia-smi: {f['nvidia_smi']}")
    print(f"  NCCL/TORCH_NCCL variables: {f['env'] or 'none set'}"
          + (f"; children get {' '.join(ctx.args.env)}" if ctx.args.env else ""))
    print(f"  RAM tier dir: {ctx.shm} ({'RAM' if f['shm_is_ram'] else 'disk'})")
    if ctx.cuda and not f["nccl_available"]:
        raise CheckFailed("torch has no NCCL: the warm path cannot run on the GPUs")
    if not f["gloo"]:
        raise CheckFailed("torch has no gloo backend")
    check.reason = (f"torch {f['torch']}, " + (f"{len(f['gpus'])} GPU(s), NCCL {f['nccl']}"
                                               if ctx.cuda else "CPU, gloo"))


def is_ram(path: Path) -> bool:
    """Whether ``path`` is on a tmpfs (RAM), as far as /proc/mounts says."""
    best, kind = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind in ("tmpfs", "ramfs")


# -- check: pcie --------------------------------------------------------------------------


def link_limit() -> tuple[float | None, str]:
    """The GPU's PCIe link limit per direction (GB/s), read while a copy runs, and how it
    was read (scripts/gpu_checkpoint.py's helpers)."""
    try:
        sys.path.insert(0, str(ROOT / "scripts"))
        import gpu_checkpoint
        import torch

        info = gpu_checkpoint.link_under_load(torch)
        limit = gpu_checkpoint.link_limit_gbps(info)
        if not info:
            return None, "link unknown (no pynvml, no nvidia-smi)"
        return limit, (f"PCIe gen {info.get('gen')} x{info.get('width')} (max gen "
                       f"{info.get('gen_max')} x{info.get('width_max')}, via {info.get('via')})")
    except Exception as exc:  # the link's limit is a bonus: the measured copy is the check
        return None, f"link unknown ({one_line(exc)})"


def check_pcie(ctx: Context, check: Check) -> None:
    import torch

    n = int(ctx.args.mib * MIB)
    f = check.figures
    f["bytes"] = n
    if ctx.cuda:
        src = torch.empty(n, dtype=torch.uint8, device=ctx.device).fill_(7)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        pageable = torch.empty(n, dtype=torch.uint8)
        pageable.fill_(0)  # its pages faulted in first

        def into(dst: Any) -> Callable[[], None]:
            def run() -> None:
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
            return run

        into(pinned)()
        fast = median_time(into(pinned), 7)
        slow = median_time(into(pageable), 3)
        if not torch.equal(pinned[:4096].cpu(), src[:4096].cpu()):
            raise CheckFailed("the pinned copy does not hold the device's bytes")
        del src, pinned, pageable
        limit, how = link_limit()
        f.update(pinned_s=fast, pinned_gbps=n / fast / GB, pageable_s=slow,
                 pageable_gbps=n / slow / GB, link_limit_gbps=limit, link=how)
        f["d2h_gbps"] = f["pinned_gbps"]
        share = f" = {f['pinned_gbps'] / limit * 100:.0f}% of the link's {limit:.1f} GB/s" \
            if limit else ""
        print(f"  {how}")
        print(f"  device-to-host {n / MIB:.0f} MiB: pinned {fast * 1e3:.1f} ms "
              f"({f['pinned_gbps']:.1f} GB/s{share}); pageable {slow * 1e3:.1f} ms "
              f"({f['pageable_gbps']:.1f} GB/s)")
        check.reason = f"pinned D2H {f['pinned_gbps']:.1f} GB/s" + (
            f" ({f['pinned_gbps'] / limit * 100:.0f}% of the link)" if limit else "")
    else:
        src = torch.empty(n, dtype=torch.uint8).fill_(7)
        dst = torch.empty(n, dtype=torch.uint8)
        dst.fill_(0)

        def copy() -> None:
            dst.copy_(src)

        seconds = median_time(copy, 7)
        f.update(host_copy_s=seconds, host_copy_gbps=n / seconds / GB)
        f["d2h_gbps"] = f["host_copy_gbps"]
        print(f"  host memcpy {n / MIB:.0f} MiB: {seconds * 1e3:.2f} ms "
              f"({f['host_copy_gbps']:.1f} GB/s): no PCIe on the CPU, this is the floor")
        check.reason = f"host copy {f['host_copy_gbps']:.1f} GB/s"
    if f["d2h_gbps"] <= 0.1:
        raise CheckFailed(f"the copy ran at {f['d2h_gbps']:.3f} GB/s: something is wrong")


# -- check: tiers -------------------------------------------------------------------------


def check_tiers(ctx: Context, check: Check) -> None:
    from hafo.checkpoint.tiered import TieredCheckpointer

    f = check.figures
    device = ctx.device
    state = make_state(ctx.args.mib, device, seed=1)
    sync(device)
    size = state_bytes(state)
    floor = copy_floor(state, device)
    f.update(bytes=size, floor_s=floor, floor_gbps=size / floor / GB)
    what = "pinned device-to-host copy" if ctx.cuda else "host copy"
    print(f"  state {size / MIB:.0f} MiB on {device} ({len(tensors(state))} tensors); "
          f"{what} of its tensors {floor * 1e3:.1f} ms ({f['floor_gbps']:.1f} GB/s)")
    background = "copy" in inspect.signature(TieredCheckpointer.snapshot).parameters
    ram = ctx.shm / "own"
    common: dict[str, Any] = dict(rank=0, world_size=1, durable_every=0, memory_dir=ram,
                                  address="127.0.0.1", handle_signal=False, keep_last=2,
                                  restore_timeout=60.0)
    ck = TieredCheckpointer(ctx.base / "ck-own", epoch=1, **common)
    step = 0
    now_calls: list[float] = []
    now_written: list[float] = []
    bg_calls: list[float] = []
    bg_copied: list[float] = []
    bg_written: list[float] = []
    try:
        for round_ in range(4):  # the first: untimed (first touch of the staging buffers)
            step += 1
            mutate(state, step)
            sync(device)
            began = time.perf_counter()
            ck.snapshot(state, step)
            called = time.perf_counter()
            ck.wait()
            if round_:
                now_calls.append(called - began)
                now_written.append(time.perf_counter() - began)
        for _ in range(3 if background else 0):
            step += 1
            mutate(state, step)
            sync(device)
            began = time.perf_counter()
            ck.snapshot(state, step, copy="background")
            called = time.perf_counter()
            ck.wait_snapshot()
            copied = time.perf_counter()
            ck.wait()
            bg_calls.append(called - began)
            bg_copied.append(copied - began)
            bg_written.append(time.perf_counter() - began)
        stats = asdict(ck.stats)
    finally:
        ck.close()
    f["stats"] = stats
    if stats["snapshots"] != step or stats["memory_failures"]:
        raise CheckFailed(f"{stats['snapshots']} of {step} snapshots kept in RAM "
                          f"({stats['memory_failures']} failures: {stats['last_error']})")
    snap = statistics.median(now_calls)
    f.update(snapshot_s=snap, snapshot_gbps=size / snap / GB,
             snapshot_written_s=statistics.median(now_written),
             snapshot_vs_floor=floor / snap)
    print(f"  snapshot(copy='now'): call {snap * 1e3:.1f} ms ({f['snapshot_gbps']:.1f} GB/s, "
          f"{f['snapshot_vs_floor']:.2f} of the {what}'s speed); in RAM after "
          f"{f['snapshot_written_s'] * 1e3:.1f} ms")
    if background:
        f.update(background_call_s=statistics.median(bg_calls),
                 background_copied_s=statistics.median(bg_copied),
                 background_written_s=statistics.median(bg_written))
        print(f"  snapshot(copy='background'): call {f['background_call_s'] * 1e3:.2f} ms, "
              f"copied after {f['background_copied_s'] * 1e3:.1f} ms, in RAM after "
              f"{f['background_written_s'] * 1e3:.1f} ms")
    else:
        print("  snapshot(copy='background'): not in this SDK")
    ck = TieredCheckpointer(ctx.base / "ck-own", epoch=2, **common)
    try:
        began = time.perf_counter()
        restored = ck.load_latest()
        loaded = time.perf_counter()
        if restored is None:
            raise CheckFailed("load_latest() found nothing in the next epoch")
        on_device = to_device(restored.state, device)
        sync(device)
        done = time.perf_counter()
    finally:
        ck.close()
    f.update(restore_tier=restored.tier, restore_step=restored.step,
             restore_s=done - began, restore_load_s=loaded - began,
             restore_to_device_s=done - loaded)
    print(f"  load_latest() in epoch 2: tier {restored.tier}, epoch {restored.epoch} step "
          f"{restored.step}, {f['restore_load_s'] * 1e3:.1f} ms + "
          f"{f['restore_to_device_s'] * 1e3:.1f} ms onto {device}")
    if (restored.tier, restored.epoch, restored.step) != ("own", 1, step):
        raise CheckFailed(f"restored {restored.tier} epoch {restored.epoch} step "
                          f"{restored.step}, not own epoch 1 step {step}")
    wrong = mismatches(state, on_device)
    if wrong:
        raise CheckFailed(f"the restored state differs from the snapshot's in "
                          f"{', '.join(wrong[:5])}")
    del state, on_device, restored
    shutil.rmtree(ram, ignore_errors=True)
    peer_gang(ctx, check)
    check.reason = (f"snapshot {f['snapshot_s'] * 1e3:.0f} ms = {f['snapshot_vs_floor']:.2f}"
                    f" of the {'PCIe' if ctx.cuda else 'copy'} floor; own restore "
                    f"{f['restore_s'] * 1e3:.0f} ms, peer restore "
                    f"{f['peer_restore_s'] * 1e3:.0f} ms, bitwise equal")


def peer_gang(ctx: Context, check: Check) -> None:
    """Two processes, a gang of two: each snapshots twice (a copy to the other's RAM), then
    in the next epoch rank 1's node RAM is gone: it restores from rank 0's node."""
    f = check.figures
    mib = ctx.args.peer_mib
    sync_dir = ctx.base / "peer-sync"
    sync_dir.mkdir()
    procs = []
    for rank in range(2):
        spec = {"rank": rank, "device": ctx.device, "mib": mib, "ck": str(ctx.base / "ck-peer"),
                "ram1": str(ctx.shm / f"node{rank}"),
                "ram2": str(ctx.shm / ("node0" if rank == 0 else "spare")),
                "sync": str(sync_dir), "out": str(ctx.base / f"peer-{rank}.json"),
                "timeout": 90.0}
        procs.append(ctx.spawn([sys.executable, str(Path(__file__).resolve()), CHILD_FLAG,
                                "tier-peer", json.dumps(spec)],
                               ctx.child_env(0, HAFO_NODE=f"node{rank}"),
                               ctx.base / f"peer-{rank}.log"))
    deadline = time.monotonic() + 150
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"peer gang: rank {rank} still runs after 150s "
                              f"({tail(ctx.base / f'peer-{rank}.log')})") from None
    results = []
    for rank, proc in enumerate(procs):
        out = ctx.base / f"peer-{rank}.json"
        result = json.loads(out.read_text()) if out.exists() else {}
        if proc.returncode != 0 or result.get("error"):
            raise CheckFailed(f"peer gang: rank {rank} {exit_text(proc.returncode)}: "
                              f"{result.get('error') or tail(ctx.base / f'peer-{rank}.log')}")
        results.append(result)
    f["peer"] = results
    zero, one = results
    for result in results:
        if result["stats"]["peer_copies"] != 2:
            raise CheckFailed(f"peer gang: rank {result['rank']} copied "
                              f"{result['stats']['peer_copies']} of 2 snapshots to its peer "
                              f"({result['stats']['last_error']})")
    if (zero["tier"], zero["step"]) != ("own", 2) or (one["tier"], one["step"]) != ("peer", 2):
        raise CheckFailed(f"peer gang: restored rank 0 from {zero['tier']} step {zero['step']}"
                          f", rank 1 from {one['tier']} step {one['step']}; expected own and "
                          f"peer, step 2")
    for result in results:
        if result["mismatches"]:
            raise CheckFailed(f"peer gang: rank {result['rank']}'s restored state differs in "
                              f"{', '.join(result['mismatches'][:5])}")
    f.update(peer_bytes=one["bytes"], peer_restore_s=one["restore_s"],
             peer_restore_gbps=one["bytes"] / one["restore_s"] / GB,
             peer_source=one["source"])
    print(f"  gang of 2 ({mib:g} MiB each, rank 1's node RAM lost): rank 0 restored from own "
          f"RAM in {zero['restore_s'] * 1e3:.0f} ms, rank 1 from its peer ({one['source']}) "
          f"in {one['restore_s'] * 1e3:.0f} ms ({f['peer_restore_gbps']:.2f} GB/s, "
          f"{one['to_device_s'] * 1e3:.0f} ms of it onto {ctx.device}), bitwise equal")


def tier_peer_child(spec: dict[str, Any]) -> int:
    """One rank of the peer gang (see ``peer_gang``); its result as JSON in ``spec['out']``."""
    out = Path(spec["out"])
    try:
        import torch

        from hafo.checkpoint.tiered import TieredCheckpointer

        torch.set_num_threads(1)
        rank, device, timeout = int(spec["rank"]), str(spec["device"]), float(spec["timeout"])
        state = make_state(float(spec["mib"]), device, seed=100 + rank)
        common: dict[str, Any] = dict(rank=rank, world_size=2, durable_every=0,
                                      address="127.0.0.1", handle_signal=False,
                                      restore_timeout=timeout)
        ck = TieredCheckpointer(spec["ck"], epoch=1, memory_dir=spec["ram1"], **common)
        # As a workload starts: nothing to restore, but it waits for every member's record
        # (where its peer's server listens) before the first snapshot is sent there.
        if ck.load_latest() is not None:
            raise RuntimeError("a new gang found a snapshot in epoch 1")
        for step in (1, 2):
            mutate(state, step)
            sync(device)
            ck.snapshot(state, step)
            ck.wait()
        stats = asdict(ck.stats)
        file_barrier(Path(spec["sync"]), "sent", rank, 2, timeout)  # both copies received
        ck.close()
        if rank == 1:
            shutil.rmtree(spec["ram1"], ignore_errors=True)  # its node is lost, RAM and all
        ck = TieredCheckpointer(spec["ck"], epoch=2, memory_dir=spec["ram2"], **common)
        began = time.perf_counter()
        restored = ck.load_latest()
        loaded = time.perf_counter()
        if restored is None:
            raise RuntimeError("load_latest() found nothing")
        on_device = to_device(restored.state, device)
        sync(device)
        done = time.perf_counter()
        wrong = mismatches(state, on_device)
        source = ck.last_restore.source if ck.last_restore else None
        file_barrier(Path(spec["sync"]), "restored", rank, 2, timeout)  # rank 1 fetched
        ck.close()
        result = {"rank": rank, "tier": restored.tier, "epoch": restored.epoch,
                  "step": restored.step, "restore_s": done - began,
                  "to_device_s": done - loaded, "bytes": state_bytes(state),
                  "mismatches": wrong, "source": source, "stats": stats}
        code = 0
    except Exception as exc:
        result, code = {"error": one_line(exc)}, 1
        traceback.print_exc()
    write_atomic(out, json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- check: warm --------------------------------------------------------------------------


def warm_child(spec: dict[str, Any]) -> int:
    """A warm member: ``run_warm`` whose ``train`` all-reduces a device tensor in a loop
    (forever in its first epoch, ``REJOIN_STEPS`` times once warm); every event goes to the
    records file as a JSON line."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch
    import torch.distributed as dist

    from hafo.checkpoint import run_warm

    cuda = spec["device"].startswith("cuda")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    fd = os.open(spec["records"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(**fields: Any) -> None:
        line = json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n"
        os.write(fd, line.encode())

    # Allocated before the first epoch: still valid after the park if the CUDA context is.
    keep = torch.arange(KEEP_ELEMENTS, dtype=torch.float32, device=device) * 0.5
    keep_ptr = keep.data_ptr()

    def keep_ok() -> bool:
        fresh = torch.arange(KEEP_ELEMENTS, dtype=torch.float32, device=device) * 0.5
        return keep.data_ptr() == keep_ptr and bool(torch.equal(keep, fresh))

    def train(warm: Any) -> int:
        try:
            ok = keep_ok()
        except Exception as exc:  # the CUDA context is gone: said, and the epoch goes on
            ok = False
            record(event="keep-error", epoch=warm.epoch, error=one_line(exc))
        record(event="start", epoch=warm.epoch, rank=warm.rank, world=warm.world_size,
               generation=warm.generation, keep_ok=ok, backend=str(dist.get_backend()),
               port=os.environ.get("MASTER_PORT"))
        expected = warm.world_size * (warm.world_size + 1) / 2
        buffer = torch.empty(REDUCE_ELEMENTS, dtype=torch.float32, device=device)
        steps, last = 0, time.monotonic()
        try:
            while True:
                buffer.fill_(float(warm.rank + 1))
                dist.all_reduce(buffer)
                if not bool(buffer.eq(expected).all()):
                    raise RuntimeError(f"all_reduce gave {buffer[0].item()}, not {expected}")
                steps += 1
                now = time.monotonic()
                if steps == 1:
                    record(event="first", epoch=warm.epoch)
                if now - last >= 0.1:
                    record(event="progress", epoch=warm.epoch, steps=steps)
                    last = now
                if warm.generation > 0 and steps >= REJOIN_STEPS:
                    record(event="trained", epoch=warm.epoch, steps=steps)
                    return steps
                if not cuda:
                    time.sleep(0.002)  # 2 ranks on a small CPU: leave it some room
        except Exception as exc:
            record(event="error", epoch=warm.epoch, steps=steps, error=one_line(exc, 300))
            raise

    def parked(done: Any) -> None:
        record(event="parked", epoch=done.epoch)

    try:
        steps = run_warm(train, backend=None if cuda else "gloo",
                         timeout=timedelta(seconds=float(spec["timeout"])),
                         park_wait=float(spec["park_wait"]), on_park=parked)
        record(event="done", steps=steps, keep_ok=keep_ok())
        code = 0
    except Exception as exc:
        record(event="raised", error=one_line(exc, 300))
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: a native thread of torch's can block it


#: What the SDK logs of a park and a join (hafo.checkpoint.warm), for its own timings.
SDK_LINES = {
    "abort_s": re.compile(r"epoch 1: process group aborted in ([0-9.]+)s"),
    "teardown_s": re.compile(r"epoch 1: parked .* \(teardown ([0-9.]+)s\)"),
    "join_s": re.compile(r"epoch 2: rank \d+ of \d+ joined in ([0-9.]+)s"),
}


def sdk_times(log: Path) -> dict[str, float]:
    """The abort, teardown and epoch 2 join times a warm member's SDK logged."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found: dict[str, float] = {}
    for key, pattern in SDK_LINES.items():
        match = pattern.search(text)
        if match:
            found[key] = float(match.group(1))
    return found


def check_warm(ctx: Context, check: Check) -> None:
    from hafo.model.warm import (
        EPOCH_FILE,
        PARK_FILE,
        PARKED_FILE,
        NextEpoch,
        ParkRequest,
        encode_next_epoch,
        encode_park,
        parse_parked,
    )

    f = check.figures
    world = ctx.ranks()
    backend = "nccl" if ctx.cuda else "gloo"
    records = ctx.base / "warm.jsonl"
    port = ctx.store()
    procs: list[subprocess.Popen[bytes]] = []
    dirs: list[Path] = []
    started = time.time()
    for rank in range(world):
        warm_dir = ctx.base / f"warm-{rank}"
        warm_dir.mkdir(mode=0o700)
        dirs.append(warm_dir)
        # gloo: a member whose peer shut its connection down before its own abort can stay
        # in its next all-reduce until the group's timeout (hafo.checkpoint.warm, "Unblocking
        # a collective"; about 1 park in 8 on 2 CPU ranks): kept below PARK_LIMIT_S
        spec = {"device": ctx.device, "records": str(records),
                "timeout": 60.0 if ctx.device.startswith("cuda") else PARK_LIMIT_S - 3,
                "park_wait": 10.0}
        env = ctx.child_env(rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                            HAFO_EPOCH="1", HAFO_WARM_DIR=str(warm_dir),
                            TORCHELASTIC_USE_AGENT_STORE="True",
                            TORCHELASTIC_RESTART_COUNT="0")
        procs.append(ctx.spawn([sys.executable, str(Path(__file__).resolve()), CHILD_FLAG,
                                "warm", json.dumps(spec)], env,
                               ctx.base / f"warm-{rank}.log"))
    pids = [p.pid for p in procs]

    def lines() -> list[dict[str, Any]]:
        if not records.exists():
            return []
        out = []
        for line in records.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def of(rank: int, event: str, **match: Any) -> list[dict[str, Any]]:
        return [r for r in lines() if r["pid"] == pids[rank] and r["event"] == event
                and all(r.get(k) == v for k, v in match.items())]

    def alive() -> str | None:
        for rank, proc in enumerate(procs):
            if proc.poll() is not None:
                raised = of(rank, "raised") or of(rank, "error")
                why = raised[-1]["error"] if raised else tail(ctx.base / f"warm-{rank}.log")
                return f"rank {rank} (pid {proc.pid}) {exit_text(proc.returncode)}: {why}"
        return None

    start_limit = 120.0 if ctx.cuda else 60.0
    wait_until(f"every rank all-reducing in epoch 1 ({backend}, {world} rank(s))",
               lambda: all(of(r, "progress", epoch=1) for r in range(world)), start_limit,
               alive)
    first = [of(r, "first", epoch=1)[0]["t"] - started for r in range(world)]
    f.update(world=world, backend=backend, pids=pids, epoch1_first_collective_s=max(first))
    print(f"  {world} rank(s) ({backend}, pids {', '.join(map(str, pids))}) all-reducing "
          f"in epoch 1; first collective {max(first):.1f} s after the start")

    # Park: asked while every rank is in its all-reduce loop.
    asked = time.time()
    for warm_dir in dirs:
        write_atomic(warm_dir / PARK_FILE, encode_park(ParkRequest(1)))
    parked_at: dict[int, float] = {}

    def all_parked() -> bool:
        for rank, warm_dir in enumerate(dirs):
            if rank not in parked_at and (warm_dir / PARKED_FILE).exists():
                parked_at[rank] = time.time()
        return len(parked_at) == world

    wait_until(f"every rank parked within {PARK_LIMIT_S:g}s", all_parked, PARK_LIMIT_S, alive)
    park_s = [parked_at[r] - asked for r in range(world)]
    for rank, warm_dir in enumerate(dirs):
        confirmation = parse_parked((warm_dir / PARKED_FILE).read_text())
        if confirmation is None or (confirmation.epoch, confirmation.pid) != (1, pids[rank]):
            raise CheckFailed(f"rank {rank}'s parked.json says {confirmation}, not epoch 1 "
                              f"pid {pids[rank]}")
    ended = {r: (of(r, "error", epoch=1) or [{"error": "(train returned)"}])[0]["error"]
             for r in range(world)}
    f.update(park_s=max(park_s), park_s_per_rank=park_s, epoch1_ended_by=ended)
    print(f"  parked {max(park_s) * 1e3:.0f} ms after park.json (per rank: "
          f"{', '.join(f'{s * 1e3:.0f} ms' for s in park_s)}); epoch 1 ended by: "
          + "; ".join(f"rank {r}: {e[:120]}" for r, e in ended.items()))

    # Hand-over: a new store, the ranks swapped (a warm member may get another rank).
    port2 = ctx.store()
    handed = time.time()
    for rank, warm_dir in enumerate(dirs):
        env = {"HAFO_EPOCH": "2", "MASTER_PORT": str(port2), "RANK": str(world - 1 - rank)}
        write_atomic(warm_dir / EPOCH_FILE, encode_next_epoch(NextEpoch(2, env)))
    wait_until("every rank's first all-reduce in epoch 2",
               lambda: all(of(r, "first", epoch=2) for r in range(world)), 90.0, alive)
    rejoin = [of(r, "first", epoch=2)[0]["t"] - handed for r in range(world)]
    f.update(rejoin_s=max(rejoin), rejoin_s_per_rank=rejoin)
    deadline = time.monotonic() + 60
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"rank {rank} still runs 60s after its first all-reduce in "
                              f"epoch 2 ({tail(ctx.base / f'warm-{rank}.log')})") from None
    problems = []
    for rank, proc in enumerate(procs):
        start = of(rank, "start", epoch=2)
        done = of(rank, "done")
        if proc.returncode != 0 or not done:
            why = (of(rank, "raised") or of(rank, "error", epoch=2) or [{}])[-1].get(
                "error") or tail(ctx.base / f"warm-{rank}.log")
            problems.append(f"rank {rank} {exit_text(proc.returncode)}: {why}")
            continue
        if not start or start[0]["generation"] != 1 or start[0]["rank"] != world - 1 - rank:
            problems.append(f"rank {rank}: epoch 2 started as {start[:1]}, not warm "
                            f"(generation 1) as rank {world - 1 - rank}")
        elif start[0]["backend"] != backend:
            problems.append(f"rank {rank}: backend {start[0]['backend']}, not {backend}")
        elif not (start[0]["keep_ok"] and done[0]["keep_ok"]):
            problems.append(f"rank {rank}: the device tensor allocated before the park lost "
                            f"its values (keep_ok {start[0]['keep_ok']}, "
                            f"{done[0]['keep_ok']})")
        elif done[0]["steps"] != REJOIN_STEPS:
            problems.append(f"rank {rank}: {done[0]['steps']} all-reduces in epoch 2, not "
                            f"{REJOIN_STEPS}")
    sdk = [sdk_times(ctx.base / f"warm-{rank}.log") for rank in range(world)]
    f["sdk_log"] = sdk
    if problems:
        raise CheckFailed("; ".join(problems))
    print("  the SDK logged: " + "; ".join(
        f"rank {r}: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in times.items())
        for r, times in enumerate(sdk)))
    print(f"  epoch 2 handed over: the same pids re-joined (ranks swapped, new store), first "
          f"all-reduce {max(rejoin) * 1e3:.0f} ms after epoch.json (per rank: "
          f"{', '.join(f'{s * 1e3:.0f} ms' for s in rejoin)}); {REJOIN_STEPS} correct "
          f"all-reduces each; the tensor allocated before the park is intact")
    check.reason = (f"{world} rank(s) {backend}: park {max(park_s) * 1e3:.0f} ms, re-join "
                    f"{max(rejoin) * 1e3:.0f} ms, same pids, device memory intact")


# -- check: preflight ---------------------------------------------------------------------


def check_preflight(ctx: Context, check: Check) -> None:
    if importlib.util.find_spec("hafo.agent.preflight") is None:
        check.status = "SKIP"
        check.reason = "hafo.agent.preflight is not in this checkout"
        return
    f = check.figures
    world = ctx.ranks()
    backend = "nccl" if ctx.cuda else "gloo"
    port = free_port()
    large = int(min(ctx.args.mib, 256)) if ctx.cuda else max(1, int(min(ctx.args.mib, 16)))
    procs = []
    for rank in range(world):
        out = ctx.base / f"preflight-{rank}.json"
        argv = [sys.executable, "-m", "hafo.agent.preflight", "--out", str(out),
                "--timeout", "60", "--slowdown", "50", "--min-excess", "10",
                "--large-mib", str(large), "--", sys.executable, "-c",
                "import os; print('preflight-ok', os.getpid())"]
        env = ctx.child_env(rank, HAFO_GANG_RANK=str(rank), HAFO_GANG_SIZE=str(world),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            HAFO_NODE=f"node{rank}")
        procs.append(ctx.spawn(argv, env, ctx.base / f"preflight-{rank}.log"))
    deadline = time.monotonic() + 150
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"rank {rank} still runs after 150s "
                              f"({tail(ctx.base / f'preflight-{rank}.log')})") from None
    reports: list[dict[str, Any]] = []
    for rank, proc in enumerate(procs):
        log = ctx.base / f"preflight-{rank}.log"
        path = ctx.base / f"preflight-{rank}.json"
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            report = None
        if proc.returncode != 0 or not isinstance(report, dict):
            raise CheckFailed(f"rank {rank} {exit_text(proc.returncode)}"
                              + ("" if isinstance(report, dict) else ", no report")
                              + f": {tail(log)}")
        if not report.get("passed"):
            raise CheckFailed(f"rank {rank}: the pre-flight failed: {report.get('why')}")
        said = log.read_text(errors="replace")
        if f"preflight-ok {proc.pid}" not in said:
            raise CheckFailed(f"rank {rank}: the command did not run in the same process "
                              f"(pid {proc.pid}): {tail(log)}")
        if report.get("backend") != backend:
            raise CheckFailed(f"rank {rank}: backend {report.get('backend')!r}, not {backend}")
        reports.append(report)
    zero = reports[0]
    bandwidth = zero.get("large_bandwidth")
    latency = zero.get("small_latency")
    f.update(world=world, backend=zero.get("backend"), small_latency_s=latency,
             large_bandwidth_gbps=bandwidth / GB if bandwidth else None,
             large_bytes=zero.get("large_bytes"), seconds=zero.get("seconds"),
             ranks=zero.get("ranks"))
    speed = (f"{f['large_bandwidth_gbps']:.2f} GB/s bus bandwidth" if bandwidth
             else "no bus bandwidth (one rank)")
    print(f"  {world} rank(s), {zero.get('backend')}: passed in {zero.get('seconds')} s; "
          f"all-reduce 4 KiB {latency * 1e3 if latency else float('nan'):.3f} ms, "
          f"{(zero.get('large_bytes') or 0) / MIB:.0f} MiB: {speed}; the command ran in the "
          f"same pid")
    check.reason = f"{world} rank(s) {zero.get('backend')}, {speed}"


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (NCCL, device tensors; default) or cpu (gloo, 2 ranks)")
    parser.add_argument("--mib", type=float, default=None,
                        help="the state and the copies, MiB (default: 1024 on cuda, 64 on cpu)")
    parser.add_argument("--peer-mib", type=float, default=None,
                        help="each rank's state in the gang of two (default: --mib, at most "
                             "256)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--only", default="",
                        help=f"checks to run, comma-separated, of {','.join(CHECKS)} "
                             "(env always runs)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for the child processes (warm, peer gang, "
                             "pre-flight), e.g. TORCH_NCCL_ASYNC_ERROR_HANDLING=0")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an unexpected error")
    args = parser.parse_args(argv)
    if args.mib is None:
        args.mib = 1024.0 if args.device == "cuda" else 64.0
    if args.peer_mib is None:
        args.peer_mib = min(args.mib, 256.0)
    if args.mib <= 0 or args.peer_mib <= 0:
        parser.error("--mib and --peer-mib must be above 0")
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown:
        parser.error(f"--only: unknown check {', '.join(unknown)} (of {', '.join(CHECKS)})")
    args.checks = ["env", *[c for c in CHECKS[1:] if not chosen or c in chosen]]
    for item in args.env:
        if "=" not in item or not item.split("=", 1)[0]:
            parser.error(f"--env {item!r} is not NAME=VALUE")
    return args


def no_cuda_reason() -> str | None:
    """Why ``--device cuda`` cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return (f"no CUDA device (torch {torch.__version__}, CUDA build "
                f"{torch.version.cuda}: torch.cuda.is_available() is False)")
    return None


def ram_dir(base: Path, need: int) -> Path:
    """A temp dir in /dev/shm if it has room for ``need`` bytes, else under ``base``."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        with contextlib.suppress(OSError):
            if shutil.disk_usage(SHM).free > need:
                return Path(tempfile.mkdtemp(prefix="hafo-gpucheck-", dir=SHM))
    path = base / "ram"
    path.mkdir()
    return path


def gpu_list() -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each GPU this process sees."""
    import torch

    count = torch.cuda.device_count()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    return visible[:count] if len(visible) >= count else [str(i) for i in range(count)]


RUNNERS: dict[str, Callable[[Context, Check], None]] = {
    "env": check_env, "pcie": check_pcie, "tiers": check_tiers, "warm": check_warm,
    "preflight": check_preflight}


def run_checks(ctx: Context) -> list[Check]:
    """Every chosen check, in order; each one's failure is its own."""
    done: list[Check] = []
    for name in ctx.args.checks:
        check = Check(name)
        print(f"== {name}", flush=True)
        began = time.monotonic()
        try:
            RUNNERS[name](ctx, check)
        except CheckFailed as exc:
            check.status, check.reason = "FAIL", str(exc)
        except Exception as exc:  # unexpected: still one line (--debug: the traceback)
            check.status, check.reason = "FAIL", one_line(exc)
            if ctx.args.debug:
                traceback.print_exc()
        finally:
            ctx.kill_children()
            ctx.stores.clear()
            if ctx.cuda:
                import torch

                torch.cuda.empty_cache()
        check.seconds = time.monotonic() - began
        print(f"{check.status} {name} ({check.seconds:.1f} s): {check.reason}", flush=True)
        done.append(check)
    return done


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    me = Path(__file__).name
    if args.device == "cuda":
        reason = no_cuda_reason()
        if reason is not None:
            print(f"{me}: {reason}; nothing checked (--device cpu checks the CPU path)",
                  file=sys.stderr)
            if args.json:
                args.json.write_text(json.dumps({"device": "cuda", "exit": 2,
                                                 "reason": reason}))
            return 2
    import torch

    base = Path(tempfile.mkdtemp(prefix="hafo-gpucheck-"))
    need = int(max(3 * args.mib, 9 * args.peer_mib) * MIB * 1.25)
    shm = ram_dir(base, need)
    cuda = args.device == "cuda"
    ctx = Context(args=args, cuda=cuda, base=base, shm=shm,
                  gpus=gpu_list() if cuda else [])
    if cuda:
        torch.cuda.set_device(0)
    print(f"{me}: --device {args.device}, {args.mib:g} MiB, checks {', '.join(args.checks)};"
          f" temp {base}", flush=True)
    checks: list[Check] = []
    try:
        checks = run_checks(ctx)
    finally:
        ctx.kill_children()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base / "ram", ignore_errors=True)
    failed = [c for c in checks if c.status == "FAIL"]
    total = time.monotonic() - began
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
    print(f"\nsummary ({args.device}, {total:.0f} s): "
          + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    for c in checks:
        print(f"  {c.status:4s} {c.name:9s} {c.reason}")
    if args.json:
        args.json.write_text(json.dumps({
            "device": args.device, "mib": args.mib, "peer_mib": args.peer_mib,
            "passed": not failed, "seconds": total,
            "checks": {c.name: asdict(c) for c in checks}}, indent=1, default=str))
    if failed:
        print(f"logs and records kept in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


def child_main(kind: str, raw: str) -> int:
    """A child process of a check (``--child KIND SPEC``)."""
    spec = json.loads(raw)
    if kind == "tier-peer":
        return tier_peer_child(spec)
    if kind == "warm":
        return warm_child(spec)
    print(f"unknown child {kind!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == CHILD_FLAG:
        sys.exit(child_main(sys.argv[2], sys.argv[3]))
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"{Path(__file__).name}: interrupted", file=sys.stderr)
        sys.exit(130)

"""What the checkpoint benchmark measures: one realistic state dict, and every way a user
could save and load it (raw bytes, torch.save/load, safetensors, torch.distributed.checkpoint,
hafo's Checkpointer), each as a plain callable on its own directory.

Every save is durable when it returns (fsync'd), like hafo's. Loads are timed by the caller
after evicting the method's files from the page cache (``cold_cache.evict``).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hafo.checkpoint import Checkpointer

# DCP warns on every call without a process group, even when told no_dist=True
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

COLS = 1024
LAYERS = 12
#: share of the state per tensor kind (a transformer-like block: qkv, out, mlp up, mlp down)
PARTS = (("attn.qkv.weight", 3, torch.bfloat16), ("attn.out.weight", 1, torch.float32),
         ("mlp.up.weight", 4, torch.bfloat16), ("mlp.down.weight", 4, torch.float32))
EDGES = (("embed.weight", 4, torch.bfloat16), ("head.weight", 4, torch.float32))

SAVES = ("raw_write", "torch_save", "st_save", "dcp_save", "hafo_save")
ASYNCS = ("dcp_async", "dcp_async_bg", "hafo_async", "hafo_async_bg", "memcpy")
#: seconds of a forward and backward pass in the background-snapshot loop: the host waits
#: meanwhile, as while a GPU computes (``--compute-s``)
COMPUTE_S = 0.5
LOADS = ("raw_read", "torch_load", "torch_load_mmap", "torch_load_into", "st_load", "dcp_load",
         "hafo_load", "hafo_load_into")
LABELS = {
    "raw_write": "raw write + fsync (one file)",
    "torch_save": "torch.save + fsync",
    "st_save": "safetensors save_file + fsync",
    "dcp_save": "DCP save (1 process)",
    "hafo_save": "hafo save",
    "dcp_async": "DCP async_save",
    "dcp_async_bg": "DCP async_save, async staging",
    "hafo_async": "hafo save_async",
    "hafo_async_bg": "hafo save_async, background snapshot",
    "memcpy": "memcpy into kept buffers",
    "raw_read": "raw read (one file)",
    "torch_load": "torch.load",
    "torch_load_mmap": "torch.load(mmap=True) + touch",
    "torch_load_into": "torch.load(mmap=True) + copy into state",
    "st_load": "safetensors load_file + touch",
    "dcp_load": "DCP load (in place)",
    "hafo_load": "hafo load_latest (verified)",
    "hafo_load_into": "hafo load_into (verified, in place)",
}


def layout(mib: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """64 tensors (bfloat16 and float32 matrices, float32 norms, a 0-d int64 step) whose
    sizes add up to about ``mib`` MiB: names, shapes and dtypes, always the same for a size."""
    weights = [w for _n, w, _d in PARTS] * LAYERS + [w for _n, w, _d in EDGES]
    small = (LAYERS + 1) * COLS * 4 + 8
    unit = max(0, mib * 2**20 - small) / sum(weights)
    out: list[tuple[str, tuple[int, ...], torch.dtype]] = []

    def matrix(name: str, weight: int, dtype: torch.dtype) -> None:
        row = COLS * torch.empty((), dtype=dtype).element_size()
        out.append((name, (max(1, int(unit * weight) // row), COLS), dtype))

    matrix("embed.weight", EDGES[0][1], EDGES[0][2])
    for layer in range(LAYERS):
        for name, weight, dtype in PARTS:
            matrix(f"layers.{layer}.{name}", weight, dtype)
        out.append((f"layers.{layer}.norm.weight", (COLS,), torch.float32))
    out.append(("norm.weight", (COLS,), torch.float32))
    matrix("head.weight", EDGES[1][1], EDGES[1][2])
    out.append(("step", (), torch.int64))
    return out


def preload() -> None:
    """Import what the methods use, so that no timing includes an import."""
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401


def make_state(mib: int, random: bool = True) -> dict[str, torch.Tensor]:
    """The benchmark's state dict: random values (``random``), or a cheap constant fill
    (for memory measurements, where only the layout matters)."""
    generator = torch.Generator().manual_seed(mib)
    state: dict[str, torch.Tensor] = {}
    for name, shape, dtype in layout(mib):
        if dtype == torch.int64:
            state[name] = torch.tensor(1000 + mib, dtype=dtype)
        elif random:
            state[name] = torch.randn(shape, dtype=dtype, generator=generator)
        else:
            state[name] = torch.full(shape, 0.5, dtype=dtype)
    return state


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of tensor data in ``state``."""
    return sum(t.numel() * t.element_size() for t in state.values())


def tensor_memory(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, as a flat byte view (no copy; any dtype)."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]


def touch(tensor: torch.Tensor) -> int:
    """Read one byte per page of ``tensor`` (makes a lazily mapped tensor resident)."""
    if tensor.numel() == 0:
        return 0
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    return int(flat[::4096].sum())


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < view.nbytes:
        done += os.write(fd, view[done:done + (1 << 30)])


@dataclass
class Methods:
    """Every save and load on one directory per method. ``state`` is what saves write and
    what in-place loads (DCP load, hafo load_into) read into."""

    root: Path
    state: dict[str, torch.Tensor]
    step: int = 0
    compute_s: float = COMPUTE_S
    copied: float | None = None  # the last background snapshot's copy, seconds
    dcp_stager: Any = None  # DCP's background stager, kept across saves as a loop would

    def __post_init__(self) -> None:
        for name in ("raw", "torch", "st", "dcp", "hafo"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.ck = Checkpointer(self.root / "hafo", keep_last=2, epoch=1, handle_signal=False)

    # Every save writes a new file, as hafo and DCP do (a file per checkpoint): on a thinly
    # provisioned virtual disk, writing over a file's old blocks is several times faster than
    # writing new ones, so a baseline that overwrote one file would be measured on other terms.
    def _new(self, kind: str, suffix: str) -> Path:
        return self.root / kind / f"state-{time.time_ns():020d}{suffix}"

    def _latest(self, kind: str, suffix: str) -> Path:
        files = sorted((self.root / kind).glob(f"state-*{suffix}"))
        return files[-1] if files else self.root / kind / f"state-none{suffix}"

    @property
    def raw_path(self) -> Path:
        """The newest raw file (what raw_read reads)."""
        return self._latest("raw", ".bin")

    @property
    def torch_path(self) -> Path:
        """The newest torch.save file."""
        return self._latest("torch", ".pt")

    @property
    def st_path(self) -> Path:
        """The newest safetensors file."""
        return self._latest("st", ".safetensors")
        self.ck = Checkpointer(self.root / "hafo", keep_last=2, epoch=1, handle_signal=False)

    # -- files each method reads, for eviction -------------------------------------------
    def files_of(self, op: str) -> Path:
        """The file or directory that ``op`` reads or writes."""
        if op.startswith("raw"):
            return self.raw_path
        if op.startswith("torch"):
            return self.torch_path
        if op.startswith("st"):
            return self.st_path
        if op.startswith("dcp"):
            return self.root / "dcp"
        return self.root / "hafo"

    def clear(self, op: str) -> None:
        """Remove ``op``'s previous output (untimed, before a save) where it is replaced
        whole; hafo prunes its own old checkpoints inside ``save``, as users see it."""
        if op in ("dcp_save", "dcp_async", "dcp_async_bg"):
            shutil.rmtree(self.root / "dcp" / op, ignore_errors=True)
        elif op in ("raw_write", "torch_save", "st_save"):
            self.files_of(op).unlink(missing_ok=True)

    def settle(self) -> None:
        """Before a timed save (untimed): let hafo finish deleting what its last save
        pruned, and flush the file system (ext4 discards freed blocks at its next commit),
        so no method pays for another's deletions. Saves run back to back here; in training
        the next checkpoint is minutes away."""
        self.ck.wait()
        os.sync()

    # -- saves ---------------------------------------------------------------------------
    def save(self, op: str) -> None:
        """One durable save by ``op`` (one of SAVES)."""
        if op == "raw_write":
            fd = os.open(self._new("raw", ".bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for tensor in self.state.values():
                    _write_all(fd, tensor_memory(tensor))
                os.fsync(fd)
            finally:
                os.close(fd)
        elif op == "torch_save":
            with open(self._new("torch", ".pt"), "wb") as fh:
                torch.save(self.state, fh)
                fh.flush()
                os.fsync(fh.fileno())
        elif op == "st_save":
            from safetensors.torch import save_file

            path = self._new("st", ".safetensors")
            save_file(self.state, str(path))
            _fsync_path(path)
        elif op == "dcp_save":
            from torch.distributed.checkpoint import state_dict_saver as dcp

            dcp.save(self.state, checkpoint_id=str(self.root / "dcp" / op), no_dist=True)
        elif op == "hafo_save":
            self.step += 1
            self.ck.save(self.state, step=self.step)
        else:
            raise ValueError(f"unknown save {op!r}")

    def save_async(self, op: str) -> tuple[float, float]:
        """One asynchronous save by ``op`` (one of ASYNCS): (stall, until durable) in
        seconds. The stall ends when the call returns and the state may be changed again."""
        started = time.perf_counter()
        if op == "dcp_async":
            from torch.distributed.checkpoint import state_dict_saver as dcp

            future = dcp.async_save(self.state, checkpoint_id=str(self.root / "dcp" / op),
                                    no_dist=True)
            stall = time.perf_counter() - started
            done: Any = getattr(future, "upload_completion", future)  # a response, or a Future
            done.result()
        elif op == "hafo_async":
            self.step += 1
            self.ck.save_async(self.state, step=self.step)
            stall = time.perf_counter() - started
            self.ck.wait()
        elif op == "dcp_async_bg":
            # DCP's counterpart of a background snapshot: DefaultStager with async staging
            # copies the state on a thread; the loop must not change it until staging is done
            from torch.distributed.checkpoint import state_dict_saver as dcp
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            if self.dcp_stager is None:
                self.dcp_stager = DefaultStager(StagingOptions(
                    use_pinned_memory=False, use_shared_memory=False, use_async_staging=True,
                    use_non_blocking_copy=False))
            response = dcp.async_save(self.state, checkpoint_id=str(self.root / "dcp" / op),
                                      no_dist=True, async_stager=self.dcp_stager)
            stall = time.perf_counter() - started
            assert not isinstance(response, Future), "async staging returns a response"
            staging = response.staging_completion
            stall += self._compute(started, staging.done, staging.result)
            response.upload_completion.result()
        elif op == "hafo_async_bg":
            self.step += 1
            self.ck.save_async(self.state, step=self.step, snapshot="background")
            stall = time.perf_counter() - started
            staged = self.ck._snapshot
            stall += self._compute(started, lambda: staged is None or staged.done,
                                   self.ck.wait_snapshot)
            self.ck.wait()
        elif op == "memcpy":
            # the floor of a snapshot taken before the call returns: one copy of every
            # tensor into buffers allocated (and first touched) beforehand, untimed; freed
            # after, so this process holds no more copies of the state than the methods need
            kept = [torch.empty_like(t) for t in self.state.values()]
            for buffer, tensor in zip(kept, self.state.values(), strict=True):
                buffer.copy_(tensor)
            started = time.perf_counter()
            for buffer, tensor in zip(kept, self.state.values(), strict=True):
                buffer.copy_(tensor)
            stall = time.perf_counter() - started
            del kept
        else:
            raise ValueError(f"unknown async save {op!r}")
        return stall, time.perf_counter() - started

    def _compute(self, started: float, copied: Callable[[], bool],
                 wait: Callable[[], Any]) -> float:
        """The rest of a training step after a background snapshot started at ``started``:
        forward and backward (the host idle for ``compute_s``), then the optimizer step,
        which first waits for the copy (``wait``). Returns that wait, the loop's extra
        stall; notes when the copy was done in ``copied``."""
        deadline = started + self.compute_s
        while time.perf_counter() < deadline:
            if self.copied is None and copied():
                self.copied = time.perf_counter() - started
            time.sleep(0.002)
        waited = time.perf_counter()
        wait()
        stall = time.perf_counter() - waited
        if self.copied is None:
            self.copied = time.perf_counter() - started
        return stall

    def close(self) -> None:
        """Stop DCP's stager thread, if one was started."""
        if self.dcp_stager is not None:
            self.dcp_stager.close()
            self.dcp_stager = None

    # -- loads ---------------------------------------------------------------------------
    def available(self, op: str) -> bool:
        """False for a method this hafo version lacks (``load_into``)."""
        return op != "hafo_load_into" or hasattr(self.ck, "load_into")

    def load(self, op: str) -> Any:
        """One load by ``op`` (one of LOADS); returns what it loaded (for checking)."""
        if op == "raw_read":
            size = self.raw_path.stat().st_size
            buffer = torch.empty(size, dtype=torch.uint8)
            view = memoryview(buffer.numpy()).cast("B")  # type: ignore[arg-type]
            with open(self.raw_path, "rb", buffering=0) as fh:
                done = 0
                while done < size:
                    n = fh.readinto(view[done:done + (64 << 20)])
                    if not n:
                        raise OSError(f"{self.raw_path} ended early")
                    done += n
            return buffer
        if op == "torch_load":
            return torch.load(self.torch_path, weights_only=True)
        if op == "torch_load_mmap":
            loaded = torch.load(self.torch_path, weights_only=True, mmap=True)
            for tensor in loaded.values():
                touch(tensor)
            return loaded
        if op == "torch_load_into":
            # what model.load_state_dict(torch.load(path, mmap=True)) does: map, then copy
            loaded = torch.load(self.torch_path, weights_only=True, mmap=True)
            with torch.no_grad():
                for name, tensor in self.state.items():
                    tensor.copy_(loaded[name])
            del loaded
            return self.state
        if op == "st_load":
            from safetensors.torch import load_file

            tensors = load_file(str(self.st_path))  # mmap backend: touch what it returns
            for tensor in tensors.values():
                touch(tensor)
            return tensors
        if op == "dcp_load":
            from torch.distributed.checkpoint import state_dict_loader as dcp_load

            dcp_load.load(self.state, checkpoint_id=str(self.root / "dcp" / "dcp_save"),
                          no_dist=True)
            return self.state
        if op == "hafo_load":
            restored = self.ck.load_latest()
            if restored is None:
                raise RuntimeError("hafo load_latest found no checkpoint")
            return restored.state
        if op == "hafo_load_into":
            restored = getattr(self.ck, "load_into")(self.state)  # noqa: B009 (may be absent)
            if restored is None:
                raise RuntimeError("hafo load_into found no checkpoint")
            return self.state
        raise ValueError(f"unknown load {op!r}")


IN_PLACE = ("dcp_load", "torch_load_into", "hafo_load_into")


def prepare_check(methods: Methods, op: str) -> dict[str, torch.Tensor]:
    """Before a checked in-place load: zero two tensors of the state (so a load that does
    nothing is caught) and return their saved values."""
    if op not in IN_PLACE:
        return {}
    saved = {}
    for name in (next(iter(methods.state)), "head.weight"):
        saved[name] = methods.state[name].clone()
        methods.state[name].zero_()
    return saved


def check_loaded(op: str, loaded: Any, state: dict[str, torch.Tensor],
                 zeroed: dict[str, torch.Tensor]) -> None:
    """Raise AssertionError unless ``loaded`` (what ``op`` returned) holds what was saved:
    ``state``, whose ``zeroed`` tensors an in-place load must have restored."""
    if op == "raw_read":
        assert loaded.numel() == state_bytes(state), f"{op}: {loaded.numel()} bytes"
        return
    for name, tensor in zeroed.items():
        assert torch.equal(state[name], tensor), f"{op}: {name} was not restored"
    missing = set(state) - set(loaded)
    assert not missing, f"{op}: missing {sorted(missing)[:3]}"
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), f"{op}: {name} differs"

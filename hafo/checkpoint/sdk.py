"""The checkpoint SDK used inside workloads (docs/reference/checkpoint-sdk.md, "Checkpoint SDK")."""

from __future__ import annotations

import logging
import os
import signal
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hafo.checkpoint import restore
from hafo.checkpoint.codec import flatten
from hafo.checkpoint.errors import (
    CheckpointMismatch,
    CheckpointWriteFailed,
    CorruptCheckpoint,
    write_failed,
)
from hafo.checkpoint.format import (
    empty_trash,
    list_checkpoints,
    open_checkpoint,
    prune,
    read_blobs,
    retire,
    write_checkpoint,
)
from hafo.checkpoint.staging import Staged, Stager, guard_step
from hafo.model.progress import (
    HEARTBEAT_FILE,
    PROGRESS_DIR_ENV,
    Heartbeat,
    encode_heartbeat,
    rank_file_name,
)

log = logging.getLogger("hafo.checkpoint")
#: The steps whose own time (``synced`` to ``heartbeat``) the median reported is taken over:
#: a checkpoint save every few steps, or one slow batch, does not move it.
OWN_TIME_STEPS = 16
#: The fewest steps whose own time is reported at all: the first steps of an epoch (a data
#: loader warming up, autotuning, DDP's bucket rebuild) are no straggler.
MIN_OWN_TIME_STEPS = OWN_TIME_STEPS // 2


@dataclass(frozen=True)
class Restored:
    """A checkpoint loaded back: its step, epoch, path and the state dict saved; ``tier``
    where it came from (``disk``; a ``TieredCheckpointer`` also says ``own`` for this node's
    RAM and ``peer`` for a peer's)."""

    step: int
    epoch: int
    path: str
    state: Any
    tier: str = "disk"


class Checkpointer:
    """Atomic, checksummed, epoch-fenced checkpoints in one directory.

    ``path`` defaults to ``$HAFO_CHECKPOINT_DIR``; the writer's epoch is ``$HAFO_EPOCH``.
    Restore prefers the newest epoch, then the newest step, so a stale instance's late write
    never wins over the current instance's checkpoints.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, keep_last: int = 3,
                 epoch: int | None = None, handle_signal: bool = True) -> None:
        root = path if path is not None else os.environ.get("HAFO_CHECKPOINT_DIR")
        if not root:
            raise ValueError("no checkpoint directory: pass a path or set HAFO_CHECKPOINT_DIR")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep_last = max(1, keep_last)
        self.epoch = epoch if epoch is not None else int(os.environ.get("HAFO_EPOCH", "0"))
        self._requested = threading.Event()
        self._beat_step = -1  # the highest step heartbeat() reported
        self._synced_at: float | None = None  # monotonic time of the last synced()
        self._own_times: deque[float] = deque(maxlen=OWN_TIME_STEPS)  # per step, recent
        self._lock = threading.RLock()  # one save at a time, and one place that starts them
        self._pending: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None  # deletes what save() pruned
        self._error: BaseException | None = None
        self._stager = Stager()  # save_async's staging buffers, reused while the layout holds
        self._snapshot: Staged | None = None  # the latest save_async's copy, until taken
        if handle_signal and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda _sig, _frame: self._requested.set())

    def should_checkpoint(self) -> bool:
        """True once a planned move asked for a checkpoint (SIGUSR1 from the agent)."""
        return self._requested.is_set()

    @property
    def preempted(self) -> bool:
        """Alias of ``should_checkpoint()``."""
        return self.should_checkpoint()

    def heartbeat(self, step: int, rank: int | None = None) -> None:
        """Report progress (the ``progress`` check and ``hang_timeout`` read it): call it once
        per step, best right before the step's collectives (after its own compute), so that
        in a hang the rank that never reached them shows the oldest progress. Cheap: one or
        two small atomic file writes; errors are logged, never raised. ``rank`` (default:
        ``$RANK``, else 0) names this process's file in ``$HAFO_PROGRESS_DIR``
        (``hafo.model.progress``)."""
        pid = os.getpid()
        if rank is None:
            rank = _env_rank()
        # never backwards: a background save's beat of its (older) step is no regress
        self._beat_step = step = max(int(step), self._beat_step)
        synced, self._synced_at = self._synced_at, None
        if synced is not None:
            self._own_times.append(time.monotonic() - synced)
        compute = statistics.median(self._own_times) \
            if len(self._own_times) >= MIN_OWN_TIME_STEPS else None
        beat = Heartbeat(step=step, epoch=self.epoch, t=time.time(), pid=pid, rank=rank,
                         compute=compute)
        text = encode_heartbeat(beat)
        paths = [self.root / HEARTBEAT_FILE]
        progress_dir = os.environ.get(PROGRESS_DIR_ENV)
        if progress_dir:
            paths.append(Path(progress_dir) / rank_file_name(rank))
        for path in paths:
            tmp = path.with_name(f".{path.name}.{pid}.tmp")
            try:
                tmp.write_text(text)
                os.replace(tmp, path)
            except OSError as exc:
                log.warning("heartbeat not written to %s: %s", path, exc)

    def synced(self) -> None:
        """Say that this rank's step's collectives are done: call it right after them (after
        ``optimizer.step()`` and any all-reduce of the step). The time from here to the next
        ``heartbeat`` is this rank's own work in a step (data, forward pass); the median of
        the last ``OWN_TIME_STEPS`` (once there are ``MIN_OWN_TIME_STEPS``) goes with each
        heartbeat, and hafo compares it across a
        gang's members for ``straggler_lag`` (docs/reference/workloads.md, "Hang
        detection"). Costs one clock read."""
        self._synced_at = time.monotonic()

    def load_latest(self) -> Restored | None:
        """The newest checkpoint that verifies; corrupt or partial ones are skipped. Tensors
        and arrays come back in new CPU memory of their own, read straight into it."""
        with self._lock:
            self.wait()
            for ref in list_checkpoints(self.root):
                try:
                    opened = open_checkpoint(ref)
                    dests, build = restore.fresh(opened.tree, opened.sizes)
                    read_blobs(opened, dests)
                    state = build()
                except (CorruptCheckpoint, ValueError, TypeError, KeyError) as exc:
                    log.warning("skipping corrupt checkpoint: %s: %s", ref.path, exc)
                    continue
                return Restored(step=ref.step, epoch=ref.epoch, path=str(ref.path),
                                state=state)
            return None

    def load_into(self, state: dict[str, Any]) -> Restored | None:
        """Restore the newest checkpoint that verifies into ``state`` itself: its tensors and
        arrays are read into in place (no second copy of the state; CUDA and strided tensors
        through a host buffer), other leaves (numbers, strings, bytes...) are replaced in
        their dicts and lists. Returns ``Restored(state=state)``, or None when there is no
        checkpoint. CheckpointMismatch, naming the key, when the newest checkpoint's keys,
        types, dtypes or shapes differ from ``state``'s (nothing is changed then). A
        checkpoint whose data does not verify is skipped as in ``load_latest``; if none
        verifies after one was partly read, CorruptCheckpoint (the state's tensors then hold
        partial data)."""
        with self._lock:
            self.wait()
            touched: CorruptCheckpoint | None = None
            for ref in list_checkpoints(self.root):
                try:
                    opened = open_checkpoint(ref)
                except CorruptCheckpoint as exc:
                    log.warning("skipping corrupt checkpoint: %s", exc)
                    continue
                try:
                    dests, finish = restore.into(opened.tree, opened.sizes, state)
                except CheckpointMismatch as exc:
                    partly = (f" (the state was partly overwritten by a corrupt newer "
                              f"checkpoint: {touched})" if touched else "")
                    raise CheckpointMismatch(f"checkpoint {ref.path.name} does not fit the "
                                             f"state: {exc}{partly}") from None
                except (CorruptCheckpoint, ValueError, TypeError, KeyError) as exc:
                    log.warning("skipping corrupt checkpoint: %s: %s", ref.path, exc)
                    continue
                try:
                    read_blobs(opened, dests)
                except CorruptCheckpoint as exc:
                    log.warning("skipping corrupt checkpoint: %s", exc)
                    touched = exc
                    continue
                return Restored(step=ref.step, epoch=ref.epoch, path=str(ref.path),
                                state=finish())
            if touched is not None:
                raise CorruptCheckpoint(f"no checkpoint in {self.root} verifies; the state "
                                        f"was partly overwritten by {touched}") from touched
            return None

    def save(self, state: dict[str, Any], step: int) -> str:
        """Write a checkpoint; durable on return. Returns its path. Host tensors and arrays
        are written straight from their memory; CUDA tensors go through pinned buffers
        (kept for the next save), chunk by chunk while the earlier chunks are written. A
        write the filesystem refuses (full, read-only) raises ``CheckpointWriteFailed``
        naming the step, the directory and the OS error; earlier checkpoints are kept."""
        with self._lock:
            self.wait()
            staged = self._stager.stage(state, copy_host=False)
            blobs: list[Any] = []
            sources: list[Any] = []
            tree = flatten(staged.state, blobs, sources)
            try:
                ref = write_checkpoint(self.root, self.epoch, int(step), tree, blobs,
                                       staged.ready(sources))
            except OSError as exc:  # the filesystem full, read-only, gone: say so
                raise write_failed(self.root, int(step), exc) from exc
            self.heartbeat(step)
            if retire(self.root, self.keep_last):  # old ones leave every listing now ...
                self._sweeper = threading.Thread(  # ... and are deleted beside the caller
                    target=empty_trash, args=(self.root,), name="hafo-checkpoint-prune",
                    daemon=False)  # the interpreter's exit waits for it
                self._sweeper.start()
            return str(ref.path)

    def save_async(self, state: dict[str, Any], step: int,
                   if_busy: Literal["wait", "skip"] = "wait",
                   snapshot: Literal["now", "background"] = "now") -> bool:
        """Copy ``state`` to host memory and write it in the background; True once started.

        ``snapshot="now"`` (the default): the call returns once the copy into staging
        buffers is taken, and the state may change at once. ``snapshot="background"``: the
        call returns at once and a thread copies the host tensors and arrays (the write
        starts once they are copied); the state must not change until ``wait_snapshot()``
        returns (``guard(optimizer)`` waits before each optimizer step). Staging buffers are
        reused by the next save of the same layout (one host copy of the state stays
        allocated). CUDA tensors go through pinned buffers on the current stream either way.

        One write is in flight at a time: if the previous one is still running,
        ``if_busy="wait"`` (the default) waits for it first, ``if_busy="skip"`` returns
        False at once without copying anything. An error of a background write is raised by
        the next call to ``save``, ``save_async``, ``wait``, ``load_latest`` or ``load_into``.
        """
        if if_busy not in ("wait", "skip"):
            raise ValueError(f"if_busy must be 'wait' or 'skip', not {if_busy!r}")
        if snapshot not in ("now", "background"):
            raise ValueError(f"snapshot must be 'now' or 'background', not {snapshot!r}")
        with self._lock:
            if if_busy == "skip" and self._pending is not None and self._pending.is_alive():
                return False
            self.wait()
            staged = self._stager.stage(state, copy_host=True,
                                        defer=snapshot == "background")
            blobs: list[Any] = []
            sources: list[Any] = []
            tree = flatten(staged.state, blobs, sources)
            ready = staged.ready(sources)

            def write() -> None:
                try:
                    staged.wait_host()  # the loop waits for the copy: let it run alone
                    write_checkpoint(self.root, self.epoch, int(step), tree, blobs, ready)
                    prune(self.root, self.keep_last)
                    self.heartbeat(step)
                except BaseException as exc:  # surfaced on the next call
                    if isinstance(exc, OSError):
                        exc = write_failed(self.root, int(step), exc, background=True)
                    log.error("background checkpoint write failed: %s", exc)
                    self._error = exc

            self._snapshot = staged
            staged.start()  # deferred host copies, if any
            self._pending = threading.Thread(target=write, name="hafo-checkpoint", daemon=True)
            self._pending.start()  # CUDA chunks are written as they arrive
            if snapshot == "now":
                staged.wait()  # the only part the caller waits for
            return True

    def wait_snapshot(self) -> None:
        """Block until the state given to the latest ``save_async`` has been copied, after
        which it may change. Returns at once when there is nothing to wait for. A failed
        copy is not raised here: the write then fails, and the next call to ``wait``,
        ``save``, ``save_async``, ``load_latest`` or ``load_into`` raises it."""
        staged = self._snapshot
        if staged is not None:
            staged.wait_copied()

    def guard(self, optimizer: Any) -> Any:
        """Make ``optimizer.step()`` wait for a background snapshot in progress
        (``wait_snapshot``) before it changes the parameters and its own state: the one
        line a training loop needs for ``save_async(snapshot="background")``. Returns the
        hook's handle (``.remove()`` undoes it). Needs torch >= 2.0; other changes to the
        state (e.g. BatchNorm statistics updated by a forward pass in training mode) are
        not guarded: call ``wait_snapshot()`` before them."""
        return guard_step(optimizer, self.wait_snapshot)

    def wait(self) -> None:
        """Block until the background write (if any) is committed and old checkpoints are
        deleted; re-raise the write's error."""
        with self._lock:
            if self._sweeper is not None:
                self._sweeper.join()
                self._sweeper = None
            if self._pending is not None:
                self._pending.join()
                self._pending = None
                self._snapshot = None
            if self._error is not None:
                error, self._error = self._error, None
                if isinstance(error, CheckpointWriteFailed):
                    raise error  # names the step, the directory and the OS error
                raise RuntimeError(f"previous background checkpoint failed: {error}") from error


def _env_rank() -> int:
    """``$RANK`` (torchrun's global rank), 0 when unset or not a number."""
    try:
        return max(0, int(os.environ.get("RANK", "0")))
    except ValueError:
        return 0

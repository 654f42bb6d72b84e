"""The checkpoint SDK used inside workloads (docs/contract.md, "Checkpoint SDK")."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.checkpoint.codec import Blob, flatten, stage, unflatten
from hafo.checkpoint.format import (
    CorruptCheckpoint,
    list_checkpoints,
    prune,
    read_checkpoint,
    write_checkpoint,
)
from hafo.model.progress import HEARTBEAT_FILE, Heartbeat, encode_heartbeat

log = logging.getLogger("hafo.checkpoint")


@dataclass(frozen=True)
class Restored:
    """A checkpoint loaded back: its step, epoch, path and the state dict saved."""

    step: int
    epoch: int
    path: str
    state: Any


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
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None
        if handle_signal and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda _sig, _frame: self._requested.set())

    def should_checkpoint(self) -> bool:
        """True once a planned move asked for a checkpoint (SIGUSR1 from the agent)."""
        return self._requested.is_set()

    @property
    def preempted(self) -> bool:
        """Alias of ``should_checkpoint()``."""
        return self.should_checkpoint()

    def heartbeat(self, step: int) -> None:
        """Report progress (the ``progress`` check reads it): call it every step or so. Cheap:
        one small atomic file write; errors are logged, never raised."""
        beat = Heartbeat(step=int(step), epoch=self.epoch, t=time.time(), pid=os.getpid())
        path = self.root / HEARTBEAT_FILE
        tmp = path.with_name(f".{HEARTBEAT_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(encode_heartbeat(beat))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("heartbeat not written: %s", exc)

    def load_latest(self) -> Restored | None:
        """The newest checkpoint that verifies; corrupt or partial ones are skipped."""
        self.wait()
        for ref in list_checkpoints(self.root):
            try:
                tree, blobs = read_checkpoint(ref)
            except CorruptCheckpoint as exc:
                log.warning("skipping corrupt checkpoint: %s", exc)
                continue
            return Restored(step=ref.step, epoch=ref.epoch, path=str(ref.path),
                            state=unflatten(tree, blobs))
        return None

    def save(self, state: dict[str, Any], step: int) -> str:
        """Write a checkpoint; durable on return. Returns its path."""
        self.wait()
        blobs: list[Blob] = []
        tree = flatten(state, blobs)
        ref = write_checkpoint(self.root, self.epoch, int(step), tree, blobs)
        prune(self.root, self.keep_last)
        self.heartbeat(step)
        return str(ref.path)

    def save_async(self, state: dict[str, Any], step: int) -> None:
        """Copy ``state`` to host memory now and write it in the background.

        One write is in flight at a time; an error of a background write is raised by the
        next call to ``save``, ``save_async``, ``wait`` or ``load_latest``.
        """
        self.wait()
        staged = stage(state)  # the only part the caller waits for

        def write() -> None:
            try:
                blobs: list[Blob] = []
                tree = flatten(staged, blobs)
                write_checkpoint(self.root, self.epoch, int(step), tree, blobs)
                prune(self.root, self.keep_last)
                self.heartbeat(step)
            except BaseException as exc:  # surfaced on the next call
                log.error("background checkpoint write failed: %s", exc)
                self._error = exc

        self._pending = threading.Thread(target=write, name="hafo-checkpoint", daemon=True)
        self._pending.start()

    def wait(self) -> None:
        """Block until the background write (if any) is committed; re-raise its error."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"previous background checkpoint failed: {error}") from error

"""Sharded checkpoints of a gang: every member writes its own shard, in parallel, and the
checkpoint counts only once one commit record says every shard is durable.

    <root>/gang-e<epoch, 12 digits>-s<step, 12 digits>/
        rank-<r, 5 digits>-of-<world size, 5 digits>/ckpt-e...-s.../   one single-instance
                                                   checkpoint (format.py) per member
        COMMIT.json                                written last, by rank 0

Commit rule: rank 0 writes ``COMMIT.json`` (tmp file, fsync, rename, fsync of the directory)
only after it has seen every rank's shard of its own epoch and step renamed into place; the
record holds the epoch, the step, the world size and the SHA-256 of every shard's
``manifest.json`` (which itself checksums the shard's tree and every blob), and a SHA-256 of
the record. Every member's ``save`` returns only once the record exists, so a step that
``save`` returned on any member is committed. A gang directory without a valid record is
partial and never loaded.

Corrupt shards: every member checks, for the newest committed checkpoint, the record and the
manifest digest of every shard (cheap: one small file per member); a checkpoint that fails
this check is skipped by every member alike (they read the same files). A member whose own
shard's data then does not verify raises ``CorruptCheckpoint`` naming the checkpoint instead
of loading an older one alone (the gang would diverge); it first leaves a ``BAD-rank-*``
marker in the checkpoint's directory, so on the gang's next start every member skips it.

World size: a checkpoint is loaded only by a gang of the world size that wrote it
(``ShardedCheckpointMismatch`` otherwise); resharding is not done here (PyTorch DCP's planner
does that).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from hafo.checkpoint.blobio import Ready
from hafo.checkpoint.codec import Blob, flatten, unflatten
from hafo.checkpoint.format import (
    CheckpointRef,
    CorruptCheckpoint,
    dir_name,
    fsync_dir,
    list_checkpoints,
    read_checkpoint,
    scan_refs,
    write_checkpoint,
)
from hafo.checkpoint.sdk import Checkpointer, Restored
from hafo.checkpoint.staging import Staged, Stager, guard_step

log = logging.getLogger("hafo.checkpoint")

COMMIT_FORMAT = "hafo-gang/1"
COMMIT = "COMMIT.json"
MANIFEST = "manifest.json"  # the single-instance format's manifest (format.py)
BAD_PREFIX = "BAD-rank-"
GANG_RE = re.compile(r"^gang-e(\d+)-s(\d+)$")


class ShardedCheckpointMismatch(Exception):
    """A committed checkpoint written by a gang of another world size."""


class ShardedCommitTimeout(TimeoutError):
    """The checkpoint did not commit within ``commit_timeout`` (a member did not write its
    shard, or rank 0 did not write the commit record)."""


class StaleEpoch(Exception):
    """A newer epoch of the gang exists: this (superseded) member's checkpoint is not
    committed."""


def gang_dir_name(epoch: int, step: int) -> str:
    """The directory name of a gang checkpoint (sorts by epoch, then step)."""
    return f"gang-e{epoch:012d}-s{step:012d}"


def shard_dir_name(rank: int, world_size: int) -> str:
    """The directory, inside a gang checkpoint, of one member's shard."""
    return f"rank-{rank:05d}-of-{world_size:05d}"


def _gang_dirs(root: Path) -> list[CheckpointRef]:
    """Every gang checkpoint directory, committed or not, newest first."""
    return scan_refs(root, GANG_RE)


def list_sharded_checkpoints(root: Path) -> list[CheckpointRef]:
    """Committed gang checkpoints (a ``COMMIT.json`` is in place), newest first; the path is
    the gang checkpoint's directory. Does not verify the shards."""
    return [ref for ref in _gang_dirs(root) if (ref.path / COMMIT).is_file()]


def list_all_checkpoints(root: Path) -> list[CheckpointRef]:
    """Committed single-instance and gang checkpoints in ``root``, newest first (what an
    agent reports as a workload's newest checkpoint, whichever SDK class wrote it)."""
    refs = list_checkpoints(root) + list_sharded_checkpoints(root)
    refs.sort(key=lambda r: (r.epoch, r.step), reverse=True)
    return refs


def _record_digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_commit(gang: Path) -> dict[str, Any]:
    """The commit record of a gang checkpoint, verified; CorruptCheckpoint if it is missing,
    unreadable or does not match its own checksum."""
    try:
        record = json.loads((gang / COMMIT).read_text())
        body = {k: v for k, v in record.items() if k != "sha256"}
        if record.get("format") != COMMIT_FORMAT:
            raise CorruptCheckpoint(f"{gang.name}: unknown commit format "
                                    f"{record.get('format')!r}")
        if _record_digest(body) != record.get("sha256"):
            raise CorruptCheckpoint(f"{gang.name}: commit record checksum mismatch")
        shards = record["shards"]
        if len(shards) != int(record["world_size"]) or [
                int(s["rank"]) for s in shards] != list(range(len(shards))):
            raise CorruptCheckpoint(f"{gang.name}: commit record lists the wrong shards")
        return dict(record)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpoint(f"{gang.name}: commit record: {exc}") from exc


def _manifest_digest(shard: Path) -> str:
    """SHA-256 of a shard's manifest (which checksums the shard's tree and every blob)."""
    return hashlib.sha256((shard / MANIFEST).read_bytes()).hexdigest()


class ShardedCheckpointer:
    """Sharded, atomic, checksummed, epoch-fenced checkpoints of a gang on a shared path.

    Each member saves its own part of the state (``save``); the checkpoint commits once every
    member's shard is durable. ``path`` defaults to ``$HAFO_CHECKPOINT_DIR``, ``rank`` and
    ``world_size`` to torchrun's ``$RANK`` and ``$WORLD_SIZE``, ``epoch`` to ``$HAFO_EPOCH``.
    With ``barrier`` (a callable every member calls, e.g. ``torch.distributed.barrier`` of a
    group of its own), members meet with it instead of polling the shared path. See the
    module's docstring for the layout and the rules.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, rank: int | None = None,
                 world_size: int | None = None, epoch: int | None = None, keep_last: int = 3,
                 commit_timeout: float = 600.0, handle_signal: bool = True,
                 barrier: Callable[[], object] | None = None,
                 poll_interval: float = 0.05) -> None:
        # The single-instance Checkpointer gives the root, the epoch, the SIGUSR1 flag and the
        # heartbeat; its own save/load are not used.
        self._single = Checkpointer(path, keep_last=keep_last, epoch=epoch,
                                    handle_signal=handle_signal)
        self.root = self._single.root
        self.epoch = self._single.epoch
        self.rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
        self.world_size = (world_size if world_size is not None
                           else int(os.environ.get("WORLD_SIZE", "1")))
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a gang of {self.world_size}")
        self.keep_last = max(1, keep_last)
        self.commit_timeout = commit_timeout
        self.barrier = barrier
        self.poll_interval = poll_interval
        self._last_step: int | None = None
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stager = Stager()  # save_async's staging buffers, reused while the layout holds
        self._snapshot: Staged | None = None

    # -- shared with Checkpointer ----------------------------------------------------------

    def should_checkpoint(self) -> bool:
        """True once a planned move asked for a checkpoint (SIGUSR1 from the agent)."""
        return self._single.should_checkpoint()

    @property
    def preempted(self) -> bool:
        """Alias of ``should_checkpoint()``."""
        return self._single.should_checkpoint()

    def heartbeat(self, step: int) -> None:
        """Report progress (see ``Checkpointer.heartbeat``), as this member's rank."""
        self._single.heartbeat(step, rank=self.rank)

    def synced(self) -> None:
        """This rank's step's collectives are done (see ``Checkpointer.synced``)."""
        self._single.synced()

    # -- paths -----------------------------------------------------------------------------

    def gang_path(self, step: int, epoch: int | None = None) -> Path:
        """The directory of the gang checkpoint of ``step`` (of this member's epoch)."""
        return self.root / gang_dir_name(self.epoch if epoch is None else epoch, step)

    def _shard_root(self, gang: Path, rank: int, world_size: int) -> Path:
        return gang / shard_dir_name(rank, world_size)

    # -- save ------------------------------------------------------------------------------

    def save(self, state: dict[str, Any], step: int) -> str:
        """Write this member's shard and return once the gang checkpoint is committed (every
        member's shard durable, the commit record in place). Returns the checkpoint's
        directory. ``step`` must grow from one save to the next within an epoch."""
        self.wait()
        step = self._claim(step)
        blobs: list[Blob] = []
        tree = flatten(state, blobs)
        return self._write_and_commit(step, tree, blobs)

    def save_async(self, state: dict[str, Any], step: int,
                   snapshot: Literal["now", "background"] = "now") -> None:
        """Copy ``state`` to host memory (into staging buffers reused by the next save of
        the same layout); write the shard and wait for the commit in the background. With
        ``snapshot="background"`` the call returns before the copy is taken, as in
        ``Checkpointer.save_async``: the state must not change until ``wait_snapshot()``
        (or a ``guard``-ed optimizer step). One save is in flight at a time (a second call
        waits for the first); its error is raised by the next ``save``, ``save_async``,
        ``wait`` or ``load_latest``."""
        if snapshot not in ("now", "background"):
            raise ValueError(f"snapshot must be 'now' or 'background', not {snapshot!r}")
        self.wait()
        step = self._claim(step)
        staged = self._stager.stage(state, copy_host=True, defer=snapshot == "background")
        blobs: list[Blob] = []
        sources: list[Any] = []
        tree = flatten(staged.state, blobs, sources)
        ready = staged.ready(sources)

        def write() -> None:
            try:
                staged.wait_host()  # the loop waits for the copy: let it run alone
                self._write_and_commit(step, tree, blobs, ready)
            except BaseException as exc:  # surfaced on the next call
                log.error("background sharded checkpoint failed: %s", exc)
                self._error = exc

        self._snapshot = staged
        staged.start()
        self._pending = threading.Thread(target=write, name="hafo-sharded-checkpoint",
                                         daemon=True)
        self._pending.start()
        if snapshot == "now":
            staged.wait()

    def wait_snapshot(self) -> None:
        """Block until the state given to the latest ``save_async`` has been copied (see
        ``Checkpointer.wait_snapshot``)."""
        staged = self._snapshot
        if staged is not None:
            staged.wait_copied()

    def guard(self, optimizer: Any) -> Any:
        """Make ``optimizer.step()`` wait for a background snapshot in progress (see
        ``Checkpointer.guard``); returns the hook's handle."""
        return guard_step(optimizer, self.wait_snapshot)

    def wait(self) -> None:
        """Block until the background save (if any) is committed; re-raise its error."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
            self._snapshot = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"previous background checkpoint failed: {error}") from error

    def _claim(self, step: int) -> int:
        step = int(step)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} was not after the last saved step "
                             f"{self._last_step}: within an epoch each save needs a larger step")
        if (self.gang_path(step) / COMMIT).exists():
            raise ValueError(f"{gang_dir_name(self.epoch, step)} is already committed: within "
                             f"an epoch each save needs a new step")
        self._last_step = step
        return step

    def _write_and_commit(self, step: int, tree: Any, blobs: list[Blob],
                          ready: Ready | None = None) -> str:
        gang = self.gang_path(step)
        gang.mkdir(parents=True, exist_ok=True)
        write_checkpoint(self._shard_root(gang, self.rank, self.world_size), self.epoch,
                         step, tree, blobs, ready)
        fsync_dir(gang)  # the shard's directory entry is durable too
        if self.barrier is not None:
            self.barrier()  # every shard is written
        if self.rank == 0:
            self._commit(gang, step)
            prune_sharded(self.root, self.keep_last)
        if self.barrier is not None:
            self.barrier()  # the commit record is written
        if self.rank != 0:
            self._await_commit(gang, step)
        self.heartbeat(step)
        return str(gang)

    def _deadline_poll(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` (backing off up to ``poll_interval``) until it is true; give up at
        ``commit_timeout``, or as soon as a newer epoch of the gang shows up (checked every
        second: a superseded member waits for nothing)."""
        start = time.monotonic()
        deadline = start + self.commit_timeout
        next_fence = start + 1.0
        interval = min(0.005, self.poll_interval)
        while not ready():
            now = time.monotonic()
            if now >= next_fence:
                self._check_fence(what)
                next_fence = now + 1.0
            if now >= deadline:
                raise ShardedCommitTimeout(f"{what}: not done after {self.commit_timeout:g}s")
            time.sleep(interval)
            interval = min(interval * 2, self.poll_interval)

    def _check_fence(self, what: str) -> None:
        """StaleEpoch if a gang checkpoint of a newer epoch exists."""
        newest = _gang_dirs(self.root)
        if newest and newest[0].epoch > self.epoch:
            raise StaleEpoch(f"{what}: epoch {newest[0].epoch} of this gang exists, so "
                             f"epoch {self.epoch} does not commit")

    def _commit(self, gang: Path, step: int) -> None:
        """Rank 0: wait for every shard, then write the commit record."""
        digests: dict[int, str] = {}

        def all_shards() -> bool:
            for rank in range(self.world_size):
                if rank in digests:
                    continue
                # committed by its rename to this name, which holds the epoch and the step
                shard = self._shard_root(gang, rank, self.world_size) / dir_name(
                    self.epoch, step)
                try:
                    digests[rank] = _manifest_digest(shard)
                except OSError:
                    return False
            return True

        self._deadline_poll(f"{gang.name}: waiting for every shard "
                            f"({self.world_size} members)", all_shards)
        self._check_fence(gang.name)
        fsync_dir(gang)
        fsync_dir(self.root)
        body = {"format": COMMIT_FORMAT, "epoch": self.epoch, "step": step,
                "world_size": self.world_size, "created": time.time(),
                "shards": [{"rank": rank,
                            "path": f"{shard_dir_name(rank, self.world_size)}/"
                                    f"{dir_name(self.epoch, step)}",
                            "manifest_sha256": digests[rank]}
                           for rank in range(self.world_size)]}
        record = {**body, "sha256": _record_digest(body)}
        tmp = gang / f".{COMMIT}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(json.dumps(record, indent=1).encode())
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, gang / COMMIT)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(gang)

    def _await_commit(self, gang: Path, step: int) -> None:
        """Other ranks: wait until rank 0's commit record covers this member's shard."""
        mine = self._shard_root(gang, self.rank, self.world_size) / dir_name(
            self.epoch, step)
        digest = _manifest_digest(mine)

        def committed() -> bool:
            if not (gang / COMMIT).is_file():
                return False
            record = read_commit(gang)
            shard = record["shards"][self.rank] if self.rank < len(record["shards"]) else {}
            if shard.get("manifest_sha256") != digest:
                raise CorruptCheckpoint(f"{gang.name}: the commit record does not hold this "
                                        f"member's shard (rank {self.rank})")
            return True

        self._deadline_poll(f"{gang.name}: waiting for rank 0's commit record", committed)

    # -- load ------------------------------------------------------------------------------

    def load_latest(self) -> Restored | None:
        """This member's shard of the newest committed checkpoint (newest epoch, then step)
        whose commit record and shard manifests verify; every member of the gang picks the
        same one. ``ShardedCheckpointMismatch`` if it was written by a gang of another world
        size; ``CorruptCheckpoint`` (naming it) if this member's own shard's data does not
        verify."""
        self.wait()
        for ref in list_sharded_checkpoints(self.root):
            name = ref.path.name
            try:
                record = read_commit(ref.path)
            except CorruptCheckpoint as exc:
                log.warning("skipping checkpoint: %s", exc)
                continue
            if int(record["epoch"]) != ref.epoch or int(record["step"]) != ref.step:
                log.warning("skipping checkpoint %s: its commit record is of epoch %s step "
                            "%s", name, record["epoch"], record["step"])
                continue
            bad = sorted(p.name for p in ref.path.glob(f"{BAD_PREFIX}*"))
            if bad:
                log.warning("skipping checkpoint %s: marked bad (%s)", name, ", ".join(bad))
                continue
            if int(record["world_size"]) != self.world_size:
                raise ShardedCheckpointMismatch(
                    f"checkpoint {name} has {record['world_size']} shards, this gang has "
                    f"{self.world_size} members: resharding is not done (PyTorch DCP's "
                    f"planner does it); restore with {record['world_size']} members")
            problem = self._shards_problem(ref.path, record)
            if problem is not None:
                log.warning("skipping checkpoint %s: %s", name, problem)
                continue
            shard = ref.path / record["shards"][self.rank]["path"]
            try:
                tree, blobs = read_checkpoint(CheckpointRef(ref.epoch, ref.step, shard))
            except CorruptCheckpoint as exc:
                self._mark_bad(ref.path, str(exc))
                raise CorruptCheckpoint(
                    f"checkpoint {name}: the shard of rank {self.rank} does not verify "
                    f"({exc}); marked it bad, so the gang's next start skips it") from exc
            parts: list[Blob] = list(blobs)
            return Restored(step=ref.step, epoch=ref.epoch, path=str(ref.path),
                            state=unflatten(tree, parts))
        return None

    def _shards_problem(self, gang: Path, record: dict[str, Any]) -> str | None:
        """Why a committed checkpoint's shards do not match its record (None: they do)."""
        for shard in record["shards"]:
            path = gang / shard["path"]
            try:
                digest = _manifest_digest(path)
            except OSError as exc:
                return f"shard of rank {shard['rank']}: {exc}"
            if digest != shard["manifest_sha256"]:
                return f"shard of rank {shard['rank']}: manifest does not match the record"
        return None

    def _mark_bad(self, gang: Path, reason: str) -> None:
        marker = gang / f"{BAD_PREFIX}{self.rank:05d}.json"
        try:
            marker.write_text(json.dumps({"rank": self.rank, "epoch": self.epoch,
                                          "reason": reason, "t": time.time()}))
        except OSError as exc:
            log.error("could not mark %s bad: %s", gang, exc)


def prune_sharded(root: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` committed gang checkpoints that are not marked bad;
    remove older ones, and partial (uncommitted) or bad ones older than the newest kept."""
    kept: list[CheckpointRef] = []
    for ref in _gang_dirs(root):
        committed = (ref.path / COMMIT).is_file()
        bad = committed and any(ref.path.glob(f"{BAD_PREFIX}*"))
        if committed and not bad and len(kept) < keep_last:
            kept.append(ref)
            continue
        if not kept:
            continue  # newer than every good committed checkpoint: maybe still being written
        shutil.rmtree(ref.path, ignore_errors=True)

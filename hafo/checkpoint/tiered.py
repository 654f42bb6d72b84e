"""Checkpoints of a gang in three tiers (docs/reference/checkpoint-sdk.md, "Tiered
checkpoints"): every step's snapshot in this node's RAM (``own``) and in a peer member's
node's RAM (``peer``), and every ``durable_every`` steps a sharded checkpoint on the shared
path (``disk``, ``sharded.py``).

Restore, at the start of an epoch: every member publishes, in the gang's shared directory
(``<checkpoint dir>/memory/e<epoch>/rank-<r>.json``), where its server listens and which
snapshots of earlier epochs its node holds. Once all have, each reads the same records and
picks the same step (``choose_memory_step``): the newest (epoch, step) of which every rank's
snapshot is held somewhere, if it is at least as new as the newest committed disk checkpoint;
else the disk. A member then reads its own snapshot from its node's RAM, or fetches it from a
peer that holds it (``peer_link``); every chunk's CRC-32C is checked. A snapshot that does not
verify anywhere is marked bad (``memory/BAD-e<epoch>-s<step>-rank-<r>.json``), the member
raises ``CorruptCheckpoint``, and the gang's next start skips that step.

Fencing: only snapshots of epochs before the member's own are candidates; a peer server takes
copies only from members of its own epoch, so a zombie of an older epoch cannot place one;
a snapshot counts only once it is committed by its rename.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hafo.checkpoint.codec import Blob, flatten, unflatten
from hafo.checkpoint.errors import CorruptCheckpoint
from hafo.checkpoint.format import CheckpointRef, read_checkpoint, write_checkpoint
from hafo.checkpoint.memory_store import (
    ADDRESS_ENV,
    MEMORY_DIR_ENV,
    OWN,
    PEER,
    Held,
    MemoryStore,
)
from hafo.checkpoint.peer_link import Endpoint, PeerError, PeerServer, get_snapshot, put_snapshot
from hafo.checkpoint.sdk import Restored
from hafo.checkpoint.sharded import ShardedCheckpointer, list_sharded_checkpoints
from hafo.checkpoint.staging import SnapshotFailed, Staged, Stager, guard_step
from hafo.model.progress import PROGRESS_DIR_ENV, restore_file_name

log = logging.getLogger("hafo.checkpoint")

MEMORY = "memory"
RECORD_FORMAT = "hafo-tiers/1"
EPOCH_DIR_RE = re.compile(r"^e(\d{12})$")
BAD_RE = re.compile(r"^BAD-e(\d+)-s(\d+)-rank-(\d+)\.json$")


@dataclass(frozen=True)
class RankRecord:
    """What one member published at its start: where its server is, what its node holds."""

    rank: int
    node: str
    endpoint: Endpoint
    held: tuple[Held, ...]

    def to_json(self) -> dict[str, Any]:
        """The record's file."""
        return {"format": RECORD_FORMAT, "rank": self.rank, "node": self.node,
                "host": self.endpoint.host, "port": self.endpoint.port,
                "token": self.endpoint.token, "held": [h.to_json() for h in self.held]}

    @classmethod
    def from_json(cls, raw: Any) -> RankRecord:
        """Parse a record; ValueError if it is not one."""
        if not isinstance(raw, dict) or raw.get("format") != RECORD_FORMAT:
            raise ValueError("not a tier record")
        return cls(int(raw["rank"]), str(raw["node"]),
                   Endpoint(str(raw["host"]), int(raw["port"]), str(raw["token"])),
                   tuple(Held.from_json(h) for h in raw["held"]))


@dataclass(frozen=True)
class RestoreReport:
    """How a member restored: from which tier, which step, how long each phase took."""

    tier: str  # "own", "peer", "disk" or "none"
    epoch: int | None
    step: int | None
    waited: float  # for every member's record
    loaded: float  # fetching and reading the snapshot
    source: str | None = None  # the node a peer copy came from


@dataclass
class TierStats:
    """Counters of the memory tiers, for the workload's own metrics and logs."""

    snapshots: int = 0
    peer_copies: int = 0
    peer_failures: int = 0
    memory_failures: int = 0
    last_snapshot_seconds: float = 0.0
    last_error: str | None = field(default=None)


def choose_memory_step(records: Iterable[RankRecord], world_size: int, epoch: int,
                       bad: set[tuple[int, int]]) -> tuple[int, int] | None:
    """The newest (epoch, step) of an earlier epoch than ``epoch`` of which every rank's
    snapshot is held by some member's node, not marked bad; None if there is none."""
    covered: dict[tuple[int, int], set[int]] = {}
    for record in records:
        for held in record.held:
            if held.epoch < epoch and 0 <= held.rank < world_size:
                covered.setdefault((held.epoch, held.step), set()).add(held.rank)
    whole = [key for key, ranks in covered.items()
             if len(ranks) == world_size and key not in bad]
    return max(whole) if whole else None


def epoch_dir_name(epoch: int) -> str:
    """The directory of one epoch's restore records."""
    return f"e{epoch:012d}"


def _write_json(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


class TieredCheckpointer:
    """A gang member's checkpoints in node RAM, peer RAM and on disk (see the module).

    ``snapshot(state, step)`` once per step (cheap: a copy into reused host buffers, written
    in the background); ``load_latest()`` once at the start. ``path``, ``rank``,
    ``world_size`` and ``epoch`` default as for ``ShardedCheckpointer``; ``memory_dir`` to
    ``$HAFO_MEMORY_DIR`` (set by the agent; else ``/dev/shm/hafo/<workload>``), ``address``
    (where this member's server listens) to ``$HAFO_NODE_ADDRESS`` (else 127.0.0.1),
    ``local_world_size`` (ranks per node) to ``$LOCAL_WORLD_SIZE`` (else 1). The peer of
    rank r is rank r + local_world_size (mod world size): a rank on the next node.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, rank: int | None = None,
                 world_size: int | None = None, epoch: int | None = None, *,
                 durable_every: int = 50, memory_dir: str | os.PathLike[str] | None = None,
                 address: str | None = None, local_world_size: int | None = None,
                 keep_last: int = 3, restore_timeout: float = 120.0,
                 commit_timeout: float = 600.0, handle_signal: bool = True) -> None:
        if durable_every < 0:
            raise ValueError(f"durable_every must be 0 (never) or more, not {durable_every}")
        self._disk = ShardedCheckpointer(path, rank, world_size, epoch, keep_last=keep_last,
                                         commit_timeout=commit_timeout,
                                         handle_signal=handle_signal)
        self.root, self.epoch = self._disk.root, self._disk.epoch
        self.rank, self.world_size = self._disk.rank, self._disk.world_size
        self.durable_every = durable_every
        self.restore_timeout = restore_timeout
        workload = os.environ.get("HAFO_WORKLOAD", "default")
        memory = memory_dir or os.environ.get(MEMORY_DIR_ENV) or f"/dev/shm/hafo/{workload}"
        self.store = MemoryStore(Path(memory), self._disk.world_size)
        local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        self.local_world_size = max(1, local)
        self.peer_rank = ((self.rank + self.local_world_size) % self.world_size
                          if self.world_size > self.local_world_size else None)
        self.node = os.environ.get("HAFO_NODE", "")
        self.server = PeerServer(self.store, self.epoch,
                                 address or os.environ.get(ADDRESS_ENV) or "127.0.0.1")
        self.stats = TierStats()
        self.last_restore: RestoreReport | None = None
        self._stager = Stager()
        self._job: threading.Thread | None = None
        self._staged: Staged | None = None
        self._last_step: int | None = None
        self._peer: Endpoint | None = None
        self._records_dir = self.root / MEMORY / epoch_dir_name(self.epoch)
        self._records_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # the state is the workload's: others keep out
            self.store.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.store.drop_other_worlds()
        held = tuple(h for h in self.store.held() if h.epoch < self.epoch)
        self._record = RankRecord(self.rank, self.node, self.server.endpoint, held)
        _write_json(self._records_dir / f"rank-{self.rank:05d}.json", self._record.to_json())
        if self.rank == 0:
            self._prune_records()

    # -- shared with the other checkpointers ----------------------------------------------

    def should_checkpoint(self) -> bool:
        """True once a planned move asked for a checkpoint (SIGUSR1 from the agent)."""
        return self._disk.should_checkpoint()

    @property
    def preempted(self) -> bool:
        """Alias of ``should_checkpoint()``."""
        return self._disk.should_checkpoint()

    def heartbeat(self, step: int) -> None:
        """Report progress (see ``Checkpointer.heartbeat``), after waiting for the previous
        snapshot to be in this node's RAM and sent to the peer: called right before a step's
        collectives, it makes a failure cost at most one step (no rank completes step s + 1
        before every rank's snapshot of step s is in both RAM tiers)."""
        self._wait_job()
        self._disk.heartbeat(step)

    def synced(self) -> None:
        """The step's collectives are done (see ``Checkpointer.synced``)."""
        self._disk.synced()

    # -- save ------------------------------------------------------------------------------

    def snapshot(self, state: dict[str, Any], step: int,
                 copy: Literal["now", "background"] = "now") -> None:
        """Take this step's snapshot: copied into host buffers (reused from one step to the
        next), then written to this node's RAM and sent to the peer's in the background (the
        previous snapshot's work is waited for first). ``copy="now"``: the copy is taken
        before this returns. ``copy="background"``: this returns at once and a thread copies;
        the state must not change until ``wait_snapshot()`` returns (``guard(optimizer)``
        makes every ``optimizer.step()`` wait for it, so the next step's forward and backward
        passes run while it copies). Every ``durable_every`` steps,
        also a sharded checkpoint on disk (``ShardedCheckpointer.save_async``: every member
        must call with the same steps). Memory-tier failures (RAM full, the peer gone) are
        logged and counted in ``stats``, never raised: the disk tier still holds."""
        step = int(step)
        if copy not in ("now", "background"):
            raise ValueError(f"copy must be 'now' or 'background', not {copy!r}")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} was not after the last snapshot's step "
                             f"{self._last_step}")
        self._last_step = step
        self._wait_job()
        if self.durable_every and step % self.durable_every == 0:
            self._disk.save_async(state, step)
        started = time.monotonic()
        staged = self._stager.stage(state, copy_host=True, defer=copy == "background")
        blobs: list[Blob] = []
        sources: list[Any] = []
        tree = flatten(staged.state, blobs, sources)
        ready = staged.ready(sources)
        staged.start()
        if copy == "now":
            staged.wait()
        self._staged = staged

        def work() -> None:
            try:
                staged.wait_host()  # a background copy: done before it is written
                ref = write_checkpoint(self.store.rank_root(OWN, self.rank), self.epoch, step,
                                       tree, blobs, ready,
                                       recycle=self.store.recyclable(OWN, self.rank))
                self.store.keep_newest(OWN, self.rank)
                self.stats.snapshots += 1
            except (OSError, SnapshotFailed) as exc:
                self.stats.memory_failures += 1
                self.stats.last_error = f"RAM tier: {exc}"
                log.warning("snapshot of step %s not kept in RAM: %s", step, exc)
                return
            finally:
                self.stats.last_snapshot_seconds = time.monotonic() - started
            self._send(ref)

        self._job = threading.Thread(target=work, name="hafo-snapshot", daemon=True)
        self._job.start()

    def wait_snapshot(self) -> None:
        """Block until the state given to the latest ``snapshot`` has been copied."""
        staged = self._staged
        if staged is not None:
            staged.wait_copied()

    def guard(self, optimizer: Any) -> Any:
        """Make ``optimizer.step()`` wait for a background copy in progress (see
        ``Checkpointer.guard``); returns the hook's handle."""
        return guard_step(optimizer, self.wait_snapshot)

    def save(self, state: dict[str, Any], step: int) -> str:
        """A durable checkpoint now (a planned stop): ``ShardedCheckpointer.save``."""
        self._wait_job()
        self._last_step = max(int(step), self._last_step or 0)
        return self._disk.save(state, step)

    def wait(self) -> None:
        """Block until the snapshot and the disk checkpoint in flight are done; re-raise the
        disk checkpoint's error."""
        self._wait_job()
        self._disk.wait()

    def close(self) -> None:
        """Wait for the work in flight and stop this member's server."""
        self.wait()
        self.server.close()

    def _wait_job(self) -> None:
        if self._job is not None:
            self._job.join()
            self._job = None

    def _send(self, ref: CheckpointRef) -> None:
        if self.peer_rank is None:
            return
        endpoint = self._peer or self._peer_endpoint()
        if endpoint is None:
            self.stats.peer_failures += 1
            return
        try:
            put_snapshot(endpoint, self.rank, ref.epoch, ref.step, ref.path)
            self.stats.peer_copies += 1
        except PeerError as exc:
            self._peer = None  # read its record again next time
            self.stats.peer_failures += 1
            self.stats.last_error = f"peer copy: {exc}"
            log.warning("snapshot of step %s not copied to rank %s: %s", ref.step,
                        self.peer_rank, exc)

    def _peer_endpoint(self) -> Endpoint | None:
        record = self._read_record(self._records_dir / f"rank-{self.peer_rank:05d}.json")
        self._peer = record.endpoint if record is not None else None
        return self._peer

    # -- restore ---------------------------------------------------------------------------

    def load_latest(self) -> Restored | None:
        """The newest state among the tiers (see the module); ``Restored.tier`` says which:
        ``own`` (this node's RAM), ``peer`` (fetched from a peer's RAM) or ``disk``. Waits
        up to ``restore_timeout`` for every member's record (``TimeoutError`` after)."""
        started = time.monotonic()
        records = self._gather()
        waited = time.monotonic() - started
        chosen = choose_memory_step(records, self.world_size, self.epoch, self._bad())
        disk = next(iter(list_sharded_checkpoints(self.root)), None)
        restored: Restored | None
        if chosen is not None and (disk is None or chosen >= (disk.epoch, disk.step)):
            restored, source = self._load_memory(records, *chosen)
            report = RestoreReport(restored.tier, restored.epoch, restored.step, waited,
                                   time.monotonic() - started - waited, source)
        else:
            found = self._disk.load_latest()
            restored = (Restored(found.step, found.epoch, found.path, found.state, "disk")
                        if found is not None else None)
            report = RestoreReport("disk" if found else "none",
                                   found.epoch if found else None,
                                   found.step if found else None, waited,
                                   time.monotonic() - started - waited)
        self.last_restore = report
        with contextlib.suppress(OSError):
            _write_json(self._records_dir / f"restored-rank-{self.rank:05d}.json",
                        {"rank": self.rank, "node": self.node, "tier": report.tier,
                         "epoch": report.epoch, "step": report.step,
                         "waited": round(report.waited, 4), "loaded": round(report.loaded, 4),
                         "source": report.source})
        self._report_progress(report)
        log.info("restored: %s", report)
        if restored is not None:
            self._last_step = restored.step if restored.epoch == self.epoch else None
        return restored

    def _report_progress(self, report: RestoreReport) -> None:
        """Tell the agent how this rank restored (``$HAFO_PROGRESS_DIR/restore-<rank>.json``:
        ``hafo show`` says it per member)."""
        directory = os.environ.get(PROGRESS_DIR_ENV)
        if not directory:
            return
        with contextlib.suppress(OSError):
            _write_json(Path(directory) / restore_file_name(self.rank), {
                "rank": self.rank, "tier": report.tier, "epoch": report.epoch,
                "step": report.step, "seconds": round(report.waited + report.loaded, 4)})

    def _gather(self) -> list[RankRecord]:
        deadline = time.monotonic() + self.restore_timeout
        paths = [self._records_dir / f"rank-{rank:05d}.json" for rank in range(self.world_size)]
        while True:
            if all(path.is_file() for path in paths):
                break
            if time.monotonic() >= deadline:
                missing = [p.name for p in paths if not p.is_file()]
                raise TimeoutError(f"restore: no record from {', '.join(missing)} after "
                                   f"{self.restore_timeout:g}s in {self._records_dir}")
            time.sleep(0.01)
        records = [self._read_record(path) for path in paths]
        return [r for r in records if r is not None]

    @staticmethod
    def _read_record(path: Path) -> RankRecord | None:
        try:
            return RankRecord.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("tier record %s ignored: %s", path, exc)
            return None

    def _bad(self) -> set[tuple[int, int]]:
        bad: set[tuple[int, int]] = set()
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.root / MEMORY):
                match = BAD_RE.match(entry)
                if match:
                    bad.add((int(match.group(1)), int(match.group(2))))
        return bad

    def _load_memory(self, records: list[RankRecord], epoch: int,
                     step: int) -> tuple[Restored, str | None]:
        """This rank's snapshot of (epoch, step): from this node's RAM, else from a peer that
        holds it; CorruptCheckpoint (after marking it bad) if no copy verifies."""
        problems: list[str] = []
        local = self.store.find(self.rank, epoch, step)
        if local is not None:
            try:
                return self._read(local, OWN), None
            except CorruptCheckpoint as exc:
                problems.append(str(exc))
                shutil.rmtree(local.path, ignore_errors=True)
        for record in records:
            if record.endpoint == self.server.endpoint:
                continue
            if not any((h.rank, h.epoch, h.step) == (self.rank, epoch, step)
                       for h in record.held):
                continue
            try:
                path = get_snapshot(record.endpoint, self.store, OWN, self.rank, epoch, step)
                return self._read(CheckpointRef(epoch, step, path), PEER), record.node
            except (PeerError, CorruptCheckpoint) as exc:
                problems.append(f"from rank {record.rank} ({record.node}): {exc}")
                shutil.rmtree(self.store.path(OWN, self.rank, epoch, step),
                              ignore_errors=True)
        marker = self.root / MEMORY / f"BAD-e{epoch}-s{step}-rank-{self.rank}.json"
        with contextlib.suppress(OSError):
            _write_json(marker, {"rank": self.rank, "epoch": self.epoch,
                                 "problems": problems[:8], "t": time.time()})
        raise CorruptCheckpoint(f"snapshot of epoch {epoch} step {step}, rank {self.rank}: "
                                f"no copy verifies ({'; '.join(problems) or 'none held'}); "
                                f"marked it bad, so the gang's next start skips it")

    def _read(self, ref: CheckpointRef, tier: str) -> Restored:
        tree, blobs = read_checkpoint(ref)
        parts: list[Blob] = list(blobs)
        return Restored(step=ref.step, epoch=ref.epoch, path=str(ref.path),
                        state=unflatten(tree, parts), tier=tier)

    def _prune_records(self) -> None:
        """Rank 0: the records of earlier epochs are no longer read."""
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.root / MEMORY):
                match = EPOCH_DIR_RE.match(entry)
                if match and int(match.group(1)) < self.epoch:
                    shutil.rmtree(self.root / MEMORY / entry, ignore_errors=True)

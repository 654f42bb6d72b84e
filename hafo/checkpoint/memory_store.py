"""A node's RAM tier of a gang's checkpoints: snapshots in shared memory (``/dev/shm`` on a
real node: it outlives the process, not the machine), one directory per workload given by
the agent as ``$HAFO_MEMORY_DIR``.

    <memory dir>/own/rank-<r>-of-<w>/ckpt-e<epoch>-s<step>/    this node's rank r's snapshots
    <memory dir>/peer/rank-<r>-of-<w>/ckpt-e<epoch>-s<step>/   copies of rank r's, from its node

(``w``: the gang's world size; a gang resized to another size never reads them, and drops
them at its start.)

Each snapshot is a checkpoint in the single-instance format (``format.py``: a manifest with
the tree and a CRC-32C per chunk of every blob, committed by a rename), so a torn or flipped
copy never loads. Each place keeps the newest two snapshots of each rank (``KEEP``); older
ones are removed once a new one is in place, so the memory held is at most three snapshots
per place and rank while one is being written, and two otherwise.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hafo.checkpoint.format import DATA, MANIFEST, NAME_RE, CheckpointRef, dir_name, scan_refs

MEMORY_DIR_ENV = "HAFO_MEMORY_DIR"
#: Where this member's node is reached by its peers (set by the agent).
ADDRESS_ENV = "HAFO_NODE_ADDRESS"
OWN = "own"
PEER = "peer"
PLACES = (OWN, PEER)
RANK_DIR_RE = re.compile(r"^rank-(\d{5})-of-(\d{5})$")
#: The files of one snapshot, in the order they are sent to a peer.
FILES = (MANIFEST, DATA)
#: Snapshots kept per rank and place: the newest two, so that when a node is lost between
#: its own write of step s and its copy to the peer, step s - 1 is still held everywhere.
KEEP = 2
#: A temp dir this old is a dead writer's.
STALE_TEMP_SECONDS = 60.0


def rank_dir_name(rank: int, world_size: int) -> str:
    """The directory of one rank's snapshots in a place."""
    return f"rank-{rank:05d}-of-{world_size:05d}"


@dataclass(frozen=True)
class Held:
    """One snapshot this node holds: whose (rank), of which epoch and step, and where."""

    rank: int
    epoch: int
    step: int
    place: str  # OWN or PEER

    def to_json(self) -> dict[str, object]:
        """As published in the gang's restore records."""
        return {"rank": self.rank, "epoch": self.epoch, "step": self.step,
                "place": self.place}

    @classmethod
    def from_json(cls, raw: object) -> Held:
        """Parse a published record; ValueError if it is not one."""
        if not isinstance(raw, dict):
            raise ValueError(f"not a snapshot record: {raw!r}")
        place = str(raw["place"])
        if place not in PLACES:
            raise ValueError(f"unknown place {place!r}")
        held = cls(int(raw["rank"]), int(raw["epoch"]), int(raw["step"]), place)
        if held.rank < 0 or held.epoch < 0 or held.step < 0:
            raise ValueError(f"negative number in {raw!r}")
        return held


class MemoryStore:
    """The RAM tier of one workload on this node, for a gang of ``world_size`` members (see
    the module's docstring)."""

    def __init__(self, root: Path, world_size: int = 1) -> None:
        self.root = root
        self.world_size = world_size

    def rank_root(self, place: str, rank: int) -> Path:
        """Where ``rank``'s snapshots in ``place`` are."""
        return self.root / place / rank_dir_name(rank, self.world_size)

    def drop_other_worlds(self) -> None:
        """Remove the snapshots of gangs of another world size (of this workload before a
        resize): they are never read again."""
        for place in PLACES:
            with contextlib.suppress(OSError):
                for entry in os.listdir(self.root / place):
                    match = RANK_DIR_RE.match(entry)
                    if match and int(match.group(2)) != self.world_size:
                        shutil.rmtree(self.root / place / entry, ignore_errors=True)

    def path(self, place: str, rank: int, epoch: int, step: int) -> Path:
        """The directory of one snapshot."""
        return self.rank_root(place, rank) / dir_name(epoch, step)

    def newest(self, place: str, rank: int) -> CheckpointRef | None:
        """``rank``'s newest committed snapshot in ``place``, if any."""
        refs = scan_refs(self.rank_root(place, rank), NAME_RE)
        return refs[0] if refs else None

    def held(self) -> list[Held]:
        """Every committed snapshot on this node, newest first per place and rank."""
        found: list[Held] = []
        for place in PLACES:
            base = self.root / place
            try:
                entries = sorted(os.listdir(base))
            except OSError:
                continue
            for entry in entries:
                match = RANK_DIR_RE.match(entry)
                if match is None or int(match.group(2)) != self.world_size:
                    continue
                rank = int(match.group(1))
                found.extend(Held(rank, ref.epoch, ref.step, place)
                             for ref in scan_refs(base / entry, NAME_RE))
        return found

    def find(self, rank: int, epoch: int, step: int) -> CheckpointRef | None:
        """This node's copy of ``rank``'s snapshot of ``epoch`` and ``step`` (own first)."""
        for place in PLACES:
            path = self.path(place, rank, epoch, step)
            if (path / MANIFEST).is_file():
                return CheckpointRef(epoch, step, path)
        return None

    def recyclable(self, place: str, rank: int) -> CheckpointRef | None:
        """The snapshot the next one of ``rank`` in ``place`` is written over: the oldest,
        once ``KEEP`` are held (so that ``KEEP - 1`` stay while it is written)."""
        refs = scan_refs(self.rank_root(place, rank), NAME_RE)
        return refs[-1] if len(refs) >= KEEP else None

    def keep_newest(self, place: str, rank: int, keep: int = KEEP) -> None:
        """Remove every snapshot of ``rank`` in ``place`` but the newest ``keep``, and temp
        dirs older
        than ``STALE_TEMP_SECONDS`` (a writer or receiver that died before its rename)."""
        base = self.rank_root(place, rank)
        for ref in scan_refs(base, NAME_RE)[keep:]:
            shutil.rmtree(ref.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            for entry in os.listdir(base):
                if entry.startswith((".tmp-", ".recv-")):
                    tmp = base / entry
                    with contextlib.suppress(OSError):
                        if time.time() - tmp.stat().st_mtime > STALE_TEMP_SECONDS:
                            shutil.rmtree(tmp, ignore_errors=True)

    def bytes_held(self) -> int:
        """The bytes of every file under this store (what its RAM costs the node)."""
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_size
        return total

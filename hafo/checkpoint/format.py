"""On-disk checkpoint format: one directory per checkpoint, committed by an atomic rename.

    <root>/ckpt-e<epoch>-s<step>/manifest.json   tree of the state; offset, size, checksum
                                                 algorithm and chunk checksums of every blob;
                                                 the writer's epoch
    <root>/ckpt-e<epoch>-s<step>/data.bin        bytes, arrays and tensors, raw, each at an
                                                 offset aligned to 64 bytes

Tensors and arrays are written as their raw bytes straight from host memory (like
safetensors: no pickling, one file, one fsync) by a few threads at known offsets
(``blobio``). A checkpoint is written into ``<root>/.tmp-*``, the files and the directory are
fsynced, then the directory is renamed into place and the root fsynced: a reader sees all of
it or nothing. The manifest's own tree is guarded by sha256; data by a CRC-32C per 8 MiB chunk
of every blob (corruption, not tampering, is the threat: hardware CRC-32C runs at over
10 GB/s, so verification costs little). ``hafo-ckpt/3`` checkpoints (blobs back to back, one
zlib CRC-32 per blob) are still read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.checkpoint.blobio import BlobMeta, Ready, read_data, write_data
from hafo.checkpoint.errors import CorruptCheckpoint

FORMAT = "hafo-ckpt/4"
FORMAT_V3 = "hafo-ckpt/3"
DATA = "data.bin"
MANIFEST = "manifest.json"
NAME_RE = re.compile(r"^ckpt-e(\d+)-s(\d+)$")

__all__ = ["FORMAT", "CheckpointRef", "CorruptCheckpoint", "Opened", "empty_trash",
           "list_checkpoints", "open_checkpoint", "prune", "read_blobs", "read_checkpoint",
           "retire", "write_checkpoint"]


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint directory."""

    epoch: int
    step: int
    path: Path


@dataclass(frozen=True)
class Opened:
    """A checkpoint whose manifest verified: its tree and where each blob lies."""

    ref: CheckpointRef
    format: str
    tree: Any
    blobs: tuple[BlobMeta, ...]

    @property
    def sizes(self) -> list[int]:
        """Each blob's size in bytes."""
        return [meta.size for meta in self.blobs]


def dir_name(epoch: int, step: int) -> str:
    """The directory name of a checkpoint (sorts by epoch, then step)."""
    return f"ckpt-e{epoch:012d}-s{step:012d}"


def scan_refs(root: Path, pattern: re.Pattern[str]) -> list[CheckpointRef]:
    """The directories in ``root`` whose names match ``pattern`` (epoch and step as its two
    groups), newest (highest epoch, then step) first."""
    refs: list[CheckpointRef] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = pattern.match(entry.name)
        if match and entry.is_dir():
            refs.append(CheckpointRef(int(match.group(1)), int(match.group(2)), entry))
    refs.sort(key=lambda r: (r.epoch, r.step), reverse=True)
    return refs


def list_checkpoints(root: Path) -> list[CheckpointRef]:
    """Committed checkpoints, newest (highest epoch, then step) first."""
    return scan_refs(root, NAME_RE)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_small(path: Path, data: bytes) -> None:
    with open(path, "wb", buffering=0) as fh:
        fh.write(data)
        os.fsync(fh.fileno())


def write_checkpoint(root: Path, epoch: int, step: int, tree: Any, blobs: list[Any],
                     ready: Ready | None = None,
                     recycle: CheckpointRef | None = None) -> CheckpointRef:
    """Write and commit one checkpoint; durable when this returns. ``blobs`` are contiguous
    buffers (bytes, memoryviews, arrays), written from their memory; ``ready(blob, chunk)``,
    if given, is called (from a writer thread) before a chunk is read from memory.
    ``recycle``: an older checkpoint in ``root`` to write this one over (it leaves every
    listing at once, by a rename, and its data file is overwritten in place: the RAM tier's
    snapshots reuse their memory)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / dir_name(epoch, step)
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    reused = False
    if recycle is not None:
        with contextlib.suppress(OSError):  # gone already: write a new one
            os.rename(recycle.path, tmp)
            reused = True
    if not reused:
        tmp.mkdir(parents=True)
    try:
        metas = write_data(tmp / DATA, blobs, ready, keep_pages=reused)
        tree_json = json.dumps(tree)  # insertion order kept: dicts come back in order
        manifest = {"format": FORMAT, "epoch": epoch, "step": step, "created": time.time(),
                    "tree": tree_json, "tree_sha256": hashlib.sha256(tree_json.encode())
                    .hexdigest(), "blobs": [meta.to_json() for meta in metas]}
        _write_small(tmp / MANIFEST, json.dumps(manifest).encode())
        fsync_dir(tmp)
        if final.exists():  # the same step saved twice in one epoch: the newer one wins
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return CheckpointRef(epoch, step, final)


def open_checkpoint(ref: CheckpointRef) -> Opened:
    """Read and verify a checkpoint's manifest (not its data yet: see ``read_blobs``);
    CorruptCheckpoint if it does not verify or ``data.bin`` has not the size it says."""
    try:
        manifest = json.loads((ref.path / MANIFEST).read_text())
        version = manifest.get("format")
        if version not in (FORMAT, FORMAT_V3):
            raise CorruptCheckpoint(f"{ref.path}: unknown format {version!r}")
        tree_json = manifest["tree"]
        if hashlib.sha256(tree_json.encode()).hexdigest() != manifest["tree_sha256"]:
            raise CorruptCheckpoint(f"{ref.path}: tree checksum mismatch")
        parse = BlobMeta.from_json if version == FORMAT else BlobMeta.from_v3
        metas = tuple(parse(raw) for raw in manifest["blobs"])
        expected = max((meta.offset + meta.size for meta in metas), default=0)
        actual = (ref.path / DATA).stat().st_size
        if actual != expected:
            raise CorruptCheckpoint(f"{ref.path}: {DATA} has {actual} bytes, expected "
                                    f"{expected}")
        return Opened(ref, version, json.loads(tree_json), metas)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpoint(f"{ref.path}: {exc}") from exc


def read_blobs(opened: Opened, dests: list[memoryview]) -> None:
    """Read every blob of ``opened`` into ``dests`` (writable byte views of each blob's size,
    e.g. the memory of the tensors to restore) and verify its checksums."""
    try:
        read_data(opened.ref.path / DATA, opened.blobs, dests)
    except CorruptCheckpoint as exc:
        raise CorruptCheckpoint(f"{opened.ref.path}: {exc}") from exc
    except OSError as exc:
        raise CorruptCheckpoint(f"{opened.ref.path}: {exc}") from exc


def _buffer(size: int) -> memoryview:
    """Uninitialized writable memory where NumPy is present (no time spent zeroing it)."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy optional
        return memoryview(bytearray(size))
    buffer: Any = numpy.empty(size, dtype=numpy.uint8)
    return memoryview(buffer)


def read_checkpoint(ref: CheckpointRef) -> tuple[Any, list[memoryview]]:
    """Read and verify one checkpoint: its tree and its blobs (views into one buffer);
    CorruptCheckpoint if anything does not match."""
    opened = open_checkpoint(ref)
    data = _buffer(max((meta.offset + meta.size for meta in opened.blobs), default=0))
    blobs = [data[meta.offset:meta.offset + meta.size] for meta in opened.blobs]
    read_blobs(opened, blobs)
    return opened.tree, blobs


TRASH_PREFIX = ".trash-"


def retire(root: Path, keep_last: int) -> bool:
    """Take all but the newest ``keep_last`` checkpoints out of every listing at once, each by
    one rename into a hidden ``.trash-*`` directory; ``empty_trash`` deletes them. True when
    there is trash to delete."""
    for ref in list_checkpoints(root)[keep_last:]:
        with contextlib.suppress(OSError):  # another instance retired it first
            ref.path.rename(root / f"{TRASH_PREFIX}{ref.path.name}-{uuid.uuid4().hex[:8]}")
    return any(root.glob(f"{TRASH_PREFIX}*"))


def empty_trash(root: Path) -> None:
    """Delete retired checkpoints (also those a crash left half deleted) and temp dirs older
    than an hour (a writer that died before its rename)."""
    for entry in root.glob(f"{TRASH_PREFIX}*"):
        shutil.rmtree(entry, ignore_errors=True)
    for entry in root.glob(".tmp-*"):
        try:
            if time.time() - entry.stat().st_mtime > 3600:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints, and stale temp dirs."""
    retire(root, keep_last)
    empty_trash(root)

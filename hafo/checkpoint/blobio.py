"""The data file of a checkpoint (``data.bin``): blobs at known offsets, written from and read
into their owners' memory by a few threads, with a checksum per chunk of every blob.

Each blob starts at a multiple of ``ALIGN`` bytes. Every blob is cut into ``CHUNK``-byte chunks
(the last one shorter), and each chunk has its own CRC-32C (hardware CRC through the
``crc32c`` package, which releases the GIL): the work is split into extents of about
``EXTENT`` bytes (several small blobs share an extent), and ``WORKERS`` threads each take the
next extent, checksum its chunks and ``pwritev`` it at its offset into the file (or
``preadv`` it, then checksum). No byte is copied on the way except by the kernel.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from hafo.checkpoint.errors import CorruptCheckpoint

CHUNK = 8 << 20  # bytes per checksum
ALIGN = 64  # every blob starts at a multiple of this (aligned views for any dtype)
EXTENT = 8 << 20  # bytes per pwritev/preadv call, about
MAX_IOV = 256  # buffers per call (Linux allows 1024)
MAX_GAP = 4096  # alignment padding up to this is written/read in the same call
WORKERS = 4

def _sync_file_range() -> Callable[[int, int, int], None] | None:
    """Linux's sync_file_range(SYNC_FILE_RANGE_WRITE): start writing a range to disk now,
    without waiting (the final fsync then has less left to do); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int

    def start_writeback(fd: int, offset: int, size: int) -> None:
        function(fd, offset, size, 2)  # SYNC_FILE_RANGE_WRITE; errors: fsync reports them

    return start_writeback


START_WRITEBACK = _sync_file_range()

Checksum = Callable[..., int]
CHECKSUMS: dict[str, Checksum] = {"crc32c": crc32c.crc32c, "crc32": zlib.crc32}
WRITE_CHECKSUM = "crc32c"

Ready = Callable[[int, int], None]
"""``ready(blob, chunk)`` returns once that chunk's memory holds the data to write (e.g. a
device-to-host copy finished); called from the writer threads."""

_Piece = tuple[int, memoryview, int, int]  # file offset, memory, blob index, chunk index
_Extent = tuple[int, list[memoryview], list[_Piece]]  # file offset, buffers, their pieces


@dataclass(frozen=True)
class BlobMeta:
    """Where one blob lies in the data file and the checksum of each of its chunks."""

    offset: int
    size: int
    checksum: str  # a key of CHECKSUMS
    chunk: int
    crcs: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """The manifest's record of this blob."""
        return {"offset": self.offset, "size": self.size, "checksum": self.checksum,
                "chunk": self.chunk, "crcs": list(self.crcs)}

    @classmethod
    def from_json(cls, raw: Any) -> BlobMeta:
        """A ``hafo-ckpt/4`` manifest record; ValueError if it is not well formed."""
        meta = cls(int(raw["offset"]), int(raw["size"]), str(raw["checksum"]),
                   int(raw["chunk"]), tuple(int(c) for c in raw["crcs"]))
        if meta.checksum not in CHECKSUMS:
            raise ValueError(f"unknown checksum {meta.checksum!r}")
        if meta.offset < 0 or meta.size < 0 or meta.chunk <= 0:
            raise ValueError(f"bad blob record {raw!r}")
        if len(meta.crcs) != chunks(meta.size, meta.chunk):
            raise ValueError(f"blob record has {len(meta.crcs)} checksums for "
                             f"{chunks(meta.size, meta.chunk)} chunks")
        return meta

    @classmethod
    def from_v3(cls, raw: Any) -> BlobMeta:
        """A ``hafo-ckpt/3`` record: one zlib CRC-32 of the whole blob."""
        size = int(raw["size"])
        return cls(int(raw["offset"]), size, "crc32", max(size, 1),
                   (int(raw["crc32"]),) if size else ())


def chunks(size: int, chunk: int) -> int:
    """How many checksummed chunks of ``chunk`` bytes a blob of ``size`` bytes has."""
    return -(-size // chunk)


def as_bytes(blob: Any) -> memoryview:
    """A flat byte view of a contiguous buffer (bytes, memoryview, array, ctypes array)."""
    view = memoryview(blob)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B")


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each blob's offset (aligned) and the file's size."""
    offsets, end = [], 0
    for size in sizes:
        end = -(-end // ALIGN) * ALIGN
        offsets.append(end)
        end += size
    return offsets, end


def _pieces(views: Sequence[memoryview], offsets: Sequence[int],
            chunk_sizes: Sequence[int]) -> list[_Piece]:
    pieces = []
    for blob, (view, offset, chunk) in enumerate(zip(views, offsets, chunk_sizes, strict=True)):
        for index in range(chunks(view.nbytes, chunk)):
            start = index * chunk
            pieces.append((offset + start, view[start:start + chunk], blob, index))
    pieces.sort(key=lambda piece: piece[0])
    return pieces


def _extents(pieces: list[_Piece], filler: memoryview) -> list[_Extent]:
    """Group pieces lying back to back (small padding gaps filled with ``filler``)."""
    extents: list[_Extent] = []
    end = size = 0
    for piece in pieces:
        offset, view = piece[0], piece[1]
        gap = offset - end
        if (extents and 0 <= gap <= MAX_GAP and size + gap + view.nbytes <= EXTENT
                and len(extents[-1][1]) < MAX_IOV - 1):
            buffers = extents[-1][1]
            if gap:
                buffers.append(filler[:gap])
            buffers.append(view)
            extents[-1][2].append(piece)
            size += gap + view.nbytes
        else:
            extents.append((offset, [view], [piece]))
            size = view.nbytes
        end = offset + view.nbytes
    return extents


def _advance(buffers: list[memoryview], done: int) -> list[memoryview]:
    index = 0
    while index < len(buffers) and done >= buffers[index].nbytes:
        done -= buffers[index].nbytes
        index += 1
    rest = buffers[index:]
    if rest and done:
        rest[0] = rest[0][done:]
    return rest


def _pwritev_all(fd: int, buffers: list[memoryview], offset: int) -> None:
    while buffers:
        done = os.pwritev(fd, buffers, offset)
        offset += done
        buffers = _advance(buffers, done)


def _preadv_all(fd: int, buffers: list[memoryview], offset: int) -> None:
    while buffers:
        done = os.preadv(fd, buffers, offset)
        if not done:
            raise CorruptCheckpoint("the data file ended early")
        offset += done
        buffers = _advance(buffers, done)


def _run(extents: list[_Extent], work: Callable[[_Extent], None]) -> None:
    """``work`` on every extent, in file order, by up to WORKERS threads; the first error is
    raised once every thread stopped (they stop taking extents after an error)."""
    if len(extents) <= 1 or WORKERS <= 1:
        for extent in extents:
            work(extent)
        return
    lock = threading.Lock()
    position = [0]
    errors: list[BaseException] = []

    def loop() -> None:
        while True:
            with lock:
                if errors or position[0] >= len(extents):
                    return
                extent = extents[position[0]]
                position[0] += 1
            try:
                work(extent)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return

    threads = [threading.Thread(target=loop, name=f"hafo-ckpt-io-{i}", daemon=True)
               for i in range(min(WORKERS, len(extents)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def write_data(path: os.PathLike[str] | str, blobs: Sequence[Any],
               ready: Ready | None = None, keep_pages: bool = False) -> list[BlobMeta]:
    """Write ``blobs`` (contiguous buffers) into a new file at ``path`` and fsync it; returns
    where each went and its chunks' CRC-32C, computed from the memory that was written.
    ``keep_pages``: the file at ``path`` may exist and is overwritten in place, cut or grown
    to the new size (in a memory filesystem its pages stay allocated: a snapshot every step
    then costs no page allocation and zeroing)."""
    views = [as_bytes(blob) for blob in blobs]
    offsets, total = layout([view.nbytes for view in views])
    chunk_size = CHUNK
    crcs = [[0] * chunks(view.nbytes, chunk_size) for view in views]
    zeros = memoryview(bytes(MAX_GAP))
    extents = _extents(_pieces(views, offsets, [chunk_size] * len(views)), zeros)
    checksum = CHECKSUMS[WRITE_CHECKSUM]

    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (0 if keep_pages else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    try:
        if total or keep_pages:
            os.ftruncate(fd, total)  # the final size first: threads write out of order

        def work(extent: _Extent) -> None:
            offset, buffers, pieces = extent
            for _offset, view, blob, chunk in pieces:
                if ready is not None:
                    ready(blob, chunk)
                crcs[blob][chunk] = checksum(view)
            _pwritev_all(fd, buffers, offset)
            if START_WRITEBACK is not None:
                START_WRITEBACK(fd, offset, sum(buffer.nbytes for buffer in buffers))

        _run(extents, work)
        os.fsync(fd)
    finally:
        os.close(fd)
    return [BlobMeta(offset, view.nbytes, WRITE_CHECKSUM, chunk_size, tuple(crc))
            for offset, view, crc in zip(offsets, views, crcs, strict=True)]


def read_data(path: os.PathLike[str] | str, metas: Sequence[BlobMeta],
              dests: Sequence[memoryview]) -> None:
    """Read every blob into its destination (a writable byte view of exactly its size) and
    verify each chunk's checksum; CorruptCheckpoint names the first blob that does not."""
    for index, (meta, dest) in enumerate(zip(metas, dests, strict=True)):
        if dest.nbytes != meta.size:
            raise ValueError(f"blob {index}: destination has {dest.nbytes} bytes, "
                             f"the blob {meta.size}")
    scratch = memoryview(bytearray(MAX_GAP))  # padding lands here
    extents = _extents(_pieces(dests, [m.offset for m in metas], [m.chunk for m in metas]),
                       scratch)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

        def work(extent: _Extent) -> None:
            offset, buffers, pieces = extent
            _preadv_all(fd, buffers, offset)
            for _offset, view, blob, chunk in pieces:
                meta = metas[blob]
                if CHECKSUMS[meta.checksum](view) != meta.crcs[chunk]:
                    raise CorruptCheckpoint(f"blob {blob} checksum mismatch (bytes "
                                            f"{chunk * meta.chunk}-"
                                            f"{chunk * meta.chunk + view.nbytes} of it)")

        _run(extents, work)
    finally:
        os.close(fd)

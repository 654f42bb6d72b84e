"""Cold page cache for read benchmarks: evict a file, or every file under a directory, from
the page cache (fsync, then ``posix_fadvise(DONTNEED)``), and optionally drop the whole
cache through ``/proc/sys/vm/drop_caches`` (root only)."""

from __future__ import annotations

import os
from pathlib import Path


def evict_file(path: Path) -> None:
    """Write back and evict one file's pages, so the next read goes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped by DONTNEED: write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(path: Path) -> int:
    """Evict ``path`` (a file, or every regular file under a directory, recursively) from
    the page cache; returns how many files were evicted."""
    if path.is_file():
        evict_file(path)
        return 1
    count = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            file = Path(directory) / name
            if file.is_file() and not file.is_symlink():
                evict_file(file)
                count += 1
    return count


def can_drop_caches() -> bool:
    """True where this process may write ``/proc/sys/vm/drop_caches`` (root, and /proc
    writable)."""
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> None:
    """Sync, then drop the page cache, dentries and inodes of the whole machine (root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")

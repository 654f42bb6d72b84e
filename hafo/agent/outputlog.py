"""Each instance's output (stdout and stderr) on disk: written by its guard with a size cap and
rotation, found and read by the agent for ``GET /v1/workloads/{id}/logs``.

Files of an instance (``hafo.model.output`` has the offset arithmetic):

    output.log        the current part
    output.log.1      the part before it (gone once more than the cap was written)
    output.log.meta   the logical offset of output.log's first byte (20 digits)

A rotation renames ``output.log`` over ``output.log.1``, creates a new ``output.log`` and
writes its base into ``output.log.meta`` while holding an exclusive ``flock`` on the meta
file; a reader takes a shared one while it reads the base and opens the parts, so the base
and the parts it opened always agree (data appended after that is simply not read yet).
When the agent forgets an instance, the three move to ``<state_dir>/logs/<id>.<epoch>.log``,
``.log.1`` and ``.log.meta``; at most ``node.logs.keep_epochs`` ended instances are kept per
workload there.

Imports stay light: the guard imports this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hafo.agent import procid
from hafo.agent.instances import INSTANCES, read_guard_state
from hafo.agent.proctree import pid_alive
from hafo.model.output import (
    MIB,
    Layout,
    OutputChunk,
    OutputRequest,
    clamp,
    keep_tail,
    must_rotate,
    newest_epochs,
    segments,
    tail_start,
    tail_text,
)

if TYPE_CHECKING:
    from hafo.model.output_view import OutputLog

OUTPUT = "output.log"
ROTATED_SUFFIX = ".1"
META_SUFFIX = ".meta"
LOGS = "logs"
DEFAULT_MAX_BYTES = 64 * MIB
CHUNK = 65536
_META_WIDTH = 20


def _read_base(fd: int) -> int:
    text = os.pread(fd, 64, 0).strip()
    return int(text) if text.isascii() and text.isdigit() else 0


class OutputWriter:
    """Appends an instance's output to ``directory/output.log``, rotating so that the parts
    together never hold more than ``max_bytes``. One writer per instance (the guard)."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.current = directory / OUTPUT
        self.rotated = directory / (OUTPUT + ROTATED_SUFFIX)
        self.max_bytes = max_bytes
        self._meta = os.open(directory / (OUTPUT + META_SUFFIX), os.O_RDWR | os.O_CREAT, 0o600)
        self.base = _read_base(self._meta)
        self._write_base(self.base)
        self._fd = self._open_current()
        self.size = os.fstat(self._fd).st_size

    def _open_current(self) -> int:
        return os.open(self.current, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                       0o600)

    def _write_base(self, base: int) -> None:
        os.pwrite(self._meta, f"{base:0{_META_WIDTH}d}\n".encode(), 0)

    @property
    def offset(self) -> int:
        """Logical offset after the last byte written."""
        return self.base + self.size

    def write(self, data: bytes) -> None:
        """Append ``data`` (at most half the cap at a time: the guard reads 64 KiB chunks)."""
        if must_rotate(self.size, len(data), self.max_bytes):
            self._rotate()
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            self.size += written
            view = view[written:]

    def _rotate(self) -> None:
        fcntl.flock(self._meta, fcntl.LOCK_EX)
        try:
            os.close(self._fd)
            os.replace(self.current, self.rotated)
            self.base += self.size
            self.size = 0
            self._fd = self._open_current()
            self._write_base(self.base)
        finally:
            fcntl.flock(self._meta, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the files."""
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._meta)


class OutputPump:
    """A thread that reads the workload's stdout and stderr pipes as fast as they fill and
    writes both to an ``OutputWriter`` (the workload never waits on the guard's supervision
    loop), keeping the last lines of stderr for ``stderr_tail``."""

    def __init__(self, writer: OutputWriter, stdout: int, stderr: int) -> None:
        self.writer = writer
        self._fds = {stdout: False, stderr: True}  # fd -> is stderr
        self._stderr = b""
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # held while writing and while the writer changes
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="output", daemon=True)

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for fd in self._fds:
            selector.register(fd, selectors.EVENT_READ)
        open_fds = len(self._fds)
        partial: dict[int, bytes] = {}  # fd -> the start of a line not yet ended
        try:
            while open_fds:
                for key, _ in selector.select():
                    fd = int(key.fd)
                    data = os.read(fd, CHUNK)
                    if not data:
                        selector.unregister(fd)
                        os.close(fd)
                        open_fds -= 1
                        data, partial[fd] = partial.get(fd, b""), b""
                        if not data:
                            continue
                    else:
                        if self._fds[fd]:
                            with self._lock:
                                self._stderr = keep_tail(self._stderr, data)
                        # whole lines only, so stdout and stderr interleave line by line
                        # (a partial line waits for its end, up to one chunk)
                        data = partial.get(fd, b"") + data
                        cut = data.rfind(b"\n") + 1
                        if cut == 0 and len(data) < CHUNK:
                            partial[fd] = data
                            continue
                        if cut:
                            data, partial[fd] = data[:cut], data[cut:]
                        else:
                            partial[fd] = b""
                    try:
                        with self._write_lock:
                            self.writer.write(data)
                    except OSError as exc:  # a full disk: keep draining, say why once
                        if self.error is None:
                            self.error = f"output not written: {exc.strerror}"
                            print(f"hafo guard: {self.error}", file=sys.stderr, flush=True)
        finally:
            selector.close()
            with self._write_lock:
                self.writer.close()

    def retarget(self, writer: OutputWriter) -> None:
        """Write from now on with ``writer`` (a warm member handed to its next instance: its
        output goes on in the new instance's directory); the old writer is closed."""
        with self._write_lock:
            old, self.writer = self.writer, writer
            old.close()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for both pipes to close (the workload and every process
        that inherited them gone); True when they did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stderr_tail(self) -> str:
        """The last lines of stderr (at most 20 lines, 4 KiB)."""
        with self._lock:
            return tail_text(self._stderr)


# -- finding and reading ------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFiles:
    """Where one instance's output parts are (found by listing the state directory)."""

    epoch: int
    current: Path
    rotated: Path
    meta: Path
    instance: Path | None  # its instance directory while the agent has not forgotten it

    def running(self) -> bool:
        """Whether its guard may still write: its instance has not exited and its guard
        lives (a guard killed with its node left a state that says otherwise)."""
        if self.instance is None:
            return False
        state = read_guard_state(self.instance)
        if state is None:
            return True  # starting
        if state.state == "exited":
            return False
        # a record of an older guard has no identity: its number, then (it reads only)
        return procid.is_alive(state.guard) if state.guard else pid_alive(state.guard_pid)


def _parse_instance(name: str) -> tuple[str, int] | None:
    workload, _, epoch = name.rpartition(".")
    if workload and epoch.isdigit():
        return workload, int(epoch)
    return None


def find_outputs(state_dir: Path, workload: str) -> dict[int, OutputFiles]:
    """Every instance of ``workload`` whose output this node keeps, by epoch: running or
    not yet forgotten ones in ``instances/``, ended ones in ``logs/``. Paths come from
    listing those two directories; nothing from ``workload`` is joined into a path."""
    found: dict[int, OutputFiles] = {}
    logs = state_dir / LOGS
    for entry in _entries(logs):
        name = entry.name
        for suffix in (".log", ".log" + ROTATED_SUFFIX, ".log" + META_SUFFIX):
            if name.endswith(suffix):
                parsed = _parse_instance(name[:-len(suffix)])
                if parsed is not None and parsed[0] == workload:
                    stem = logs / name[:-len(suffix)]
                    found[parsed[1]] = OutputFiles(
                        parsed[1], Path(f"{stem}.log"), Path(f"{stem}.log{ROTATED_SUFFIX}"),
                        Path(f"{stem}.log{META_SUFFIX}"), None)
                break
    for entry in _entries(state_dir / INSTANCES):
        parsed = _parse_instance(entry.name)
        if parsed is not None and parsed[0] == workload and entry.is_dir() \
                and not entry.is_symlink():
            found[parsed[1]] = OutputFiles(
                parsed[1], entry / OUTPUT, entry / (OUTPUT + ROTATED_SUFFIX),
                entry / (OUTPUT + META_SUFFIX), entry)
    return found


def _entries(directory: Path) -> Iterator[Path]:
    try:
        yield from directory.iterdir()
    except OSError:
        return


def _open_part(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # missing (not rotated yet, or nothing written), or a link: not ours
        return None


@dataclass
class _Opened:
    layout: Layout
    fds: tuple[int | None, int | None]  # (rotated, current)

    def close(self) -> None:
        for fd in self.fds:
            if fd is not None:
                os.close(fd)

    def read(self, lo: int, hi: int) -> bytes:
        parts: list[bytes] = []
        for part, position, length in segments(self.layout, lo, hi):
            fd = self.fds[part]
            if fd is not None:
                parts.append(os.pread(fd, length, position))
        return b"".join(parts)


def _open(files: OutputFiles) -> _Opened:
    """Open the parts of an instance's output with a base that matches them."""
    meta = _open_part(files.meta)
    try:
        if meta is not None:
            fcntl.flock(meta, fcntl.LOCK_SH)
        base = _read_base(meta) if meta is not None else 0
        rotated, current = _open_part(files.rotated), _open_part(files.current)
    finally:
        if meta is not None:
            os.close(meta)  # releases the lock
    sizes = [os.fstat(fd).st_size if fd is not None else 0 for fd in (rotated, current)]
    # a rotated part larger than its base would say bytes before offset 0: keep the newest
    return _Opened(Layout(base, min(sizes[0], base), sizes[1]), (rotated, current))


def describe(files: OutputFiles, workload: str, node: str) -> OutputLog:
    """The listing entry of one instance's output."""
    from hafo.model.output_view import OutputLog  # the schema library: not for the guard

    opened = _open(files)
    opened.close()
    layout = opened.layout
    return OutputLog(workload=workload, node=node, epoch=files.epoch, start=layout.start,
                     end=layout.end, size=layout.end - layout.start, running=files.running())


def list_outputs(state_dir: Path, node: str, workload: str) -> list[OutputLog]:
    """Every kept output of ``workload`` on this node, oldest epoch first."""
    found = find_outputs(state_dir, workload)
    return [describe(found[epoch], workload, node) for epoch in sorted(found)]


def read_output(state_dir: Path, node: str, workload: str, epoch: int,
                request: OutputRequest) -> OutputChunk | None:
    """Bytes of the output of ``workload`` at ``epoch`` (None: this node keeps none)."""
    files = find_outputs(state_dir, workload).get(epoch)
    if files is None:
        return None
    running = files.running()  # before reading: a "not running" answer then has it all
    opened = _open(files)
    try:
        layout = opened.layout
        if request.tail is not None:
            lo = max(layout.start, layout.end - request.limit)
            buf = opened.read(lo, layout.end)
            skip = tail_start(buf, request.tail, lo == layout.start)
            data, begin, dropped = buf[skip:], lo + skip, 0
        else:
            begin, dropped = clamp(layout, request.offset)
            data = opened.read(begin, min(layout.end, begin + request.limit))
    finally:
        opened.close()
    return OutputChunk(workload=workload, node=node, epoch=epoch, data=data, offset=begin,
                       next_offset=begin + len(data), dropped=dropped, start=layout.start,
                       end=layout.end, running=running)


def keep_ended(state_dir: Path, instance: Path, workload: str, epoch: int,
               keep_epochs: int) -> None:
    """Move a forgotten instance's output from its directory into ``logs/`` and delete the
    oldest ended outputs of that workload beyond ``keep_epochs`` (every part of each)."""
    logs = state_dir / LOGS
    logs.mkdir(exist_ok=True)
    stem = f"{workload}.{epoch}.log"
    for suffix in ("", ROTATED_SUFFIX, META_SUFFIX):
        with contextlib.suppress(OSError):
            os.replace(instance / (OUTPUT + suffix), logs / (stem + suffix))
    ended = [e for e, files in find_outputs(state_dir, workload).items()
             if files.instance is None or e == epoch]  # its directory goes next
    _kept, old = newest_epochs(ended, keep_epochs)
    for gone in old:
        for suffix in ("", ROTATED_SUFFIX, META_SUFFIX):
            with contextlib.suppress(OSError):
                (logs / f"{workload}.{gone}.log{suffix}").unlink()

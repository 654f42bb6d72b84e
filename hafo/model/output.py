"""A workload instance's output (stdout and stderr) as an agent keeps it: the records the agent
API returns, and the pure arithmetic of a capped, rotating log with stable offsets.

The guard writes the output into two parts: ``output.log`` (the current part) and
``output.log.1`` (the part before it), each at most half of ``node.logs.max_mib``; when the
current part is full it becomes the rotated part and the older one is dropped. Offsets are
*logical*: the byte's position in everything the instance ever wrote, so "from offset N" keeps
its meaning across rotations. With ``base`` the logical offset of the current part's first
byte, the kept bytes are ``[base - rotated, base + current)``; what lies before was dropped.

Plain dataclasses, no schema library: the guard imports this module (it starts fast). The
listing record and "which instance is current" are in ``hafo.model.output_view``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1024 * 1024
#: Most bytes one read returns (and the default).
READ_LIMIT = 1024 * 1024
#: Most lines a tail read returns.
MAX_TAIL_LINES = 100000
#: The stderr lines kept for ``stderr_tail``: at most this many lines and bytes.
TAIL_LINES = 20
TAIL_BYTES = 4096

ROTATED, CURRENT = 0, 1


@dataclass(frozen=True, slots=True)
class OutputRequest:
    """What to read: from logical ``offset`` (None: from the first kept byte), or the last
    ``tail`` lines; at most ``limit`` bytes."""

    offset: int | None = None
    tail: int | None = None
    limit: int = READ_LIMIT


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Bytes of an instance's output: ``data`` starts at logical ``offset``; read on from
    ``next_offset``. ``dropped``: bytes asked for that rotation no longer keeps. ``start`` and
    ``end`` as in ``hafo.model.output_view.OutputLog``."""

    workload: str
    node: str
    epoch: int
    data: bytes
    offset: int
    next_offset: int
    dropped: int
    start: int
    end: int
    running: bool


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the kept bytes are: ``base`` (logical offset of the current part's first byte),
    and the sizes of the rotated and current parts."""

    base: int
    rotated: int
    current: int

    @property
    def start(self) -> int:
        """Logical offset of the first kept byte."""
        return max(0, self.base - self.rotated)

    @property
    def end(self) -> int:
        """Logical offset after the last byte written."""
        return self.base + self.current


def part_limit(max_bytes: int) -> int:
    """The most bytes one part holds: half the cap (so both together stay within it)."""
    return max(1, max_bytes // 2)


def must_rotate(current: int, incoming: int, max_bytes: int) -> bool:
    """Whether the current part (``current`` bytes, not empty) must be rotated before
    ``incoming`` more bytes are written to it."""
    return current > 0 and current + incoming > part_limit(max_bytes)


def clamp(layout: Layout, offset: int | None) -> tuple[int, int]:
    """(where a read asked to begin at ``offset`` begins, bytes dropped before it): before
    the first kept byte, it begins there; past the end, at the end."""
    start, end = layout.start, layout.end
    if offset is None:
        return start, 0
    if offset < start:
        return start, start - offset
    return min(offset, end), 0


def segments(layout: Layout, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The logical range ``[lo, hi)`` (inside the kept bytes) as reads of the parts:
    (``ROTATED`` or ``CURRENT``, position in that part, length)."""
    out: list[tuple[int, int, int]] = []
    rotated_start = layout.base - layout.rotated
    if lo < layout.base:
        first = max(lo, rotated_start)
        last = min(hi, layout.base)
        if last > first:
            out.append((ROTATED, first - rotated_start, last - first))
    if hi > layout.base:
        first = max(lo, layout.base)
        if hi > first:
            out.append((CURRENT, first - layout.base, hi - first))
    return out


def tail_start(buf: bytes, lines: int, whole: bool) -> int:
    """Where the last ``lines`` lines of ``buf`` begin (a final newline ends the last line, it
    does not start an empty one). ``whole``: ``buf`` begins at the first kept byte; else a
    partial first line is left out when there are fewer lines than asked."""
    if lines <= 0 or not buf:
        return len(buf)
    search_end = len(buf) - 1 if buf.endswith(b"\n") else len(buf)
    index = search_end
    for _ in range(lines):
        index = buf.rfind(b"\n", 0, index)
        if index < 0:
            break
    if index >= 0:
        return index + 1
    if whole:
        return 0
    first = buf.find(b"\n", 0, search_end)
    return first + 1 if first >= 0 else 0


def keep_tail(kept: bytes, more: bytes) -> bytes:
    """The stderr kept for ``stderr_tail`` after ``more`` arrives: its last ``TAIL_BYTES``."""
    joined = kept + more
    return joined[-TAIL_BYTES:] if len(joined) > TAIL_BYTES else joined


def tail_text(kept: bytes) -> str:
    """The last ``TAIL_LINES`` lines of ``kept`` as text (undecodable bytes replaced)."""
    return kept[tail_start(kept, TAIL_LINES, len(kept) < TAIL_BYTES):].decode(
        "utf-8", "replace")


def newest_epochs(epochs: list[int], keep: int) -> tuple[list[int], list[int]]:
    """(epochs kept, epochs to delete): the ``keep`` newest are kept."""
    ordered = sorted(set(epochs))
    cut = max(0, len(ordered) - keep)
    return ordered[cut:], ordered[:cut]


# -- the read answer on the wire -----------------------------------------------------------

#: Response headers of ``GET /v1/workloads/{id}/logs/{epoch}`` (the body is the bytes).
HEADER_NODE = "Hafo-Node"
HEADER_EPOCH = "Hafo-Epoch"
HEADER_OFFSET = "Hafo-Offset"
HEADER_NEXT = "Hafo-Next-Offset"
HEADER_DROPPED = "Hafo-Dropped"
HEADER_START = "Hafo-Start"
HEADER_END = "Hafo-End"
HEADER_RUNNING = "Hafo-Running"


def chunk_headers(chunk: OutputChunk) -> dict[str, str]:
    """The headers that describe ``chunk``."""
    return {HEADER_NODE: chunk.node, HEADER_EPOCH: str(chunk.epoch),
            HEADER_OFFSET: str(chunk.offset), HEADER_NEXT: str(chunk.next_offset),
            HEADER_DROPPED: str(chunk.dropped), HEADER_START: str(chunk.start),
            HEADER_END: str(chunk.end), HEADER_RUNNING: "true" if chunk.running else "false"}


def chunk_from(workload: str, headers: Mapping[str, str], data: bytes) -> OutputChunk:
    """Inverse of ``chunk_headers`` (ValueError for a header missing or malformed)."""
    def number(name: str) -> int:
        value = headers.get(name)
        if value is None or not (value.isascii() and value.isdigit()):
            raise ValueError(f"header {name}: {value!r}")
        return int(value)

    running = headers.get(HEADER_RUNNING)
    if running not in ("true", "false"):
        raise ValueError(f"header {HEADER_RUNNING}: {running!r}")
    return OutputChunk(workload=workload, node=headers.get(HEADER_NODE, ""),
                       epoch=number(HEADER_EPOCH), data=data, offset=number(HEADER_OFFSET),
                       next_offset=number(HEADER_NEXT), dropped=number(HEADER_DROPPED),
                       start=number(HEADER_START), end=number(HEADER_END),
                       running=running == "true")

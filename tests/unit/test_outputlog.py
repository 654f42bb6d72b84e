"""Instance output on disk: the capped, rotating writer, logical offsets across rotation,
the stderr tail, retention of ended outputs, and the pure arithmetic behind them."""

from __future__ import annotations

import os
import random
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.instances import write_json_atomic
from hafo.agent.outputlog import (
    OutputWriter,
    find_outputs,
    keep_ended,
    list_outputs,
    read_output,
)
from hafo.model.cluster import Assignment, Member
from hafo.model.output import (
    CURRENT,
    ROTATED,
    TAIL_BYTES,
    Layout,
    OutputChunk,
    OutputRequest,
    chunk_from,
    chunk_headers,
    clamp,
    keep_tail,
    must_rotate,
    newest_epochs,
    part_limit,
    segments,
    tail_start,
    tail_text,
)
from hafo.model.output_view import current_instance
from tests.unit.conftest import make_node, make_snapshot, placed, submit

KIB = 1024
WID = "job-abc123"

# -- pure arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "incoming", "cap", "rotate"), [
    (0, 100, 100, False),       # an empty part takes any chunk
    (40, 10, 100, False),       # 50 fits in half of 100
    (41, 10, 100, True),
    (50, 1, 100, True),
    (10, 5, 1, True),           # a tiny cap: every non-empty part rotates
])
def test_must_rotate(current: int, incoming: int, cap: int, rotate: bool) -> None:
    assert must_rotate(current, incoming, cap) is rotate
    assert part_limit(cap) >= 1


@pytest.mark.parametrize(("layout", "offset", "expected"), [
    (Layout(0, 0, 10), None, (0, 0)),
    (Layout(0, 0, 10), 4, (4, 0)),
    (Layout(0, 0, 10), 99, (10, 0)),            # past the end: at the end
    (Layout(100, 30, 5), None, (70, 0)),        # kept: [70, 105)
    (Layout(100, 30, 5), 20, (70, 50)),         # 50 bytes before the first kept were dropped
    (Layout(100, 30, 5), 101, (101, 0)),
    (Layout(100, 0, 5), 0, (100, 100)),         # rotated part gone (or never written)
])
def test_clamp(layout: Layout, offset: int | None, expected: tuple[int, int]) -> None:
    assert clamp(layout, offset) == expected


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (70, 105, [(ROTATED, 0, 30), (CURRENT, 0, 5)]),
    (80, 90, [(ROTATED, 10, 10)]),
    (100, 103, [(CURRENT, 0, 3)]),
    (99, 101, [(ROTATED, 29, 1), (CURRENT, 0, 1)]),
    (105, 105, []),
])
def test_segments(lo: int, hi: int, expected: list[tuple[int, int, int]]) -> None:
    assert segments(Layout(100, 30, 5), lo, hi) == expected


@pytest.mark.parametrize(("buf", "lines", "whole", "expected"), [
    (b"a\nb\nc\n", 2, True, b"b\nc\n"),
    (b"a\nb\nc", 2, True, b"b\nc"),              # an unfinished last line counts
    (b"a\nb\nc\n", 9, True, b"a\nb\nc\n"),
    (b"tial\nb\nc\n", 9, False, b"b\nc\n"),      # not from the start: the partial line goes
    (b"partial", 3, False, b"partial"),          # one long line: all of it
    (b"a\nb\n", 0, True, b""),
    (b"", 3, True, b""),
])
def test_tail_start(buf: bytes, lines: int, whole: bool, expected: bytes) -> None:
    assert buf[tail_start(buf, lines, whole):] == expected


def test_stderr_tail_keeps_last_lines_and_bytes() -> None:
    kept = b""
    for i in range(100):
        kept = keep_tail(kept, f"line {i}\n".encode())
    assert len(kept) <= TAIL_BYTES
    assert tail_text(kept).splitlines() == [f"line {i}" for i in range(80, 100)]
    kept = keep_tail(b"", b"x" * 10000)  # one huge line: its last 4 KiB
    assert tail_text(kept) == "x" * TAIL_BYTES
    assert tail_text(keep_tail(b"", b"only\n")) == "only\n"


@pytest.mark.parametrize(("epochs", "keep", "kept", "gone"), [
    ([5, 1, 3], 2, [3, 5], [1]),
    ([5, 1, 3], 3, [1, 3, 5], []),
    ([5, 1, 3], 0, [], [1, 3, 5]),
    ([], 3, [], []),
])
def test_newest_epochs(epochs: list[int], keep: int, kept: list[int], gone: list[int]) -> None:
    assert newest_epochs(epochs, keep) == (kept, gone)


def test_chunk_headers_round_trip() -> None:
    chunk = OutputChunk(workload=WID, node="n1", epoch=7, data=b"hi\n", offset=10,
                        next_offset=13, dropped=4, start=10, end=20, running=True)
    assert chunk_from(WID, chunk_headers(chunk), b"hi\n") == chunk
    broken = {**chunk_headers(chunk), "Hafo-Offset": "-1"}
    with pytest.raises(ValueError, match="Hafo-Offset"):
        chunk_from(WID, broken, b"")


def test_current_instance() -> None:
    nodes = [make_node("a"), make_node("b")]
    gang = Assignment(workload="g", phase="placed", node="a", epoch=30,
                      members=(Member(0, "a"), Member(1, "b")))
    moving = Assignment(workload="m", phase="moving", node="a", epoch=40, stopping=35)
    snapshot = make_snapshot(nodes, workloads=[submit(w) for w in ("p", "g", "m", "q", "c")],
                             assignments=[placed("p", "b", epoch=12), gang, moving,
                                          Assignment(workload="q", phase="pending",
                                                     epoch=3, reason="no room"),
                                          Assignment(workload="c", phase="completed",
                                                     epoch=50)])
    assert current_instance(snapshot, "p") .node == "b"
    assert current_instance(snapshot, "p").epoch == 12
    assert (current_instance(snapshot, "g", 1).node, current_instance(snapshot, "g", 1).epoch) \
        == ("b", 30)
    assert "no rank 2" in current_instance(snapshot, "g", 2).why
    assert (current_instance(snapshot, "m").node, current_instance(snapshot, "m").epoch) \
        == ("a", 35)  # while it moves, the instance being stopped
    pending = current_instance(snapshot, "q")
    assert pending.node is None and not pending.final and "no room" in pending.why
    done = current_instance(snapshot, "c")
    assert done.node is None and done.final and "completed" in done.why
    gone = current_instance(snapshot, "zzz")
    assert gone.final and "deleted" in gone.why


# -- the writer and the reader --------------------------------------------------------------


def instance(state_dir: Path, epoch: int = 7, state: str = "running") -> Path:
    path = state_dir / "instances" / f"{WID}.{epoch}"
    path.mkdir(parents=True)
    write_json_atomic(path / "state.json", {"state": state, "guard_pid": os.getpid()})
    return path


def read_all(state_dir: Path, epoch: int = 7, offset: int | None = None) -> OutputChunk:
    chunk = read_output(state_dir, "n1", WID, epoch,
                        OutputRequest(offset=offset, limit=1 << 30))
    assert chunk is not None
    return chunk


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.name.startswith("output.log")
               and not p.name.endswith(".meta"))


def test_writer_keeps_output_under_the_cap_with_offsets_across_rotation(
        tmp_path: Path) -> None:
    path = instance(tmp_path)
    cap = 256 * KIB
    writer = OutputWriter(path, cap)
    stream = bytearray()
    rng = random.Random(7)
    for i in range(3000):  # ~3 MiB in uneven chunks, 12 times the cap
        piece = f"{i:05d} ".encode() + bytes(rng.randrange(97, 123)
                                             for _ in range(rng.randrange(1, 2000))) + b"\n"
        writer.write(piece)
        stream += piece
        assert disk_bytes(path) <= cap
    writer.close()
    chunk = read_all(tmp_path, offset=0)
    assert chunk.end == len(stream) and chunk.next_offset == len(stream)
    assert chunk.start > 0 and chunk.dropped == chunk.start  # asked from 0: the rest is gone
    assert chunk.data == bytes(stream[chunk.start:])
    assert len(chunk.data) > cap // 2  # both parts serve
    middle = chunk.start + len(chunk.data) // 3
    assert read_all(tmp_path, offset=middle).data == bytes(stream[middle:])
    assert read_all(tmp_path, offset=len(stream) + 5).data == b""
    last = read_output(tmp_path, "n1", WID, 7, OutputRequest(tail=3))
    assert last is not None and last.data == b"".join(bytes(stream).splitlines(True)[-3:])
    assert last.next_offset == len(stream)
    limited = read_output(tmp_path, "n1", WID, 7, OutputRequest(offset=middle, limit=100))
    assert limited is not None and limited.data == bytes(stream[middle:middle + 100])
    assert limited.next_offset == middle + 100


def test_a_follower_never_sees_wrong_bytes_while_the_writer_rotates(tmp_path: Path) -> None:
    """Reading by offset while another thread writes and rotates: every byte a read returns
    is the byte written at that offset (the flock keeps base and parts together)."""
    path = instance(tmp_path)
    stream = bytes(random.Random(3).randrange(256) for _ in range(2 * 1024 * 1024))
    writer = OutputWriter(path, 64 * KIB)
    done = threading.Event()

    def write() -> None:
        for i in range(0, len(stream), 1000):
            writer.write(stream[i:i + 1000])
        writer.close()
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    offset, checked, reads = 0, 0, 0
    while True:
        finished = done.is_set()
        chunk = read_output(tmp_path, "n1", WID, 7, OutputRequest(offset=offset, limit=50000))
        assert chunk is not None
        reads += 1
        assert chunk.offset == offset + chunk.dropped
        assert chunk.data == stream[chunk.offset:chunk.next_offset]
        checked += len(chunk.data)
        offset = chunk.next_offset
        if finished and offset == len(stream):
            break
    thread.join(10)
    assert checked > 0 and reads > 1


def test_listing_retention_and_no_symlinks(tmp_path: Path) -> None:
    for epoch in (3, 5, 8, 9):
        path = instance(tmp_path, epoch, "exited")
        writer = OutputWriter(path, 1024)
        for _ in range(200):  # rotates: three files each
            writer.write(f"epoch {epoch}\n".encode())
        writer.close()
    running = instance(tmp_path, 11)
    OutputWriter(running, 1024).write(b"now\n")
    for epoch in (3, 5, 8, 9):  # the agent forgets them, oldest first
        keep_ended(tmp_path, tmp_path / "instances" / f"{WID}.{epoch}", WID, epoch, 2)
        shutil.rmtree(tmp_path / "instances" / f"{WID}.{epoch}")
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == [f"{WID}.{e}.log{s}" for e in (8, 9) for s in ("", ".1", ".meta")]
    listing = list_outputs(tmp_path, "n1", WID)
    assert [(o.epoch, o.running) for o in listing] == [(8, False), (9, False), (11, True)]
    assert all(o.size == o.end - o.start <= 1024 for o in listing)
    ended = read_all(tmp_path, 9)
    assert ended.data.endswith(b"epoch 9\n") and not ended.running
    assert read_output(tmp_path, "n1", WID, 3, OutputRequest()) is None
    assert find_outputs(tmp_path, "other-abc123") == {}
    # a link planted in place of an output part is never followed
    secret = tmp_path / "secret"
    secret.write_text("do not serve\n")
    (tmp_path / "logs" / f"{WID}.8.log").unlink()
    (tmp_path / "logs" / f"{WID}.8.log.1").unlink()
    os.symlink(secret, tmp_path / "logs" / f"{WID}.8.log")
    assert b"do not serve" not in read_all(tmp_path, 8).data


# -- the config field -----------------------------------------------------------------------


def test_node_logs_config() -> None:
    from hafo.model.config import NodeLogs, parse_config

    node: dict[str, Any] = {"name": "n1"}
    assert parse_config({"node": node}, "agent").node.logs == NodeLogs(64, 3)  # type: ignore[union-attr]
    config = parse_config({"node": {**node, "logs": {"max_mib": 4, "keep_epochs": 0}}},
                          "agent")
    assert config.node is not None and config.node.logs == NodeLogs(4, 0)
    assert parse_config({"node": {**node, "logs": None}}, "agent").node.logs == NodeLogs()  # type: ignore[union-attr]


@pytest.mark.parametrize(("logs", "field"), [
    ({"max_mib": 0}, "node.logs.max_mib"),
    ({"max_mib": "big"}, "node.logs.max_mib"),
    ({"max_mib": 1.5}, "node.logs.max_mib"),
    ({"keep_epochs": -1}, "node.logs.keep_epochs"),
    ({"keep_epochs": True}, "node.logs.keep_epochs"),
    ({"max_size": 4}, "node.logs.max_size"),
    ("64", "node.logs"),
])
def test_bad_node_logs_name_the_field(logs: Any, field: str) -> None:
    from hafo.model.config import parse_config
    from hafo.model.errors import ValidationError

    with pytest.raises(ValidationError) as info:
        parse_config({"node": {"name": "n1", "logs": logs}}, "agent")
    assert info.value.field == field

"""Tiered checkpoints (hafo.checkpoint.tiered): a gang of three members, one thread each,
every "node" its own RAM directory; restarts in place restore from the node's RAM, a lost
node's rank from its peer's, a zombie's late copy is refused, a corrupt copy is skipped or
marked bad, and the disk wins when it is newer."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hafo.checkpoint.errors import CorruptCheckpoint
from hafo.checkpoint.memory_store import OWN, PEER, Held, MemoryStore
from hafo.checkpoint.peer_link import Endpoint, PeerError, put_snapshot
from hafo.checkpoint.tiered import RankRecord, TieredCheckpointer, choose_memory_step

WORLD = 3


def state(rank: int, step: int) -> dict[str, Any]:
    """A rank's own state at a step: distinct per rank and step."""
    return {"w": np.full(1000, rank * 1000 + step, dtype=np.float32), "step": step,
            "rank": rank}


def gang(tmp: Path, epoch: int, nodes: list[str], **kwargs: Any) -> list[TieredCheckpointer]:
    """One member per rank, rank r on ``nodes[r]`` (its RAM is ``tmp/ram/<node>``)."""
    return [TieredCheckpointer(tmp / "ck", rank=r, world_size=WORLD, epoch=epoch,
                               memory_dir=tmp / "ram" / nodes[r], handle_signal=False,
                               restore_timeout=10, **kwargs)
            for r in range(WORLD)]


def each(members: list[TieredCheckpointer],
         call: Callable[[TieredCheckpointer], Any]) -> list[Any]:
    """``call`` on every member at once (restore waits for every member's record)."""
    results: list[Any] = [None] * len(members)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = call(members[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


def train(members: list[TieredCheckpointer], steps: range) -> None:
    for step in steps:
        for m in members:
            m.snapshot(state(m.rank, step), step)
    for m in members:
        m.wait()


def close(members: list[TieredCheckpointer]) -> None:
    for m in members:
        m.close()


def restart(tmp: Path, epoch: int, nodes: list[str]) -> list[Any]:
    """A new epoch of the gang on ``nodes``: what each member restores."""
    members = gang(tmp, epoch, nodes, durable_every=0)
    try:
        return each(members, lambda m: m.load_latest())
    finally:
        close(members)


def flip(data: Path) -> None:
    """Flip a byte of a snapshot's data (a bit rot the CRC must catch)."""
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))


def test_restart_in_place_restores_every_rank_from_its_own_ram(tmp_path: Path) -> None:
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(first, range(1, 6))
    assert all(m.stats.snapshots == 5 and m.stats.peer_copies == 5 for m in first)
    close(first)
    restored = restart(tmp_path, 2, ["a", "b", "c"])
    for rank, r in enumerate(restored):
        assert (r.tier, r.epoch, r.step) == ("own", 1, 5)
        assert r.state["rank"] == rank and float(r.state["w"][0]) == rank * 1000 + 5
    # bounded: two snapshots per rank and place
    ram = MemoryStore(tmp_path / "ram" / "a", WORLD)
    assert sorted((h.place, h.rank, h.step) for h in ram.held()) == [
        (OWN, 0, 4), (OWN, 0, 5), (PEER, 2, 4), (PEER, 2, 5)]
    report = json.loads((tmp_path / "ck" / "memory" / "e000000000002" /
                         "restored-rank-00001.json").read_text())
    assert report["tier"] == "own" and report["step"] == 5


def test_a_lost_nodes_rank_restores_from_its_peers_ram(tmp_path: Path) -> None:
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(first, range(1, 8))
    close(first)
    shutil.rmtree(tmp_path / "ram" / "c")  # node c powered off: its RAM is gone
    restored = restart(tmp_path, 2, ["a", "b", "spare"])
    assert [(r.tier, r.step) for r in restored] == [("own", 7), ("own", 7), ("peer", 7)]
    assert float(restored[2].state["w"][0]) == 2007
    report = json.loads((tmp_path / "ck" / "memory" / "e000000000002" /
                         "restored-rank-00002.json").read_text())
    assert (report["tier"], report["step"]) == ("peer", 7)
    # the fetched copy is now the spare's own: the next restart in place reads it locally
    assert MemoryStore(tmp_path / "ram" / "spare", WORLD).find(2, 1, 7) is not None


def test_a_zombies_late_snapshot_is_refused_and_never_restored(tmp_path: Path) -> None:
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(first, range(1, 4))
    close(first)
    second = gang(tmp_path, 2, ["a", "b", "c"], durable_every=0)
    each(second, lambda m: m.load_latest())
    # rank 2 of epoch 1, cut off but alive, sends a step 9 to its peer's node (rank 0's)
    zombie_copy = MemoryStore(tmp_path / "ram" / "c", WORLD).path(OWN, 2, 1, 3)
    with pytest.raises(PeerError, match="epoch 1 refused"):
        put_snapshot(second[0].server.endpoint, 2, 1, 9, zombie_copy)
    train(second, range(4, 6))
    close(second)
    restored = restart(tmp_path, 3, ["a", "b", "c"])
    assert [(r.epoch, r.step) for r in restored] == [(2, 5)] * 3
    assert all(h.step != 9 for h in MemoryStore(tmp_path / "ram" / "a", WORLD).held())


def test_a_corrupt_own_copy_falls_back_to_the_peers(tmp_path: Path) -> None:
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(first, range(1, 4))
    close(first)
    flip(MemoryStore(tmp_path / "ram" / "b", WORLD).path(OWN, 1, 1, 3) / "data.bin")
    restored = restart(tmp_path, 2, ["a", "b", "c"])
    assert [(r.tier, r.step) for r in restored] == [("own", 3), ("peer", 3), ("own", 3)]


def test_a_snapshot_no_copy_of_verifies_is_marked_bad_and_skipped_next_time(
        tmp_path: Path) -> None:
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(first, range(1, 4))
    close(first)
    for node, place in (("b", OWN), ("c", PEER)):  # both copies of rank 1's step 3
        flip(MemoryStore(tmp_path / "ram" / node, WORLD).path(place, 1, 1, 3) / "data.bin")
    second = gang(tmp_path, 2, ["a", "b", "c"], durable_every=0)
    with pytest.raises(CorruptCheckpoint, match="marked it bad"):
        each(second, lambda m: m.load_latest())
    close(second)
    restored = restart(tmp_path, 3, ["a", "b", "c"])
    assert [(r.tier, r.step) for r in restored] == [("own", 2)] * 3


def test_the_disk_wins_when_it_is_newer_and_a_new_gang_starts_empty(tmp_path: Path) -> None:
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    assert each(first, lambda m: m.load_latest()) == [None] * 3
    assert first[0].last_restore is not None and first[0].last_restore.tier == "none"
    train(first, range(1, 4))
    each(first, lambda m: m.save(state(m.rank, 10), 10))  # a planned stop: durable
    close(first)
    restored = restart(tmp_path, 2, ["a", "b", "c"])
    assert [(r.tier, r.step) for r in restored] == [("disk", 10)] * 3


def test_durable_every_writes_committed_sharded_checkpoints(tmp_path: Path) -> None:
    from hafo.checkpoint.sharded import list_sharded_checkpoints

    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=2)
    train(first, range(1, 6))
    close(first)
    assert [ref.step for ref in list_sharded_checkpoints(tmp_path / "ck")] == [4, 2]


def test_steps_must_grow(tmp_path: Path) -> None:
    members = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    members[0].snapshot(state(0, 3), 3)
    with pytest.raises(ValueError, match="not after"):
        members[0].snapshot(state(0, 3), 3)
    with pytest.raises(ValueError, match="copy must be"):
        members[0].snapshot(state(0, 4), 4, copy="later")  # type: ignore[arg-type]
    members[0].snapshot(state(0, 4), 4, copy="background")  # the bad call changed nothing
    close(members)


def record(rank: int, *held: tuple[int, int, int]) -> RankRecord:
    return RankRecord(rank, f"n{rank}", Endpoint("127.0.0.1", 1, "t"),
                      tuple(Held(r, e, s, OWN) for r, e, s in held))


@pytest.mark.parametrize(("records", "bad", "expected"), [
    ([], set(), None),
    ([record(0, (0, 1, 5), (1, 1, 5))], set(), (1, 5)),
    ([record(0, (0, 1, 5)), record(1, (1, 1, 4))], set(), None),  # no step held by all
    ([record(0, (0, 1, 5), (0, 1, 4)), record(1, (1, 1, 4), (0, 1, 4))], set(), (1, 4)),
    ([record(0, (0, 1, 5), (1, 1, 5), (0, 1, 4), (1, 1, 4))], {(1, 5)}, (1, 4)),
    ([record(0, (0, 2, 1), (1, 2, 1), (0, 1, 9), (1, 1, 9))], set(), (2, 1)),  # epoch first
    ([record(0, (0, 3, 1), (1, 3, 1))], set(), None),  # this epoch's own: not a candidate
    ([record(0, (0, 1, 5), (1, 1, 5), (7, 1, 6))], set(), (1, 5)),  # rank out of the gang
], ids=["nothing", "all-held", "none-common", "older-common", "bad-skipped", "epoch-first",
        "own-epoch", "foreign-rank"])
def test_choose_memory_step(records: list[RankRecord], bad: set[tuple[int, int]],
                            expected: tuple[int, int] | None) -> None:
    assert choose_memory_step(records, 2, 3, bad) == expected


def _raw(endpoint: Endpoint, payload: bytes) -> dict[str, Any]:
    import socket
    import struct

    with socket.create_connection((endpoint.host, endpoint.port), timeout=5) as sock:
        sock.sendall(payload)
        size = struct.unpack(">I", sock.recv(4))[0]
        data = b""
        while len(data) < size:
            data += sock.recv(size - len(data))
        answer: dict[str, Any] = json.loads(data)
        return answer


def _frame(body: Any) -> bytes:
    import struct

    data = json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


@pytest.mark.parametrize(("body", "error"), [
    ({"op": "get", "token": "nope", "rank": 0, "epoch": 1, "step": 1}, "wrong token"),
    ({"op": "get", "rank": 0, "epoch": 1, "step": 1}, "wrong token"),
    ({"op": "put", "token": None, "rank": -1, "epoch": 1, "step": 1, "sizes": [1, 1]},
     "bad rank"),
    ({"op": "get", "token": None, "rank": 0, "epoch": 1, "step": 99}, "no snapshot"),
    ({"op": "put", "token": None, "rank": 0, "epoch": 1, "step": 2, "sizes": [1]},
     "sizes must list"),
    ({"op": "put", "token": None, "rank": 0, "epoch": 1, "step": 2,
      "sizes": [1, 10 ** 15]}, "no room"),
    ({"op": "delete", "token": None, "rank": 0, "epoch": 1, "step": 2}, "unknown op"),
    ({"op": "get", "token": None, "rank": "x", "epoch": 1, "step": 2}, "invalid literal"),
], ids=["wrong-token", "no-token", "negative-rank", "not-held", "short-sizes", "too-big",
        "unknown-op", "not-a-number"])
def test_a_bad_request_is_refused_with_one_clear_error(tmp_path: Path, body: dict[str, Any],
                                                       error: str) -> None:
    member = TieredCheckpointer(tmp_path / "ck", rank=0, world_size=1, epoch=1,
                                memory_dir=tmp_path / "ram", handle_signal=False)
    try:
        endpoint = member.server.endpoint
        if body.get("token", "") is None:
            body = {**body, "token": endpoint.token}
        answer = _raw(endpoint, _frame(body))
        assert answer["ok"] is False and error in answer["error"], answer
        assert MemoryStore(tmp_path / "ram").held() == []
    finally:
        member.close()


def test_an_oversized_or_garbled_frame_is_refused(tmp_path: Path) -> None:
    import struct

    member = TieredCheckpointer(tmp_path / "ck", rank=0, world_size=1, epoch=1,
                                memory_dir=tmp_path / "ram", handle_signal=False)
    try:
        endpoint = member.server.endpoint
        assert "frame of" in _raw(endpoint, struct.pack(">I", 10 ** 9))["error"]
        assert "bad frame" in _raw(endpoint, struct.pack(">I", 3) + b"{{{")["error"]
        assert "not an object" in _raw(endpoint, _frame([1, 2]))["error"]
    finally:
        member.close()


def test_a_snapshot_is_written_over_the_oldest_in_place(tmp_path: Path) -> None:
    """Each place keeps two snapshots; the third is written over the oldest's files, so a
    snapshot every step allocates no new memory (the data file keeps its inode)."""
    members = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(members, range(1, 3))
    own, peer = (MemoryStore(tmp_path / "ram" / "a", WORLD).path(place, rank, 1, 1) / "data.bin"
                 for place, rank in ((OWN, 0), (PEER, 2)))
    inodes = (own.stat().st_ino, peer.stat().st_ino)
    train(members, range(3, 4))
    close(members)
    ram = MemoryStore(tmp_path / "ram" / "a", WORLD)
    assert sorted((h.place, h.rank, h.step) for h in ram.held()) == [
        (OWN, 0, 2), (OWN, 0, 3), (PEER, 2, 2), (PEER, 2, 3)]
    assert (ram.path(OWN, 0, 1, 3) / "data.bin").stat().st_ino == inodes[0]
    assert (ram.path(PEER, 2, 1, 3) / "data.bin").stat().st_ino == inodes[1]
    restored = restart(tmp_path, 2, ["a", "b", "c"])
    assert [float(r.state["w"][0]) for r in restored] == [3.0, 1003.0, 2003.0]


def test_a_resized_gang_never_reads_the_old_sizes_snapshots(tmp_path: Path) -> None:
    """Rank r of a gang of 3 holds another part of the state than rank r of a gang of 2: a
    gang resized restores from disk (which refuses another world size) and drops them."""
    first = gang(tmp_path, 1, ["a", "b", "c"], durable_every=0)
    train(first, range(1, 4))
    close(first)
    resized = [TieredCheckpointer(tmp_path / "ck", rank=r, world_size=2, epoch=2,
                                  memory_dir=tmp_path / "ram" / node, handle_signal=False,
                                  restore_timeout=10, durable_every=0)
               for r, node in enumerate(["a", "b"])]
    assert each(resized, lambda m: m.load_latest()) == [None, None]
    close(resized)
    assert all(entry.name.endswith("-of-00002") or not entry.is_dir()
               for place in ("own", "peer")
               for entry in (tmp_path / "ram" / "a" / place).iterdir())


def test_a_transfer_blocked_on_a_silent_peer_is_aborted_at_once(tmp_path: Path) -> None:
    """A warm member parking (``hafo.checkpoint.warm``) ends a snapshot's copy to a peer that
    took the connection and never answers (a stopped process), instead of waiting for the
    transfer's 30 s timeout."""
    import socket
    import time

    from hafo.checkpoint.peer_link import abort_transfers

    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    from hafo.checkpoint.memory_store import FILES
    for name in FILES:
        (snapshot / name).write_bytes(b"x")
    failed: list[BaseException] = []

    def put() -> None:
        try:
            put_snapshot(Endpoint("127.0.0.1", port, "t"), 0, 1, 1, snapshot)
        except PeerError as exc:
            failed.append(exc)

    thread = threading.Thread(target=put)
    thread.start()
    try:
        time.sleep(0.3)  # connected, its header sent, waiting for the answer
        started = time.monotonic()
        assert abort_transfers() == 1
        thread.join(5)
        assert not thread.is_alive() and failed, "the transfer ended with a PeerError"
        assert time.monotonic() - started < 2
        assert abort_transfers() == 0  # none left in flight
    finally:
        silent.close()
        thread.join(5)

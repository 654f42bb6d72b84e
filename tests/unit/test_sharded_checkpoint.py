"""Sharded gang checkpoints, members as threads on a tmp_path: commit rule, same step on
every member, epoch fencing, world-size rule, corrupt shards and prune."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hafo.checkpoint import Checkpointer, ShardedCheckpointer
from hafo.checkpoint.format import CorruptCheckpoint, list_checkpoints
from hafo.checkpoint.sharded import (
    COMMIT,
    ShardedCheckpointMismatch,
    ShardedCommitTimeout,
    StaleEpoch,
    gang_dir_name,
    list_all_checkpoints,
    list_sharded_checkpoints,
    read_commit,
)


def member(root: Path, rank: int, world: int, epoch: int = 1, **kwargs: Any
           ) -> ShardedCheckpointer:
    kwargs.setdefault("commit_timeout", 10.0)
    return ShardedCheckpointer(root, rank=rank, world_size=world, epoch=epoch,
                               handle_signal=False, poll_interval=0.01, **kwargs)


def gang(root: Path, world: int, epoch: int = 1, **kwargs: Any) -> list[ShardedCheckpointer]:
    return [member(root, rank, world, epoch, **kwargs) for rank in range(world)]


def together(members: list[ShardedCheckpointer],
             action: Callable[[ShardedCheckpointer], Any]) -> list[Any]:
    """Run ``action`` on every member at once (one thread each); their results in rank
    order (re-raises the first error)."""
    with ThreadPoolExecutor(len(members)) as pool:
        futures = [pool.submit(action, ck) for ck in members]
        return [f.result(timeout=30) for f in futures]


def shard_state(rank: int, step: int) -> dict[str, Any]:
    return {"rank": rank, "step": step,
            "w": np.full((4, 8), rank * 1000 + step, dtype=np.float32),
            "opt": {0: {"m": np.arange(5, dtype=np.int64) * rank}}}


def save_all(members: list[ShardedCheckpointer], step: int) -> list[str]:
    return together(members, lambda ck: ck.save(shard_state(ck.rank, step), step))


@pytest.mark.parametrize("world", [2, 3])
def test_round_trip_every_member_gets_its_shard_of_the_same_step(tmp_path: Path,
                                                                 world: int) -> None:
    members = gang(tmp_path, world, epoch=7)
    assert together(members, lambda ck: ck.load_latest()) == [None] * world
    first = save_all(members, 10)
    paths = save_all(members, 20)
    assert set(first) == {str(tmp_path / gang_dir_name(7, 10))}
    assert set(paths) == {str(tmp_path / gang_dir_name(7, 20))}
    # a fresh gang (new processes) reads the same checkpoint, each member its own shard
    restored = together(gang(tmp_path, world, epoch=8), lambda ck: ck.load_latest())
    for rank, got in enumerate(restored):
        assert (got.step, got.epoch, got.path) == (20, 7, paths[0])
        assert got.state["rank"] == rank and got.state["step"] == 20
        assert np.array_equal(got.state["w"], shard_state(rank, 20)["w"])
        assert np.array_equal(got.state["opt"][0]["m"], np.arange(5) * rank)
    record = read_commit(Path(paths[0]))
    assert (record["epoch"], record["step"], record["world_size"]) == (7, 20, world)
    assert [s["rank"] for s in record["shards"]] == list(range(world))
    assert all(len(s["manifest_sha256"]) == 64 for s in record["shards"])
    shard_dirs = sorted(p.name for p in Path(paths[0]).iterdir() if p.is_dir())
    assert shard_dirs == [f"rank-{r:05d}-of-{world:05d}" for r in range(world)]
    assert [r.step for r in list_sharded_checkpoints(tmp_path)] == [20, 10]


def test_rank_and_world_size_default_to_torchruns_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAFO_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("HAFO_EPOCH", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ck = ShardedCheckpointer(handle_signal=False)
    assert (ck.root, ck.rank, ck.world_size, ck.epoch) == (tmp_path, 2, 3, 4)
    with pytest.raises(ValueError, match="rank 3 is not in a gang of 3"):
        ShardedCheckpointer(tmp_path, rank=3, world_size=3, handle_signal=False)


def test_a_member_returns_only_once_the_gang_committed(tmp_path: Path) -> None:
    rank0, rank1 = gang(tmp_path, 2)
    done = threading.Event()

    def late_member() -> None:
        rank1.save(shard_state(1, 5), 5)
        done.set()

    thread = threading.Thread(target=late_member)
    thread.start()
    try:
        # rank 1's shard is written, but without rank 0's commit it does not return
        shard = tmp_path / gang_dir_name(1, 5) / "rank-00001-of-00002"
        assert not done.wait(0.5)
        assert list_checkpoints(shard) and not (shard.parent / COMMIT).exists()
        rank0.save(shard_state(0, 5), 5)
    finally:
        thread.join(10)
    assert done.is_set() and (shard.parent / COMMIT).is_file()


def test_uncommitted_checkpoint_is_ignored_by_every_member(tmp_path: Path) -> None:
    members = gang(tmp_path, 2, commit_timeout=0.3)
    save_all(members, 10)
    # step 20: rank 1 never writes its shard, so rank 0 never commits
    with pytest.raises(ShardedCommitTimeout, match="waiting for every shard"):
        members[0].save(shard_state(0, 20), 20)
    partial = tmp_path / gang_dir_name(1, 20)
    assert (partial / "rank-00000-of-00002").is_dir() and not (partial / COMMIT).exists()
    restored = together(gang(tmp_path, 2, epoch=2), lambda ck: ck.load_latest())
    assert [(r.step, r.state["rank"]) for r in restored] == [(10, 0), (10, 1)]


def test_other_member_times_out_without_rank_0s_commit(tmp_path: Path) -> None:
    members = gang(tmp_path, 2, commit_timeout=0.3)
    with pytest.raises(ShardedCommitTimeout, match="rank 0's commit record"):
        members[1].save(shard_state(1, 3), 3)
    assert list_sharded_checkpoints(tmp_path) == []


def test_world_size_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    save_all(gang(tmp_path, 2), 30)
    with pytest.raises(ShardedCheckpointMismatch,
                       match=r"checkpoint gang-e000000000001-s000000000030 has 2 shards, "
                             r"this gang has 3 members: resharding is not done"):
        member(tmp_path, 0, 3, epoch=2).load_latest()


def test_newest_epoch_wins_over_a_higher_step_of_an_older_epoch(tmp_path: Path) -> None:
    save_all(gang(tmp_path, 2, epoch=1), 50)
    save_all(gang(tmp_path, 2, epoch=2), 5)
    restored = together(gang(tmp_path, 2, epoch=3), lambda ck: ck.load_latest())
    assert [(r.epoch, r.step) for r in restored] == [(2, 5), (2, 5)]


def test_a_stale_epochs_late_commit_is_refused_and_loses(tmp_path: Path) -> None:
    old = gang(tmp_path, 2, epoch=1)
    save_all(old, 10)
    # epoch 1's members write their shards of step 60 (rank 0 lags behind) ...
    with pytest.raises(ShardedCommitTimeout):
        member(tmp_path, 1, 2, epoch=1, commit_timeout=0.2).save(shard_state(1, 60), 60)
    # ... the gang restarts as epoch 2 and commits step 20 ...
    save_all(gang(tmp_path, 2, epoch=2), 20)
    # ... then epoch 1's rank 0 finishes: every shard is there, but it does not commit
    with pytest.raises(StaleEpoch, match="epoch 2 of this gang exists"):
        old[0].save(shard_state(0, 60), 60)
    assert not (tmp_path / gang_dir_name(1, 60) / COMMIT).exists()
    restored = together(gang(tmp_path, 2, epoch=3), lambda ck: ck.load_latest())
    assert [(r.epoch, r.step) for r in restored] == [(2, 20), (2, 20)]


def test_a_superseded_member_stops_waiting_for_the_commit(tmp_path: Path) -> None:
    save_all(gang(tmp_path, 2, epoch=2), 20)
    with pytest.raises(StaleEpoch):
        member(tmp_path, 1, 2, epoch=1).save(shard_state(1, 30), 30)


def test_prune_keeps_the_newest_committed_and_removes_older_partials(tmp_path: Path) -> None:
    members = gang(tmp_path, 2, keep_last=2, commit_timeout=0.2)
    save_all(members, 1)
    with pytest.raises(ShardedCommitTimeout):  # a partial step 2
        members[1].save(shard_state(1, 2), 2)
    for step in (3, 4, 5):
        save_all(members, step)
    with pytest.raises(ShardedCommitTimeout):  # a partial step 6, newer than any commit
        members[0].save(shard_state(0, 6), 6)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("gang-"))
    # step 6 is still partial (prune ran after step 5's commit, before it); 1 and 2 are gone
    assert names == [gang_dir_name(1, s) for s in (4, 5, 6)]
    save_all(gang(tmp_path, 2, epoch=2, keep_last=2), 1)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("gang-"))
    assert names == [gang_dir_name(1, 5), gang_dir_name(2, 1)]


def test_step_must_grow_within_an_epoch(tmp_path: Path) -> None:
    members = gang(tmp_path, 2)
    save_all(members, 10)
    with pytest.raises(ValueError, match="larger step"):
        members[0].save(shard_state(0, 10), 10)
    with pytest.raises(ValueError, match="already committed"):
        member(tmp_path, 1, 2).save(shard_state(1, 10), 10)


def _corrupt_data(gang_path: Path, rank: int) -> None:
    data = next((gang_path / f"rank-{rank:05d}-of-00002").glob("ckpt-*/data.bin"))
    raw = bytearray(data.read_bytes())
    raw[3] ^= 0xFF
    data.write_bytes(bytes(raw))


def test_own_corrupt_shard_raises_then_the_whole_gang_skips_it(tmp_path: Path) -> None:
    members = gang(tmp_path, 2)
    save_all(members, 10)
    newest = Path(save_all(members, 20)[0])
    _corrupt_data(newest, 1)
    fresh = gang(tmp_path, 2, epoch=2)
    # rank 0's shard verifies; rank 1's does not: rank 1 refuses rather than load step 10
    assert fresh[0].load_latest().step == 20  # type: ignore[union-attr]
    with pytest.raises(CorruptCheckpoint,
                       match=r"checkpoint gang-e000000000001-s000000000020: the shard of "
                             r"rank 1 does not verify"):
        fresh[1].load_latest()
    assert (newest / "BAD-rank-00001.json").is_file()
    # the gang's next start: every member skips the marked checkpoint
    restored = together(gang(tmp_path, 2, epoch=3), lambda ck: ck.load_latest())
    assert [(r.step, r.state["rank"]) for r in restored] == [(10, 0), (10, 1)]


def test_a_shard_whose_manifest_changed_is_skipped_by_every_member(tmp_path: Path) -> None:
    members = gang(tmp_path, 2)
    save_all(members, 10)
    newest = Path(save_all(members, 20)[0])
    manifest = next((newest / "rank-00001-of-00002").glob("ckpt-*/manifest.json"))
    manifest.write_text(manifest.read_text().replace('"step": 20', '"step": 21'))
    restored = together(gang(tmp_path, 2, epoch=2), lambda ck: ck.load_latest())
    assert [r.step for r in restored] == [10, 10]


def test_a_missing_shard_or_a_damaged_commit_record_is_skipped(tmp_path: Path) -> None:
    members = gang(tmp_path, 2)
    save_all(members, 10)
    twenty = Path(save_all(members, 20)[0])
    thirty = Path(save_all(members, 30)[0])
    record = json.loads((thirty / COMMIT).read_text())
    record["step"] = 31
    (thirty / COMMIT).write_text(json.dumps(record))
    for path in (twenty / "rank-00000-of-00002").iterdir():
        path.rename(path.with_name(".gone"))
    restored = together(gang(tmp_path, 2, epoch=2), lambda ck: ck.load_latest())
    assert [r.step for r in restored] == [10, 10]


@pytest.mark.parametrize("snapshot", ["now", "background"])
def test_save_async_stages_now_and_commits_in_the_background(tmp_path: Path,
                                                             snapshot: str) -> None:
    members = gang(tmp_path, 2)
    states = [shard_state(rank, 10) for rank in range(2)]

    def save_async(ck: ShardedCheckpointer) -> None:
        ck.save_async(states[ck.rank], 10, snapshot=snapshot)  # type: ignore[arg-type]
        if snapshot == "background":
            ck.wait_snapshot()
        states[ck.rank]["w"][:] = -1  # the training loop goes on changing its arrays

    together(members, save_async)
    together(members, lambda ck: ck.wait())
    assert (tmp_path / gang_dir_name(1, 10) / COMMIT).is_file()
    restored = together(gang(tmp_path, 2, epoch=2), lambda ck: ck.load_latest())
    for rank, got in enumerate(restored):
        assert np.array_equal(got.state["w"], shard_state(rank, 10)["w"])


def test_save_async_error_is_raised_by_the_next_call(tmp_path: Path) -> None:
    ck = member(tmp_path, 1, 2, commit_timeout=0.2)
    ck.save_async(shard_state(1, 1), 1)
    with pytest.raises(RuntimeError, match="previous background checkpoint failed"):
        ck.wait()
    ck.wait()  # reported once


def test_members_can_meet_at_a_barrier_instead_of_polling(tmp_path: Path) -> None:
    meet = threading.Barrier(3)
    members = gang(tmp_path, 3, barrier=meet.wait)
    save_all(members, 10)
    assert (tmp_path / gang_dir_name(1, 10) / COMMIT).is_file()
    restored = together(members, lambda ck: ck.load_latest())
    assert [r.state["rank"] for r in restored] == [0, 1, 2]


def test_list_all_checkpoints_merges_single_instance_and_gang_ones(tmp_path: Path) -> None:
    Checkpointer(tmp_path, epoch=1, handle_signal=False).save({"a": 1}, step=7)
    save_all(gang(tmp_path, 2, epoch=2), 3)
    with pytest.raises(ShardedCommitTimeout):  # partial: not listed
        member(tmp_path, 1, 2, epoch=2, commit_timeout=0.1).save(shard_state(1, 4), 4)
    listed = [(r.epoch, r.step, r.path.name) for r in list_all_checkpoints(tmp_path)]
    assert listed == [(2, 3, gang_dir_name(2, 3)), (1, 7, "ckpt-e000000000001-s000000000007")]

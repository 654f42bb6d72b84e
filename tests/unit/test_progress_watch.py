"""The agent's side of ``hang_timeout``: the SDK's rank files, read and timed on the agent's
clock (``hafo.agent.progress_watch``), and the stopped-process probe (reads only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hafo.agent.instances import InstanceKey
from hafo.agent.proctree import process_stopped
from hafo.agent.progress_watch import RESTORE_WINDOW_SECONDS, ProgressWatch, read_beats
from hafo.checkpoint import Checkpointer
from hafo.checkpoint.sharded import ShardedCheckpointer
from hafo.model.cluster import Pace, Restore, Stall
from hafo.model.progress import (
    Heartbeat,
    encode_heartbeat,
    parse_heartbeat,
    parse_restore,
    rank_of_file,
)
from hafo.render import _restored

KEY = InstanceKey("w-abc123", 50)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(directory: Path, rank: int, step: int, pid: int = 1) -> None:
    directory.mkdir(exist_ok=True)
    text = encode_heartbeat(Heartbeat(step=step, epoch=50, t=time.time(), pid=pid, rank=rank))
    (directory / f"rank-{rank}.json").write_text(text)


def test_no_stall_while_ranks_progress(tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("n1", clock)
    for step in range(20):
        beat(tmp_path, 0, step)
        beat(tmp_path, 1, step)
        assert watch.stall(KEY, tmp_path, 4.0) is None
        clock.now += 1.0


def test_the_oldest_rank_is_reported_once_per_stall(tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("n1", clock)
    beat(tmp_path, 0, 10)
    beat(tmp_path, 1, 10)
    assert watch.stall(KEY, tmp_path, 4.0) is None
    clock.now += 1.0
    beat(tmp_path, 0, 11)  # rank 1 stalls at 10, rank 0 reaches 11 and waits
    assert watch.stall(KEY, tmp_path, 4.0) is None
    clock.now += 3.5
    stall = watch.stall(KEY, tmp_path, 4.0)
    assert stall == Stall(rank=1, step=10, stalled_for=4.5, stopped=False)
    clock.now += 2.0
    assert watch.stall(KEY, tmp_path, 4.0) is stall, "the same report while it lasts"
    beat(tmp_path, 1, 11)
    clock.now += 0.2
    assert watch.stall(KEY, tmp_path, 4.0) == Stall(rank=0, step=11, stalled_for=5.7), \
        "rank 0 has waited as long: now it is the oldest"
    beat(tmp_path, 0, 12)
    assert watch.stall(KEY, tmp_path, 4.0) is None, "progress again"


def test_a_clock_step_of_the_heartbeats_is_no_stall(tmp_path: Path) -> None:
    """Only a change counts, timed on the agent's clock: the heartbeats' wall times do not."""
    clock = Clock()
    watch = ProgressWatch("n1", clock)
    for step in range(10):
        directory = tmp_path
        directory.mkdir(exist_ok=True)
        text = encode_heartbeat(Heartbeat(step=step, epoch=50, t=0.0 if step % 2 else 1e12,
                                          pid=1, rank=0))
        (directory / "rank-0.json").write_text(text)
        assert watch.stall(KEY, tmp_path, 2.0) is None
        clock.now += 1.0


def test_before_any_heartbeat_the_instance_s_run_time_counts(tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("n1", clock)
    assert watch.stall(KEY, tmp_path / "missing", 4.0) is None
    clock.now += 4.0
    assert watch.stall(KEY, tmp_path / "missing", 4.0) == Stall(rank=None, step=None,
                                                               stalled_for=4.0)


def test_retired_instances_start_afresh(tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("n1", clock)
    beat(tmp_path, 0, 1)
    watch.stall(KEY, tmp_path, 4.0)
    clock.now += 10
    assert watch.stall(KEY, tmp_path, 4.0) is not None
    watch.retire([])
    assert watch.stall(KEY, tmp_path, 4.0) is None


def test_bad_files_are_skipped_and_reading_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text("not json")
    (tmp_path / "rank-1.json").write_text("[1, 2]")
    (tmp_path / "rank-2.json").write_text('{"step": 3}')
    (tmp_path / "rank-x.json").write_text("{}")
    (tmp_path / "other.json").write_text("{}")
    (tmp_path / "rank-3.json").write_text(" " * 10_000_000)  # big: only 4 KiB read
    beat(tmp_path, 4, 9)
    for rank in range(5, 100):
        beat(tmp_path, rank, rank)
    beats = read_beats(tmp_path)
    assert 4 in beats and not {0, 1, 2, 3} & set(beats)
    assert len(beats) <= 64


def test_links_fifos_and_directories_are_not_read(tmp_path: Path) -> None:
    """The workload writes the progress directory: a FIFO would block the agent's loop on
    open, a link could point anywhere."""
    os.mkfifo(tmp_path / "rank-0.json")
    beat(tmp_path / "elsewhere", 1, 5)
    (tmp_path / "rank-1.json").symlink_to(tmp_path / "elsewhere" / "rank-1.json")
    (tmp_path / "rank-2.json").mkdir()
    beat(tmp_path, 3, 7)
    started = time.monotonic()
    assert sorted(read_beats(tmp_path)) == [3]
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(("name", "rank"), [
    ("rank-0.json", 0), ("rank-17.json", 17), ("rank-.json", None), ("rank--1.json", None),
    ("rank-1.json.tmp", None), (".rank-1.json.123.tmp", None), ("rank-1234567.json", None),
])
def test_rank_file_names(name: str, rank: int | None) -> None:
    assert rank_of_file(name) == rank


def test_old_heartbeats_without_a_rank_still_parse() -> None:
    old = parse_heartbeat('{"step": 1, "epoch": 2, "t": 3.0, "pid": 4}')
    assert old == Heartbeat(step=1, epoch=2, t=3.0, pid=4)
    assert parse_heartbeat('"a string"') is None


# -- the SDK writes them ----------------------------------------------------------------------

def test_the_sdk_writes_its_rank_s_file_and_never_goes_backwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = tmp_path / "progress"
    progress.mkdir()
    monkeypatch.setenv("HAFO_PROGRESS_DIR", str(progress))
    monkeypatch.setenv("RANK", "3")
    ck = Checkpointer(tmp_path / "ck", epoch=7, handle_signal=False)
    ck.heartbeat(12)
    ck.heartbeat(10)  # e.g. a background save's beat of an older step
    beats = read_beats(progress)
    assert list(beats) == [3]
    assert (beats[3].step, beats[3].epoch, beats[3].pid) == (12, 7, os.getpid())
    shared = parse_heartbeat((tmp_path / "ck" / "heartbeat.json").read_text())
    assert shared is not None and shared.step == 12
    sharded = ShardedCheckpointer(tmp_path / "ck2", rank=1, world_size=2, epoch=7,
                                  handle_signal=False)
    sharded.heartbeat(5)
    assert sorted(read_beats(progress)) == [1, 3]


def test_the_sdk_without_a_progress_dir_writes_only_heartbeat_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAFO_PROGRESS_DIR", raising=False)
    ck = Checkpointer(tmp_path, epoch=1, handle_signal=False)
    ck.heartbeat(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heartbeat.json"]


def test_an_unwritable_progress_dir_is_logged_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAFO_PROGRESS_DIR", str(tmp_path / "gone" / "deeper"))
    ck = Checkpointer(tmp_path / "ck", epoch=1, handle_signal=False)
    ck.heartbeat(1)  # no exception
    assert (tmp_path / "ck" / "heartbeat.json").exists()


# -- the stopped-process probe ----------------------------------------------------------------

def test_a_stopped_process_of_the_instance_is_seen_stopped_and_no_other() -> None:
    env = {**os.environ, "HAFO_WORKLOAD": KEY.workload, "HAFO_EPOCH": str(KEY.epoch),
           "HAFO_NODE": "n1"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert not process_stopped(proc.pid, KEY.workload, KEY.epoch, "n1")
        os.kill(proc.pid, signal.SIGSTOP)  # our own child, by its pid
        deadline = time.monotonic() + 5
        while not process_stopped(proc.pid, KEY.workload, KEY.epoch, "n1"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not process_stopped(proc.pid, KEY.workload, KEY.epoch, "n2"), "another node's"
        assert not process_stopped(proc.pid, KEY.workload, KEY.epoch + 1, "n1")
        assert not process_stopped(os.getpid(), KEY.workload, KEY.epoch, "n1")
        assert not process_stopped(2 ** 22 + 7, KEY.workload, KEY.epoch, "n1")
    finally:
        proc.kill()
        proc.wait(timeout=10)


# -- own time per step (straggler_lag) ---------------------------------------------------------

def paced_beat(directory: Path, rank: int, step: int, compute: float | None) -> None:
    directory.mkdir(exist_ok=True)
    text = encode_heartbeat(Heartbeat(step=step, epoch=50, t=time.time(), pid=1, rank=rank,
                                      compute=compute))
    (directory / f"rank-{rank}.json").write_text(text)


def test_the_slowest_rank_s_pace_is_reported_when_it_moves_by_the_quantum(
        tmp_path: Path) -> None:
    watch = ProgressWatch("n1", Clock())
    paced_beat(tmp_path, 0, 1, None)
    watch.stall(KEY, tmp_path, None)
    assert watch.pace(KEY, 0.1) is None, "no synced() yet"
    paced_beat(tmp_path, 0, 2, 0.50)
    paced_beat(tmp_path, 1, 2, 0.20)
    watch.stall(KEY, tmp_path, None)
    first = watch.pace(KEY, 0.1)
    assert first == Pace(rank=0, compute=0.5)
    paced_beat(tmp_path, 0, 3, 0.55)  # noise below the quantum: the same report
    watch.stall(KEY, tmp_path, None)
    assert watch.pace(KEY, 0.1) is first
    paced_beat(tmp_path, 0, 4, 0.65)
    watch.stall(KEY, tmp_path, None)
    assert watch.pace(KEY, 0.1) == Pace(rank=0, compute=0.65)
    paced_beat(tmp_path, 1, 5, 0.90)  # another rank is now the slowest
    watch.stall(KEY, tmp_path, None)
    assert watch.pace(KEY, 0.1) == Pace(rank=1, compute=0.9)
    assert watch.stall(KEY, tmp_path, None) is None, "no hang_timeout: never stalled"


def test_the_sdk_reports_the_median_own_time_per_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = tmp_path / "progress"
    progress.mkdir()
    monkeypatch.setenv("HAFO_PROGRESS_DIR", str(progress))
    ck = Checkpointer(tmp_path / "ck", epoch=7, handle_signal=False)
    ck.heartbeat(1)
    assert read_beats(progress)[0].compute is None, "synced() never called"
    own = [1.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 1.0]  # a slow first step, then another
    ticks = iter(t for i, d in enumerate(own) for t in (10.0 * i, 10.0 * i + d))
    monkeypatch.setattr("hafo.checkpoint.sdk.time.monotonic", lambda: next(ticks))
    for step, _ in enumerate(own[:7], start=2):
        ck.synced()
        ck.heartbeat(step)
        assert read_beats(progress)[0].compute is None, "fewer than MIN_OWN_TIME_STEPS"
    for step in (9, 10):
        ck.synced()
        ck.heartbeat(step)
        compute = read_beats(progress)[0].compute
        assert compute is not None and abs(compute - 0.1) < 1e-6, "the median: slow steps"


def test_a_compute_that_is_not_a_duration_is_no_heartbeat() -> None:
    for bad in ('-1', '"x"', '1e12', 'null'):
        beat = parse_heartbeat('{"step": 1, "epoch": 2, "t": 3.0, "pid": 4, "compute": '
                               + bad + '}')
        assert (beat is None) == (bad != 'null'), bad


def restore(directory: Path, rank: int, tier: str, step: int | None, seconds: float) -> None:
    directory.mkdir(exist_ok=True)
    (directory / f"restore-{rank}.json").write_text(json.dumps(
        {"rank": rank, "tier": tier, "epoch": 3, "step": step, "seconds": seconds}))


def test_the_slowest_ranks_restore_is_reported_then_kept(tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("node-a", clock)
    assert watch.restored(KEY, tmp_path) is None
    restore(tmp_path, 0, "own", 41, 0.05)
    restore(tmp_path, 1, "peer", 41, 0.3)
    (tmp_path / "restore-2.json").write_text("{not json")  # skipped
    (tmp_path / "restore-x.json").write_text("{}")  # not a restore report's name
    assert watch.restored(KEY, tmp_path) == Restore(1, "peer", 41, 0.3)
    beat(tmp_path, 0, 42)
    watch.stall(KEY, tmp_path, 10.0)  # a rank progressed: every rank here restored
    assert watch.restored(KEY, tmp_path) == Restore(1, "peer", 41, 0.3)
    restore(tmp_path, 3, "disk", 30, 9.0)  # read no more
    assert watch.restored(KEY, tmp_path) == Restore(1, "peer", 41, 0.3)


def test_restore_reports_are_read_for_a_while_without_heartbeats(tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("node-a", clock)
    restore(tmp_path, 0, "none", None, 0.01)
    assert watch.restored(KEY, tmp_path) == Restore(0, "none", None, 0.01)
    restore(tmp_path, 1, "disk", 10, 1.5)
    clock.now += 5
    assert watch.restored(KEY, tmp_path) == Restore(1, "disk", 10, 1.5)
    clock.now += 30
    watch.restored(KEY, tmp_path)
    restore(tmp_path, 2, "peer", 10, 4.0)
    assert watch.restored(KEY, tmp_path) == Restore(1, "disk", 10, 1.5)


@pytest.mark.parametrize("text", ['{"rank": 0, "tier": "ram", "step": 1, "seconds": 1}',
                                  '{"rank": -1, "tier": "own", "step": 1, "seconds": 1}',
                                  '{"rank": 0, "tier": "own", "step": 1, "seconds": -1}',
                                  '{"rank": 0, "tier": "own", "step": 1}', "[]", ""])
def test_a_bad_restore_report_is_none(text: str) -> None:
    assert parse_restore(text) is None


def test_render_shows_how_each_member_restored() -> None:
    member = {"rank": 1, "node": "spare-1", "state": "running", "gpus": ["0"],
              "gpu_indexes": [0], "restored": {"rank": 1, "tier": "peer", "step": 41,
                                                "seconds": 0.213}}
    assert _restored(member["restored"]) == "step 41 from peer RAM, 0.21s"
    assert _restored(None) == "-"
    assert _restored({"rank": 0, "tier": "none", "step": None, "seconds": 0.01}) == \
        "nothing to restore, 0.01s"


def test_a_workload_that_reports_no_restore_is_not_scanned_for_one_forever(
        tmp_path: Path) -> None:
    clock = Clock()
    watch = ProgressWatch("node-a", clock)
    assert watch.restored(KEY, tmp_path) is None
    clock.now += RESTORE_WINDOW_SECONDS
    assert watch.restored(KEY, tmp_path) is None
    restore(tmp_path, 0, "disk", 5, 1.0)  # too late: looked for no more
    assert watch.restored(KEY, tmp_path) is None

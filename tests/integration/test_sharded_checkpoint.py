"""Sharded gang checkpoints with real member processes: a member SIGKILLed in the middle of
writing its shard leaves the step uncommitted, so every member of the restarted gang resumes
from the step before, then saves and loads the next one together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hafo
from hafo.checkpoint.format import list_checkpoints
from hafo.checkpoint.sharded import COMMIT, gang_dir_name, list_sharded_checkpoints

REPO = Path(hafo.__file__).resolve().parent.parent

# One gang member: load the newest checkpoint, save the given steps (its shard: 2 MiB that
# say which rank and step wrote them), load again. With "hang_at", the shard write of that
# step writes part of its data into a temp dir, reports its pid in a marker file and blocks,
# so the test can SIGKILL it in the middle of the save.
MEMBER = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
from hafo.checkpoint import sharded

cfg = json.loads(sys.argv[1])
if cfg.get("hang_at") is not None:
    real_write = sharded.write_checkpoint
    def write_then_hang(root, epoch, step, tree, blobs, ready=None):
        if step != cfg["hang_at"]:
            return real_write(root, epoch, step, tree, blobs, ready)
        tmp = root / ".tmp-interrupted"
        tmp.mkdir(parents=True)
        with open(tmp / "data.bin", "wb") as fh:
            fh.write(bytes(blobs[0])[: 1 << 20])
            os.fsync(fh.fileno())
        Path(cfg["marker"]).write_text(str(os.getpid()))
        time.sleep(300)
    sharded.write_checkpoint = write_then_hang

ck = sharded.ShardedCheckpointer(commit_timeout=cfg["commit_timeout"], handle_signal=False,
                                 poll_interval=0.02)

def emit(**fields):
    print(json.dumps({"rank": ck.rank, "epoch": ck.epoch, **fields}), flush=True)

def load():
    got = ck.load_latest()
    if got is None:
        emit(event="loaded", step=None)
        return
    w = got.state["w"]
    emit(event="loaded", step=got.step, from_epoch=got.epoch, rank_in_state=got.state["rank"],
         intact=bool((w == got.state["rank"] * 1000 + got.step).all()))

load()
for step in cfg["steps"]:
    ck.save({"rank": ck.rank, "w": np.full(1 << 18, ck.rank * 1000 + step, np.float64)}, step)
    emit(event="saved", step=step)
if cfg.get("reload"):
    load()
"""


class Gang:
    """Starts member processes and kills every one still running, by pid."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, rank: int, epoch: int, **cfg: Any) -> subprocess.Popen[str]:
        env = {**os.environ, "HAFO_CHECKPOINT_DIR": str(self.root), "HAFO_EPOCH": str(epoch),
               "RANK": str(rank), "WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}
        cfg.setdefault("commit_timeout", 30.0)
        proc = subprocess.Popen([sys.executable, "-c", MEMBER, json.dumps(cfg)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def members(tmp_path: Path) -> Iterator[Gang]:
    gang = Gang(tmp_path / "ck")
    try:
        yield gang
    finally:
        gang.kill_all()


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, list[dict[str, Any]],
                                                                      str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, [json.loads(line) for line in out.splitlines()], err


def test_member_killed_mid_save_leaves_the_previous_step_for_the_whole_gang(
        members: Gang, tmp_path: Path) -> None:
    root = members.root
    marker = tmp_path / "rank1-hangs"
    # epoch 1: both members save steps 10 and 20; in step 30 rank 1 dies writing its shard
    rank0 = members.start(0, epoch=1, steps=[10, 20, 30])
    rank1 = members.start(1, epoch=1, steps=[10, 20, 30], hang_at=30, marker=str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert rank1.poll() is None, rank1.communicate()[1]
        assert time.monotonic() < deadline, "rank 1 never reached step 30"
        time.sleep(0.05)
    assert int(marker.read_text()) == rank1.pid
    os.kill(rank1.pid, signal.SIGKILL)
    code1, lines1, _ = finish(rank1)
    assert code1 == -signal.SIGKILL
    assert [x["step"] for x in lines1 if x["event"] == "saved"] == [10, 20]
    # rank 0 wrote its shard of step 30 but never sees rank 1's: it does not commit, and its
    # save does not return; hafo then stops the whole gang
    partial = root / gang_dir_name(1, 30)
    deadline = time.monotonic() + 60
    while not list_checkpoints(partial / "rank-00000-of-00002"):
        assert rank0.poll() is None, rank0.communicate()[1]
        assert time.monotonic() < deadline, "rank 0 never wrote its shard of step 30"
        time.sleep(0.05)
    time.sleep(1.0)
    assert rank0.poll() is None and not (partial / COMMIT).exists()
    os.kill(rank0.pid, signal.SIGKILL)
    code0, lines0, _ = finish(rank0)
    assert code0 == -signal.SIGKILL
    assert [x["step"] for x in lines0 if x["event"] == "saved"] == [10, 20]
    assert (partial / "rank-00001-of-00002" / ".tmp-interrupted").is_dir()
    assert [r.step for r in list_sharded_checkpoints(root)] == [20, 10]

    # epoch 2, the restarted gang (fresh processes): both resume from step 20, save 40, and
    # both load 40
    new0 = members.start(0, epoch=2, steps=[40], reload=True)
    new1 = members.start(1, epoch=2, steps=[40], reload=True)
    for rank, proc in enumerate((new0, new1)):
        code, lines, err = finish(proc)
        assert code == 0, err
        loaded = [x for x in lines if x["event"] == "loaded"]
        assert [(x["step"], x["from_epoch"]) for x in loaded] == [(20, 1), (40, 2)]
        assert all(x["rank_in_state"] == rank and x["intact"] for x in loaded)
        assert [x["step"] for x in lines if x["event"] == "saved"] == [40]
    assert [(r.epoch, r.step) for r in list_sharded_checkpoints(root)] == [(2, 40), (1, 20),
                                                                           (1, 10)]
    assert not partial.exists()  # the partial step 30 was older than the newest commit

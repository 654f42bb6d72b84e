"""The guard of a warm gang member, as a real process over a real workload process that
speaks the warm protocol (``hafo.model.warm``) without torch: park, hand-over to the next
instance with the same process, the park that never comes, a parked member stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.fencefile import FENCE_FILE, write_deadline
from hafo.agent.instances import read_guard_state, write_json_atomic
from hafo.agent.warm_member import ask_handover, ask_park
from hafo.local.procs import kill_pid, pid_alive, wait_until
from hafo.model.cluster import InstanceEnd

pytestmark = pytest.mark.timeout(60)

# A member that parks when asked and takes the epoch it is handed; it prints one line per
# tick with its epoch, and ignores park requests when PARKS=0.
MEMBER = r"""
import json, os, sys, time
warm = os.environ["HAFO_WARM_DIR"]
epoch = int(os.environ["HAFO_EPOCH"])
parks = os.environ.get("PARKS", "1") == "1"
time.sleep(float(os.environ.get("START_DELAY", "0")))  # a slow start-up (imports, a model)
def read(name):
    try:
        with open(os.path.join(warm, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
while True:
    print(f"tick epoch={epoch} pid={os.getpid()}", flush=True)
    asked = read("park.json")
    if parks and asked and asked["epoch"] == epoch:
        tmp = os.path.join(warm, ".parked")
        with open(tmp, "w") as f:
            json.dump({"epoch": epoch, "pid": os.getpid(), "t": time.time()}, f)
        os.replace(tmp, os.path.join(warm, "parked.json"))
        while True:
            handed = read("epoch.json")
            if handed and handed["epoch"] > epoch:
                os.environ.update(handed["env"])
                epoch = handed["epoch"]
                print(f"resumed epoch={epoch} port={os.environ.get('MASTER_PORT')}", flush=True)
                break
            time.sleep(0.02)
    time.sleep(0.05)
"""


def launch(state_dir: Path, epoch: int, warm: Path, env: dict[str, str],
           grace: float = 5.0, env_epoch: int | None = None, standby: bool = False) -> Path:
    path = state_dir / "instances" / f"w.{epoch}"
    path.mkdir(parents=True)
    write_json_atomic(path / "launch.json", {
        "workload": "w", "epoch": epoch, "node": "n",
        "argv": [sys.executable, "-c", MEMBER],
        "env": {**os.environ, "HAFO_EPOCH": str(epoch), "HAFO_WARM_DIR": str(warm), **env},
        "cwd": str(state_dir), "grace": grace, "fence_file": str(state_dir / FENCE_FILE),
        "warm_dir": str(warm), **({"env_epoch": env_epoch} if env_epoch else {}),
        **({"standby": True} if standby else {})})
    return path


def start(tmp_path: Path, standby: bool = False,
          **env: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    state_dir = tmp_path / "state"
    warm = state_dir / "warm" / "w.7"
    warm.mkdir(parents=True)
    write_deadline(state_dir, time.monotonic() + 120)
    path = launch(state_dir, 7, warm, {"MASTER_PORT": "29501", **env}, standby=standby)
    guard = subprocess.Popen([sys.executable, "-m", "hafo", "guard", str(path)],
                             start_new_session=True)
    assert wait_until(lambda: (s := read_guard_state(path)) is not None and s.pid, 10)
    return guard, path, warm


def state_of(path: Path) -> Any:
    return read_guard_state(path)


def stop(guard: subprocess.Popen[bytes], pid: int | None) -> None:
    kill_pid(guard.pid)
    guard.wait(5)
    if pid:
        assert wait_until(lambda: not pid_alive(pid), 5)


def test_a_parked_member_is_handed_the_next_instance_with_the_same_process(
        tmp_path: Path) -> None:
    guard, old, warm = start(tmp_path)
    pid = state_of(old).pid
    try:
        ask_park(old)
        assert wait_until(lambda: state_of(old).state == "parked", 10)
        assert json.loads((warm / "parked.json").read_text())["pid"] == pid
        new = launch(tmp_path / "state", 9, warm, {"MASTER_PORT": "29777"}, env_epoch=7)
        ask_handover(old, new)
        assert wait_until(lambda: (s := state_of(new)) is not None and s.state == "running",
                          10)
        assert state_of(new).pid == pid and state_of(new).guard == state_of(old).guard
        ended = state_of(old)
        assert ended.state == "exited" and ended.ended is InstanceEnd.HANDED_OVER
        assert ended.exit_code is None and "handed over to instance 9" in ended.reason
        handed = json.loads((warm / "epoch.json").read_text())
        assert handed["epoch"] == 9
        assert handed["env"] == {"HAFO_EPOCH": "9", "MASTER_PORT": "29777"}
        # its output goes on in the new instance's directory
        assert wait_until(lambda: b"tick epoch=9" in (new / "output.log").read_bytes(), 10)
        assert b"resumed epoch=9 port=29777" in (new / "output.log").read_bytes()
        assert pid_alive(pid)
        # the new instance's guard stops it as any
        os.kill(guard.pid, signal.SIGTERM)
        assert guard.wait(20) == 0
        assert state_of(new).state == "exited" and not pid_alive(pid)
        assert not warm.exists(), "the warm directory goes with its process"
    finally:
        stop(guard, pid)


def test_a_member_that_does_not_park_is_stopped_at_once_after_the_wait(tmp_path: Path) -> None:
    guard, old, _warm = start(tmp_path, PARKS="0")
    pid = state_of(old).pid
    try:
        asked = time.monotonic()
        ask_park(old)
        assert wait_until(lambda: state_of(old).state == "exited", 20)
        took = time.monotonic() - asked
        assert 4.5 <= took < 15, f"stopped after {took:.1f}s (park wait 5 s, then SIGTERM)"
        assert not pid_alive(pid)
        assert state_of(old).ended is InstanceEnd.STOPPED
    finally:
        stop(guard, pid)


def test_a_standby_has_its_start_up_to_park_not_the_stop_grace(tmp_path: Path) -> None:
    """Its imports and model may take minutes on a busy node; no epoch waits on it."""
    guard, old, _warm = start(tmp_path, standby=True, START_DELAY="7")
    pid = state_of(old).pid
    try:
        assert wait_until(lambda: state_of(old).state == "parked", 20)
        assert pid_alive(pid) and state_of(old).pid == pid
    finally:
        stop(guard, pid)


def test_a_parked_member_that_is_stopped_gets_sigterm_at_once(tmp_path: Path) -> None:
    guard, old, _warm = start(tmp_path)
    pid = state_of(old).pid
    try:
        ask_park(old)
        assert wait_until(lambda: state_of(old).state == "parked", 10)
        asked = time.monotonic()
        os.kill(guard.pid, signal.SIGTERM)
        assert guard.wait(20) == 0
        assert time.monotonic() - asked < 3.0, "no checkpoint wait for a parked member"
        state = state_of(old)
        assert state.state == "exited" and state.exit_code == -signal.SIGTERM
        assert state.ended is InstanceEnd.STOPPED
    finally:
        stop(guard, pid)


@pytest.mark.parametrize("target", ["older-epoch", "other-warm-dir", "no-launch"])
def test_a_hand_over_to_a_launch_that_is_not_the_next_is_refused(
        tmp_path: Path, target: str) -> None:
    guard, old, warm = start(tmp_path)
    pid = state_of(old).pid
    try:
        ask_park(old)
        assert wait_until(lambda: state_of(old).state == "parked", 10)
        state_dir = tmp_path / "state"
        if target == "older-epoch":
            new = launch(state_dir, 5, warm, {})
        elif target == "other-warm-dir":
            other = state_dir / "warm" / "other"
            other.mkdir()
            new = launch(state_dir, 9, other, {})
        else:
            new = state_dir / "instances" / "w.9"
            new.mkdir()
        ask_handover(old, new)
        assert wait_until(lambda: not (old / "handover.json").exists(), 10)
        assert state_of(old).state == "parked" and pid_alive(pid)
        assert state_of(new) is None and not (warm / "epoch.json").exists()
    finally:
        stop(guard, pid)

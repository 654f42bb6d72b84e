"""The warm-survivor SDK (hafo.checkpoint.warm) with real processes and gloo on 127.0.0.1: the
test plays hafo's guard (park.json, epoch.json) for members that all-reduce in a loop and
append what they do to a JSON-lines file.

The rendezvous store of each epoch is the test's, listening on 127.0.0.1 (the one torch starts
on rank 0 listens on every interface); the members join it as torchelastic's agent store."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint.warm import ParkRequested, WarmEpoch, _wait_next_epoch
from hafo.model.warm import (
    EPOCH_FILE,
    PARK_FILE,
    PARKED_FILE,
    NextEpoch,
    ParkRequest,
    encode_next_epoch,
    encode_park,
    parse_parked,
)

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

# A member: all-reduces [1, stop?] every 20 ms until a rank sees the stop file; every start,
# step, error, park and the end go to the records file.
MEMBER = r'''
import faulthandler, json, logging, os, signal, sys, time
from datetime import timedelta

faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test's dump of a hang

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
import torch
import torch.distributed as dist
from hafo.checkpoint.warm import run

records, park_wait, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
stop = records + ".stop"
fd = os.open(records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def record(**fields):
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    os.write(fd, line.encode())


def train(w):
    record(event="start", epoch=w.epoch, rank=w.rank, world=w.world_size,
           generation=w.generation, probe=os.environ.get("WARM_PROBE"))
    step = 0
    try:
        while True:
            t = torch.tensor([1.0, 1.0 if os.path.exists(stop) else 0.0])
            dist.all_reduce(t)
            step += 1
            record(event="step", epoch=w.epoch, rank=w.rank, step=step, sum=t[0].item())
            if t[1].item() > 0:
                return step
            time.sleep(0.02)
    except Exception as exc:
        record(event="error", epoch=w.epoch, rank=w.rank, step=step,
               error=f"{type(exc).__name__}: {exc}"[:300])
        if os.environ.get("WARM_SWALLOW"):  # a loop that ends quietly on a failed collective
            return step
        raise


def parked(p):
    record(event="parked", epoch=p.epoch, parked_t=p.t)


try:
    steps = run(train, timeout=timedelta(seconds=timeout), park_wait=park_wait,
                on_park=parked)
except Exception as exc:
    record(event="raised", error=f"{type(exc).__name__}: {exc}"[:300])
    sys.stderr.flush()
    os._exit(3)
record(event="done", steps=steps)
sys.stderr.flush()
os._exit(0)
'''


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Gang:
    """The members started by a test (each killed by pid at the end) and their records."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.script = root / "member.py"
        self.script.write_text(MEMBER)
        self.records = root / "records.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stores: list[Any] = []

    def store(self) -> int:
        """A new rendezvous store on 127.0.0.1; its port."""
        import torch.distributed as dist

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = int(listener.getsockname()[1])
        # The store owns the descriptor from here on (it closes it when it goes).
        store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", port, is_master=True, wait_for_workers=False,
            master_listen_fd=listener.detach(), timeout=timedelta(seconds=30))
        self.stores.append(store)
        return port

    def start(self, name: str, *, rank: int, world: int, port: int, epoch: int = 1,
              warm: bool = True, park_wait: float = 10.0, timeout: float = 30.0,
              extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), HAFO_EPOCH=str(epoch), GLOO_SOCKET_IFNAME="lo",
                   TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                   OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **(extra or {}))
        if warm:
            self.warm_dir(name).mkdir(mode=0o700)
            env["HAFO_WARM_DIR"] = str(self.warm_dir(name))
        with open(self.root / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(self.script), str(self.records), str(park_wait),
                 str(timeout)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        """Every member returns from train at its next step."""
        (self.records.parent / (self.records.name + ".stop")).touch()

    def warm_dir(self, name: str) -> Path:
        return self.root / f"warm-{name}"

    def lines(self) -> list[dict[str, Any]]:
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines() if line]

    def of(self, name: str, event: str, **match: Any) -> list[dict[str, Any]]:
        pid = self.procs[name].pid
        return [r for r in self.lines() if r["pid"] == pid and r["event"] == event
                and all(r.get(k) == v for k, v in match.items())]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.root.glob("*.log")))

    def wait_for(self, what: str, ready: Callable[[], Any], timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = ready()
            if value:
                return value
            time.sleep(0.02)
        raise AssertionError(f"not within {timeout:g}s: {what}\n{self.logs()}")

    def parked(self, name: str) -> Any:
        path = self.warm_dir(name) / PARKED_FILE
        return parse_parked(path.read_text()) if path.exists() else None

    def exit_code(self, name: str, timeout: float = 10.0) -> int:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.procs[name].pid, signal.SIGUSR2)
            time.sleep(0.5)
            raise AssertionError(f"{name} still runs after {timeout:g}s\n{self.logs()}") from None

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        self.stores.clear()


@pytest.fixture
def gang(tmp_path: Path) -> Iterator[Gang]:
    members = Gang(tmp_path)
    try:
        yield members
    finally:
        members.kill_all()


@pytest.mark.timeout(60)
def test_survivors_park_and_join_the_next_epoch_in_the_same_process(gang: Gang) -> None:
    port = gang.store()
    for rank, name in enumerate("abc"):
        gang.start(name, rank=rank, world=3, port=port, extra={"WARM_PROBE": "old"})
    gang.wait_for("every member stepped", lambda: all(
        gang.of(name, "step", step=3) for name in "abc"), timeout=30)

    os.kill(gang.procs["a"].pid, signal.SIGKILL)  # rank 0
    # The survivors' collective fails before hafo asks (it does after a lease's TTL); one
    # that waits on the other survivor, not on a, may fail only once that one parks.
    gang.wait_for("a survivor's collective failed",
                  lambda: gang.of("b", "error") or gang.of("c", "error"))
    for name in "bc":
        write_atomic(gang.warm_dir(name) / PARK_FILE, encode_park(ParkRequest(1)))
    parked = {name: gang.wait_for(f"{name} parked", partial(gang.parked, name))
              for name in "bc"}
    for name in "bc":
        assert (parked[name].epoch, parked[name].pid) == (1, gang.procs[name].pid)
        assert gang.of(name, "parked", epoch=1)
        assert gang.procs[name].poll() is None

    # Not a hand-over: garbage, and an epoch not after the parked one.
    write_atomic(gang.warm_dir("b") / EPOCH_FILE, "{not json")
    write_atomic(gang.warm_dir("c") / EPOCH_FILE,
                 encode_next_epoch(NextEpoch(1, {"MASTER_PORT": str(port)})))
    time.sleep(0.3)
    assert not [r for r in gang.lines() if r["event"] == "start" and r["epoch"] == 2]
    assert gang.procs["b"].poll() is None and gang.procs["c"].poll() is None

    # Epoch 2, in a new store: b is rank 0 now, c rank 1, a fresh member rank 2.
    port2 = gang.store()
    gang.start("d", rank=2, world=3, port=port2, epoch=2)
    for rank, name in enumerate("bc"):
        env = {"HAFO_EPOCH": "2", "RANK": str(rank), "MASTER_PORT": str(port2),
               "WARM_PROBE": ""}
        write_atomic(gang.warm_dir(name) / EPOCH_FILE, encode_next_epoch(NextEpoch(2, env)))
    gang.wait_for("every member stepped in epoch 2", lambda: all(
        gang.of(name, "step", epoch=2, step=3) for name in "bcd"), timeout=30)

    starts = {name: gang.of(name, "start", epoch=2)[0] for name in "bcd"}
    assert {n: (s["rank"], s["world"], s["generation"]) for n, s in starts.items()} == {
        "b": (0, 3, 1), "c": (1, 3, 1), "d": (2, 3, 0)}
    assert starts["b"]["probe"] is None and starts["c"]["probe"] is None  # "" unsets
    assert all(r["sum"] == 3.0 for r in gang.lines() if r["event"] == "step")

    gang.stop()
    for name in "bcd":
        assert gang.exit_code(name) == 0
        assert gang.of(name, "done")


@pytest.mark.timeout(60)
def test_a_park_request_unblocks_a_collective_stuck_on_a_stopped_peer(gang: Gang) -> None:
    port = gang.store()
    gang.start("a", rank=0, world=2, port=port, park_wait=1.0)
    # b's group times out sooner: resumed, gloo may not see that a closed the connection
    # while b was stopped (a stopped member then waits out its collective's timeout).
    gang.start("b", rank=1, world=2, port=port, park_wait=1.0, timeout=3.0)
    gang.wait_for("both stepped", lambda: gang.of("a", "step", step=3)
                  and gang.of("b", "step", step=3), timeout=30)

    os.kill(gang.procs["b"].pid, signal.SIGSTOP)
    time.sleep(0.3)  # a waits in its all-reduce: no error, the group's timeout is 30 s
    assert not gang.of("a", "error")
    asked = time.monotonic()
    write_atomic(gang.warm_dir("a") / PARK_FILE, encode_park(ParkRequest(1)))
    parked = gang.wait_for("a parked", lambda: gang.parked("a"), timeout=10)
    took = time.monotonic() - asked
    assert took < 2.0, f"parking took {took:.2f}s"
    assert (parked.epoch, parked.pid) == (1, gang.procs["a"].pid)
    assert "closed" in gang.of("a", "error")[0]["error"]  # its links were shut down

    # A parked process is not handed over: hafo's guard ends it, with SIGTERM.
    os.kill(gang.procs["a"].pid, signal.SIGTERM)
    assert gang.exit_code("a", timeout=5) == -signal.SIGTERM

    # b goes on: its collective fails (at once, or at its timeout), no park request comes
    # within park_wait: it exits 3.
    os.kill(gang.procs["b"].pid, signal.SIGCONT)
    assert gang.exit_code("b") == 3
    assert gang.of("b", "error") and gang.of("b", "raised")
    assert not (gang.warm_dir("b") / PARKED_FILE).exists()


@pytest.mark.timeout(60)
def test_a_train_that_returns_after_its_group_was_aborted_parks(gang: Gang) -> None:
    """Its value may rest on collectives that never completed (NCCL's abort fails none):
    no result, it parks as asked instead of ending the process."""
    port = gang.store()
    gang.start("a", rank=0, world=2, port=port, extra={"WARM_SWALLOW": "1"})
    gang.start("b", rank=1, world=2, port=port, timeout=3.0)
    gang.wait_for("both stepped", lambda: gang.of("a", "step", step=3)
                  and gang.of("b", "step", step=3), timeout=30)
    os.kill(gang.procs["b"].pid, signal.SIGSTOP)
    try:
        write_atomic(gang.warm_dir("a") / PARK_FILE, encode_park(ParkRequest(1)))
        parked = gang.wait_for("a parked", lambda: gang.parked("a"), timeout=10)
        assert (parked.epoch, parked.pid) == (1, gang.procs["a"].pid)
        assert gang.of("a", "error") and not gang.of("a", "done")
        assert gang.procs["a"].poll() is None
    finally:
        os.kill(gang.procs["b"].pid, signal.SIGCONT)


@pytest.mark.timeout(60)
def test_without_a_warm_dir_train_runs_once(gang: Gang) -> None:
    gang.stop()
    gang.start("a", rank=0, world=1, port=gang.store(), epoch=7, warm=False)
    assert gang.exit_code("a", timeout=30) == 0
    [start] = gang.of("a", "start")
    assert (start["epoch"], start["rank"], start["world"], start["generation"]) == (7, 0, 1, 0)
    assert gang.of("a", "done", steps=1)


def test_check_raises_once_a_park_is_requested() -> None:
    park = threading.Event()
    current = WarmEpoch(epoch=3, rank=1, world_size=2, generation=1, _park=park)
    current.check()
    assert current.warm and not current.parking
    park.set()
    assert current.parking
    with pytest.raises(ParkRequested, match="epoch 3"):
        current.check()


@pytest.mark.timeout(10)
def test_only_a_valid_later_epoch_is_a_hand_over(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE
    got: list[NextEpoch] = []
    waiter = threading.Thread(target=lambda: got.append(_wait_next_epoch(path, 4)),
                              daemon=True)
    waiter.start()
    for text in ("garbage", encode_next_epoch(NextEpoch(4, {})),
                 json.dumps({"epoch": 5, "env": {"CUDA_VISIBLE_DEVICES": "1"}})):
        write_atomic(path, text)
        time.sleep(0.1)
        assert not got
    write_atomic(path, encode_next_epoch(NextEpoch(5, {"RANK": "1"})))
    waiter.join(5)
    assert got == [NextEpoch(5, {"RANK": "1"})]

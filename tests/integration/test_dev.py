"""`hafo dev` as an operator runs it: a subprocess that stays up, the CLI pointed at it through
the export line it prints, its power and fault controls, and a stop on SIGINT or SIGTERM that
leaves no process (checked by pid) and no temporary directory behind."""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hafo.local.procs import descendants, kill_pid, pid_alive

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 150.0   # two loaded CPU cores start etcd, 2 controllers and the agents slowly
STOP_TIMEOUT = 30.0


def clean_env() -> dict[str, str]:
    """This process's environment without any HAFO_ variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}


def hafo(*args: str, env: dict[str, str] | None = None,
         timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run the hafo CLI (this Python) and capture its output."""
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True, text=True,
                          timeout=timeout, env=env if env is not None else clean_env(),
                          cwd=ROOT)


class DevProcess:
    """A `hafo dev` subprocess in its own process group, its output collected line by line.
    ``kill`` SIGKILLs it and every descendant it ever had (seen by ``track``), by pid."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hafo", "dev", *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=env if env is not None else clean_env(),
            cwd=ROOT, start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.seen: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    @property
    def output(self) -> str:
        """Everything it printed so far."""
        return "\n".join(self.lines)

    def wait_for(self, match: Callable[[str], bool], timeout: float) -> str:
        """The first line (from now on) for which ``match`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such line within {timeout}s:\n{self.output}")
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"hafo dev exited ({self.proc.poll()}):\n{self.output}")
            if match(line):
                return line

    def ready(self) -> dict[str, str]:
        """Wait for the export line; the environment it gives (on top of a clean one)."""
        line = self.wait_for(lambda s: s.strip().startswith("export HAFO_ETCD="),
                             READY_TIMEOUT)
        words = shlex.split(line.strip())[1:]
        exported = dict(word.split("=", 1) for word in words)
        assert set(exported) == {"HAFO_ETCD", "HAFO_CLUSTER", "HAFO_DEV"}, line
        self.wait_for(lambda s: s.startswith("Ctrl-C stops everything"), 10)
        self.track()
        return {**clean_env(), **exported}

    def track(self) -> list[int]:
        """Every live descendant now (remembered for ``kill``)."""
        pids = descendants(self.proc.pid)
        self.seen.update(pids)
        return pids

    def stop(self, *signals: signal.Signals, gap: float = 0.3) -> int:
        """Send the signals (``gap`` apart) and wait for the exit code."""
        for i, sig in enumerate(signals):
            if i:
                time.sleep(gap)
            kill_pid(self.proc.pid, sig)
        return self.proc.wait(STOP_TIMEOUT)

    def kill(self) -> None:
        """SIGKILL it and every descendant seen, by pid (clean-up whatever happened)."""
        if self.proc.poll() is None:
            self.track()
        for pid in sorted(self.seen):
            kill_pid(pid, signal.SIGKILL)
        kill_pid(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def dev_processes() -> Iterator[list[DevProcess]]:
    """`hafo dev` processes of the test, killed by pid at the end whatever happens."""
    started: list[DevProcess] = []
    try:
        yield started
    finally:
        for dev in started:
            dev.kill()


def nodes(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """`hafo nodes --json`, by name."""
    done = hafo("nodes", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {n["name"]: n for n in json.loads(done.stdout)}


def wait_nodes(env: dict[str, str], predicate: Callable[[dict[str, dict[str, Any]]], bool],
               timeout: float, what: str) -> dict[str, dict[str, Any]]:
    """Poll `hafo nodes --json` until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        current = nodes(env)
        if predicate(current):
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {current}")
        time.sleep(0.5)


def assert_all_gone(pids: set[int]) -> None:
    """Every pid has exited (a recycled pid would have to be a new, unrelated process)."""
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)], "processes left behind"


def test_dev_cluster_serves_the_cli_and_leaves_nothing_after_ctrl_c(
        dev_processes: list[DevProcess]) -> None:
    dev = DevProcess("--nodes", "2", "--gpus", "2")
    dev_processes.append(dev)
    env = dev.ready()
    base = Path(env["HAFO_DEV"])
    assert base.is_dir() and (base / "control.sock").exists()
    assert "dashboard: http://127.0.0.1:" in dev.output and "nodes:     node-1 node-2" in dev.output

    status = hafo("status", env=env)
    assert status.returncode == 0, status.stderr
    assert {n["state"] for n in nodes(env).values()} == {"ready"}

    # a GPU fault shows in `hafo nodes`
    done = hafo("dev", "fault", "node-1", "--gpu", "1", "--xid", "79", env=env)
    assert done.returncode == 0 and "node-1 GPU 1: Xid 79" in done.stdout, done.stderr
    wait_nodes(env, lambda ns: not ns["node-1"]["gpus"][1]["healthy"]
               and ns["node-1"]["gpus"][0]["healthy"], 30, "GPU 1 of node-1 unhealthy")
    done = hafo("dev", "fault", "node-1", "--gpu", "1", "--clear", env=env)
    assert done.returncode == 0, done.stderr

    # power off: the node goes down; power on: ready again (with a new agent pid)
    before = json.loads(hafo("dev", "status", "--json", env=env).stdout)
    old_pid = next(n["agent_pid"] for n in before["nodes"] if n["name"] == "node-2")
    done = hafo("dev", "power-off", "node-2", env=env)
    assert done.returncode == 0 and "node-2 powered off" in done.stdout, done.stderr
    assert not pid_alive(old_pid)
    wait_nodes(env, lambda ns: ns["node-2"]["state"] == "down", 30, "node-2 down")
    off = json.loads(hafo("dev", "status", "--json", env=env).stdout)
    assert [n["powered"] for n in off["nodes"]] == [True, False]
    done = hafo("dev", "power-on", "node-2", env=env)
    assert done.returncode == 0 and "node-2 powered on" in done.stdout, done.stderr
    wait_nodes(env, lambda ns: ns["node-2"]["state"] == "ready"
               and ns["node-1"]["gpus"][1]["healthy"], 60, "node-2 ready again")
    text = hafo("dev", "status", env=env)
    assert text.returncode == 0 and "node-2" in text.stdout and " on " in text.stdout

    # errors: unknown node (4, naming the nodes), GPU out of range (2)
    done = hafo("dev", "power-off", "node-9", env=env)
    assert done.returncode == 4
    assert done.stderr.strip().splitlines() == [
        "hafo dev power-off: no node 'node-9' in this dev cluster (nodes: node-1, node-2)"]
    done = hafo("dev", "fault", "node-1", "--gpu", "2", "--lost", env=env)
    assert done.returncode == 2 and "--gpu" in done.stderr, done.stderr

    pids = set(dev.track())
    assert len(pids) >= 6  # etcd, 2 controllers, 2 node inits and their agents
    started = time.monotonic()
    assert dev.stop(signal.SIGINT) == 0, dev.output
    took = time.monotonic() - started
    assert "every process is gone" in dev.output
    assert_all_gone(pids)
    assert not base.exists()
    assert took < STOP_TIMEOUT


@pytest.mark.parametrize("signals, keep", [((signal.SIGTERM,), True),
                                           ((signal.SIGINT, signal.SIGINT), False)],
                         ids=["sigterm-with-dir", "double-ctrl-c"])
def test_dev_cluster_stops_cleanly(dev_processes: list[DevProcess], tmp_path: Path,
                                   signals: tuple[signal.Signals, ...], keep: bool) -> None:
    args = ["--nodes", "1", "--gpus", "1", "--cluster", "other"]
    if keep:
        args += ["--dir", str(tmp_path / "dev")]
    dev = DevProcess(*args)
    dev_processes.append(dev)
    env = dev.ready()
    assert env["HAFO_CLUSTER"] == "other"
    base = Path(env["HAFO_DEV"])
    assert (base == (tmp_path / "dev").resolve()) is keep
    pids = set(dev.track())
    assert pids
    assert dev.stop(*signals) == 0, dev.output
    assert_all_gone(pids)
    if keep:  # state and logs stay, the control socket goes
        assert (base / "logs").is_dir() and not (base / "control.sock").exists()
    else:
        assert not base.exists()
    done = hafo("dev", "status", env=env)
    assert done.returncode == 3 and "$HAFO_DEV" in done.stderr, done.stderr


def test_dev_commands_without_a_dev_cluster(tmp_path: Path) -> None:
    done = hafo("dev", "power-off", "node-1")
    assert done.returncode == 3
    assert "$HAFO_DEV is not set" in done.stderr and len(done.stderr.splitlines()) == 1
    env = {**clean_env(), "HAFO_DEV": str(tmp_path)}
    done = hafo("dev", "status", env=env)
    assert done.returncode == 3 and f"$HAFO_DEV={tmp_path}" in done.stderr, done.stderr
    for bad, field in ((["--nodes", "0"], "--nodes"), (["--gpus", "x"], "--gpus"),
                       (["--cluster", "Bad_Name"], "--cluster"),
                       (["fault", "node-1", "--gpu", "0"], "--xid"),
                       (["--nodes", "2", "status"], "--nodes")):
        done = hafo("dev", *bad, env=env)
        assert done.returncode == 2 and field in done.stderr, (bad, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

"""Processes started by the local cluster: spawn, wait, and stop them by pid, never by name."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hafo.agent import cgroups
from hafo.agent.proctree import children_map, descendants, pid_alive

__all__ = ["children_map", "descendants", "free_port", "kill_pid", "node_cgroups", "ns_pids",
           "pid_alive", "remove_cgroup_tree", "spawn", "stop_process", "wait_until"]


_HANDED_OUT: set[int] = set()
LOWEST_PORT = 20000


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (32768 if unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Where the agents take a replica's port 0 from by default (``node.ports``): not handed out.
NODE_PORTS_FIRST = 30000


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """The part of ``low..high`` of this pytest-xdist worker (all of it outside one): test
    processes that run side by side never hand out the same port (each knows only its own)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return low, high
    index, workers = int(worker[2:]), max(1, int(count))
    if index >= workers:
        return low, high
    span = (high - low + 1) // workers
    return low + index * span, low + (index + 1) * span - 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a server started a moment later.

    Taken at random below the kernel's ephemeral range and below the agents' default
    ``node.ports`` range, never twice in this process, and under pytest-xdist from this
    worker's slice only: a port the kernel picks (bind to port 0) comes from the range that
    outgoing connections use too, so one of them (a test's HTTP client, a browser) could take
    it before the server binds it, and a worker beside this one could hand out the same port
    (a test that failed with "address already in use").
    """
    low, high = LOWEST_PORT, min(_ephemeral_low(), NODE_PORTS_FIRST) - 1
    if high - low < 1000:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    sliced = _worker_slice(low, high)
    if sliced[1] - sliced[0] >= 200:
        low, high = sliced
    tries = 0
    while True:
        tries += 1
        if tries % 1000 == 0:  # most of the range handed out already: the oldest are long gone
            _HANDED_OUT.clear()
        port = random.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own session, stdout/stderr to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env) if env else None,
                                cwd=cwd, start_new_session=True)


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, wait ``grace`` seconds, then SIGKILL; always reaps."""
    if proc.poll() is None:
        kill_pid(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill_pid(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_until(predicate: object, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]




def ns_pids(pid: int) -> list[int]:
    """``pid``'s number in each PID namespace it is in, outermost (ours) first (``NSpid``)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(n) for n in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def node_cgroups(name: str) -> Path | None:
    """A cgroup (v2) under this process's own, to hold the simulated nodes' cgroups, or None
    where none can be made (not root, no cgroup v2): nodes then share the host's, and their
    PID space (hafo.local.nodeinit)."""
    if os.geteuid() != 0:
        return None
    try:
        mount = cgroups.cgroup2_mount(Path("/proc/self/mountinfo").read_text())
        own = cgroups.own_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    if mount is None or own is None:
        return None
    path = mount / own.lstrip("/") / f"hafo-local.{name}"
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path


def remove_cgroup_tree(path: Path) -> None:
    """Kill what is left in a cgroup and below it, and remove them all, deepest first."""
    if not path.is_dir():
        return
    cgroups.kill(path)
    for sub in sorted((p for p in path.rglob("*") if (p / "cgroup.procs").exists()),
                      key=lambda p: len(p.parts), reverse=True):
        cgroups.remove(sub)
    cgroups.remove(path)

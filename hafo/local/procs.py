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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a server started a moment later.

    Taken at random below the kernel's ephemeral range and never twice in this process:
    a port the kernel picks (bind to port 0) comes from the range that outgoing connections
    use too, so one of them (a test's HTTP client, a browser) could take it before the server
    binds it.
    """
    low, high = LOWEST_PORT, _ephemeral_low() - 1
    if high - low < 1000:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    while True:
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

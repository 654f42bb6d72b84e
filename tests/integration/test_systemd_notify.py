"""sd_notify from the real daemons: READY once serving, watchdog pings from the event loop
(which stop while the process is frozen), STOPPING on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hafo.local.etcd import EtcdCluster
from hafo.local.procs import free_port, wait_until
from hafo.store import Keys

pytestmark = pytest.mark.timeout(90)


def receive(sock: socket.socket, seconds: float) -> list[str]:
    """Every datagram within ``seconds``."""
    out: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            out.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return out


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP delivered): state T in /proc/<pid>/stat."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def wait_for(sock: socket.socket, needle: str, seconds: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen += receive(sock, 0.2)
        if any(needle in m for m in seen):
            return seen
    raise AssertionError(f"no {needle!r} within {seconds}s; got {seen}")


@pytest.mark.parametrize("role", ["controller", "agent"])
def test_daemon_notifies_systemd(role: str, tmp_path: Path, etcd_server: EtcdCluster,
                                 keys: Keys) -> None:
    config: dict[str, Any] = {"cluster": keys.cluster,
                              "etcd": {"endpoints": etcd_server.endpoints},
                              "api": {"listen": f"127.0.0.1:{free_port()}"},
                              "checkpoint": {"root": str(tmp_path / "ck")},
                              "log": {"format": "json"}}
    if role == "controller":
        config["controller"] = {"name": "ctl-notify"}
    else:
        config["node"] = {"name": "node-notify", "state_dir": str(tmp_path / "state"),
                          "gpus": {"simulate": {"count": 1}}}
    path = tmp_path / f"{role}.yaml"
    path.write_text(yaml.safe_dump(config))
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    env = {**os.environ, "NOTIFY_SOCKET": address, "WATCHDOG_USEC": "600000"}
    env.pop("WATCHDOG_PID", None)
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "hafo", role, "--config", str(path)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_for(sock, "READY=1", 30)
        message = next(m for m in ready if "READY=1" in m)
        assert f"MAINPID={proc.pid}" in message and "STATUS=" in message
        pings = [m for m in receive(sock, 1.5) if m == "WATCHDOG=1"]
        assert len(pings) >= 2  # every 0.3 s (a loaded CI machine may delay one)
        os.kill(proc.pid, signal.SIGSTOP)  # a stuck daemon sends nothing
        try:
            assert wait_until(lambda: stopped(proc.pid), 5), "SIGSTOP not delivered"
            receive(sock, 0.1)  # drop what was in flight
            assert receive(sock, 1.0) == []  # on purpose: a second in which nothing may come
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        wait_for(sock, "WATCHDOG=1", 5)
        proc.send_signal(signal.SIGTERM)
        wait_for(sock, "STOPPING=1", 20)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        sock.close()

"""``hafo logs`` and the agents' output logs on a real local cluster: following a workload
across a power-loss failover, ``--all`` with headers, the size cap of a workload that spews
100 MiB, and the guard's stderr tail."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hafo.agent.fencefile import FENCE_FILE, write_deadline
from hafo.agent.instances import read_guard_state, write_json_atomic
from hafo.local.cluster import LocalCluster
from hafo.local.procs import kill_pid, wait_until
from hafo.model.views import workload_view
from tests.integration.conftest import ClusterFactory
from tests.integration.helpers import running

pytestmark = pytest.mark.timeout(150)

PRINTER = ("import os, time\n"
           "epoch = os.environ['HAFO_EPOCH']\n"
           "i = 0\n"
           "while True:\n"
           "    print(f'epoch={epoch} n={i}', flush=True)\n"
           "    i += 1\n"
           "    time.sleep(0.05)\n")
LINE = re.compile(r"epoch=(\d+) n=(\d+)")
MARKER = re.compile(r"==> output continues on (\S+), epoch (\d+) <==")


def cli_env(cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints),
            "HAFO_CLUSTER": cluster.cluster}


def hafo_logs(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hafo", "logs", *args], env=cli_env(cluster),
                          capture_output=True, text=True, timeout=60)


def numbered(lines: list[str]) -> list[tuple[int, int]]:
    out = []
    for line in lines:
        match = LINE.fullmatch(line)
        assert match, f"unexpected line {line!r}"
        out.append((int(match.group(1)), int(match.group(2))))
    return out


def assert_one_run(pairs: list[tuple[int, int]], epoch: int) -> None:
    """Lines of one instance: all of ``epoch``, numbered 0, 1, 2... without a gap."""
    assert pairs, f"no lines of epoch {epoch}"
    assert {e for e, _ in pairs} == {epoch}
    assert [n for _, n in pairs] == list(range(len(pairs)))


async def test_follow_across_power_loss_then_all_epochs(local_cluster: ClusterFactory,
                                                        tmp_path: Path) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    wid = await cluster.submit({"name": "printer", "gpus": 1,
                                "command": [sys.executable, "-u", "-c", PRINTER]})
    snapshot = await cluster.wait_for(running(wid), 30, what="running")
    first = workload_view(snapshot, wid)
    out_path = tmp_path / "follow.out"
    with open(out_path, "wb") as out, open(tmp_path / "follow.err", "wb") as err:
        follower = subprocess.Popen([sys.executable, "-m", "hafo", "logs", wid, "-f"],
                                    env=cli_env(cluster), stdout=out, stderr=err,
                                    start_new_session=True)
    try:
        assert wait_until(lambda: out_path.read_bytes().count(b"\n") >= 10, 20), \
            (tmp_path / "follow.err").read_text()
        cluster.power_off(first["node"])
        snapshot = await cluster.wait_for(running(wid, not_on=first["node"]), 40,
                                          what="failover")
        second = workload_view(snapshot, wid)
        assert second["epoch"] > first["epoch"]

        def continued() -> bool:
            text = out_path.read_text()
            return "==> output continues" in text and \
                text.split("==> output continues", 1)[1].count("\n") >= 10
        assert wait_until(continued, 30), (tmp_path / "follow.err").read_text()
    finally:
        kill_pid(follower.pid, signal.SIGTERM)
        code = follower.wait(10)
    assert code == 0
    lines = out_path.read_text().splitlines()
    markers = [i for i, line in enumerate(lines) if line.startswith("==>")]
    assert len(markers) == 1, lines
    marker = MARKER.fullmatch(lines[markers[0]])
    assert marker and (marker.group(1), int(marker.group(2))) == (second["node"],
                                                                  second["epoch"])
    assert_one_run(numbered(lines[:markers[0]]), first["epoch"])
    # after the marker: the new epoch only, from its first line (nothing of the fenced one)
    assert_one_run(numbered(lines[markers[0] + 1:]), second["epoch"])

    # --all while the first node is off: it is reported, the rest is printed
    result = hafo_logs(cluster, wid, "--all", "--tail", "3")
    assert result.returncode == 0, result.stderr
    assert f"skipped {first['node']}" in result.stderr
    out = result.stdout.splitlines()
    assert out[0] == f"==> {second['node']}, epoch {second['epoch']} (running) <=="
    assert len(out) == 4 and {e for e, _ in numbered(out[1:])} == {second["epoch"]}

    # powered on again, the first node keeps the first epoch's output: both, oldest first
    cluster.start_node(first["node"])
    await cluster.wait_ready(45)
    result = hafo_logs(cluster, wid, "--all")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    headers = [i for i, line in enumerate(out) if line.startswith("==>")]
    assert [out[i] for i in headers] == [
        f"==> {first['node']}, epoch {first['epoch']} <==",
        f"==> {second['node']}, epoch {second['epoch']} (running) <=="]
    assert_one_run(numbered(out[1:headers[1]]), first["epoch"])
    assert_one_run(numbered(out[headers[1] + 1:]), second["epoch"])
    # without flags: the current instance; --epoch: that one, wherever it is kept
    result = hafo_logs(cluster, wid, "--tail", "1")
    assert result.returncode == 0 and numbered(result.stdout.splitlines())[0][0] \
        == second["epoch"]
    result = hafo_logs(cluster, wid, "--epoch", str(first["epoch"]))
    assert_one_run(numbered(result.stdout.splitlines()), first["epoch"])
    result = hafo_logs(cluster, "no-such-thing")
    assert result.returncode == 4 and result.stderr.count("\n") == 1


async def start_with_logs_cap(factory: ClusterFactory, **logs: Any) -> LocalCluster:
    """One node whose config sets ``node.logs``, one controller."""
    cluster = LocalCluster(base_dir=factory.base / f"c{len(factory.clusters)}", nodes=0,
                           controllers=1)
    factory.clusters.append(cluster)
    cluster.start()
    handle = cluster.add_node("node-1")
    config = yaml.safe_load(handle.config_path.read_text())
    config["node"]["logs"] = logs
    handle.config_path.write_text(yaml.safe_dump(config))
    cluster.start_node("node-1")
    await cluster.wait_ready(45)
    return cluster


SPEW = ("import sys\n"
        "block = (b'x' * 1023 + b'\\n') * 64\n"
        "for _ in range(1600):\n"
        "    sys.stdout.buffer.write(block)\n"
        "sys.stdout.flush()\n"
        "print('spewed 100 MiB', file=sys.stderr)\n")


def output_bytes(state_dir: Path, wid: str) -> int:
    """The bytes of the workload's output kept on the node, in its instance directories and
    in ``logs/``. The agent moves an ended instance's output into ``logs/`` while this reads:
    a listing is taken again until two agree (a directory gone meanwhile is skipped)."""
    last = -1
    for _ in range(10):
        total = _output_bytes_once(state_dir, wid)
        if total == last:
            break
        last = total
    return total


def _output_bytes_once(state_dir: Path, wid: str) -> int:
    total = 0
    for root in (state_dir / "instances", state_dir / "logs"):
        for directory, _dirs, files in os.walk(root):  # errors (a directory gone) skipped
            for name in files:
                path = Path(directory) / name
                if wid in str(path) and ".log" in name and not name.endswith(".meta") \
                        and name != "guard.log":
                    with contextlib.suppress(OSError):
                        total += path.stat().st_size
    return total


async def test_a_workload_spewing_100_mib_stays_under_the_cap(
        local_cluster: ClusterFactory) -> None:
    cluster = await start_with_logs_cap(local_cluster, max_mib=4, keep_epochs=1)
    state_dir = cluster.node_handles["node-1"].state_dir
    started = time.monotonic()
    wid = await cluster.submit({"name": "spew", "gpus": 1, "restart": {"max_restarts": 0},
                                "command": [sys.executable, "-c", SPEW]})
    most = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        most = max(most, output_bytes(state_dir, wid))
        assignment = (await cluster.snapshot()).assignments.get(wid)
        if assignment is not None and assignment.phase in ("completed", "failed"):
            break
        await asyncio.sleep(0.02)
    view = workload_view(await cluster.snapshot(), wid)
    assert view["state"] == "completed", view
    took = time.monotonic() - started
    assert most <= 4 * 1024 * 1024, most
    assert 2 * 1024 * 1024 <= output_bytes(state_dir, wid) <= 4 * 1024 * 1024
    result = hafo_logs(cluster, wid, "--tail", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "spewed 100 MiB" in lines[-1] and lines[-2] == "x" * 1023
    assert "completed" in result.stderr
    print(f"100 MiB spewed and completed in {took:.1f}s; most on disk {most} bytes")


def test_guard_records_the_stderr_tail_and_keeps_both_streams(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    path = state_dir / "instances" / "w-abc123.7"
    path.mkdir(parents=True)
    write_deadline(state_dir, time.monotonic() + 60)
    script = ("import sys\n"
              "for i in range(30):\n"
              "    print(f'out {i}', flush=True)\n"
              "    print(f'err {i}', file=sys.stderr, flush=True)\n"
              "sys.exit(3)\n")
    write_json_atomic(path / "launch.json", {
        "workload": "w-abc123", "epoch": 7, "node": "n",
        "argv": [sys.executable, "-c", script], "env": dict(os.environ), "cwd": str(tmp_path),
        "grace": 5.0, "fence_file": str(state_dir / FENCE_FILE), "output_max_bytes": 1 << 20})
    guard = subprocess.run([sys.executable, "-m", "hafo", "guard", str(path)], timeout=30)
    assert guard.returncode == 0
    state = read_guard_state(path)
    assert state is not None and state.exit_code == 3
    import json

    tail = json.loads((path / "state.json").read_text())["stderr_tail"]
    assert tail.splitlines() == [f"err {i}" for i in range(10, 30)]
    output = (path / "output.log").read_text().splitlines()
    assert sorted(output) == sorted([f"out {i}" for i in range(30)]
                                    + [f"err {i}" for i in range(30)])
    assert [line for line in output if line.startswith("out")] == \
        [f"out {i}" for i in range(30)]

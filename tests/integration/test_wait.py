"""``hafo submit|drain|migrate --wait`` end to end on a local cluster: the CLI runs as a
subprocess (stderr a pipe: plain lines; or a pseudo-terminal: the live display), and its exit
code and final line are checked against the cluster's state."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view
from tests.integration.helpers import started_cluster

pytestmark = pytest.mark.timeout(120)

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
FINAL = r"after \d+\.\d s"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from started_cluster(tmp_path_factory.mktemp("wait"), nodes=3, controllers=1)


def env_of(cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints)}


def hafo(cluster: LocalCluster, *args: str,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True, text=True,
                          env=env_of(cluster), timeout=timeout)


def spec_file(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def on_cluster(cluster: LocalCluster, body: Callable[[], Any]) -> Any:
    """Run an async cluster call in a fresh loop, closing its store client after."""
    async def run() -> Any:
        try:
            return await body()
        finally:
            await cluster.close_store()
    return asyncio.run(run())


def snapshot(cluster: LocalCluster) -> ClusterSnapshot:
    return on_cluster(cluster, cluster.snapshot)  # type: ignore[no-any-return]


def running_on(cluster: LocalCluster, wid: str) -> tuple[str, int]:
    """(node, epoch) of a workload the cluster reports running."""
    view = workload_view(snapshot(cluster), wid)
    assert view["state"] == "running", view
    assert view["node"] is not None and view["epoch"] is not None
    return view["node"], view["epoch"]


def submit_running(cluster: LocalCluster, name: str) -> tuple[str, str]:
    """Submit the built-in workload and wait until it runs: (id, node)."""
    def check(s: ClusterSnapshot) -> bool:
        return any(workload_view(s, w)["state"] == "running" for w in s.by_name.get(name, ()))

    async def body() -> str:
        wid = await cluster.submit(demo_workload_spec(name=name))
        await cluster.wait_for(check, 30, what=f"{name} running")
        return wid

    wid = on_cluster(cluster, body)
    return wid, running_on(cluster, wid)[0]


def delete(cluster: LocalCluster, *wids: str) -> None:
    for wid in wids:
        assert hafo(cluster, "delete", wid).returncode == 0


def lines(stderr: str) -> list[str]:
    assert not CONTROL.search(stderr), f"control characters in plain output: {stderr!r}"
    return stderr.splitlines()


def test_submit_wait_until_running(cluster: LocalCluster, tmp_path: Path) -> None:
    path = spec_file(tmp_path, demo_workload_spec(name="wait-run"))
    started = time.monotonic()
    done = hafo(cluster, "submit", path, "--wait", "--timeout", "60")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    wid = done.stdout.strip()
    assert wid.startswith("wait-run-")
    node, epoch = running_on(cluster, wid)
    out = lines(done.stderr)
    assert re.fullmatch(rf"{wid}: running on {node} \(epoch {epoch}\) {FINAL}", out[-1]), out
    assert all(re.match(r" *\d+\.\ds  \S", line) for line in out[:-1]), out
    print(f"submit --wait: exit 0 after {took:.2f} s (CLI start included); lines: {out}")
    again = hafo(cluster, "submit", path, "--wait", "--json")  # unchanged: done at once
    assert again.returncode == 0, again.stderr
    body = json.loads(again.stdout)
    assert body["id"] == wid and body["change"] == "unchanged"
    assert body["outcome"]["result"] == "done" and body["outcome"]["node"] == node
    assert body["outcome"]["epoch"] == epoch
    assert body["outcome"]["message"] == f"running on {node} (epoch {epoch})"
    delete(cluster, wid)


def test_submit_wait_times_out_while_pending(cluster: LocalCluster, tmp_path: Path) -> None:
    path = spec_file(tmp_path, demo_workload_spec(name="wait-big", gpus=8))
    done = hafo(cluster, "submit", path, "--wait", "--timeout", "3")
    assert done.returncode == 6, done.stderr
    out = lines(done.stderr)
    assert any("pending: " in line for line in out[:-1]), out
    assert re.fullmatch(r"wait-big-\w+: timed out after 3\.\d s: pending: .+; the workload "
                        r"stays submitted", out[-1]), out
    wid = done.stdout.strip()
    assert workload_view(snapshot(cluster), wid)["state"] == "pending"  # it stays
    delete(cluster, wid)


def test_submit_wait_reports_a_failed_workload(cluster: LocalCluster, tmp_path: Path) -> None:
    spec = {"name": "wait-fail", "command": [sys.executable, "-c", "raise SystemExit(1)"],
            "gpus": 1, "restart": {"max_restarts": 0, "backoff": 0}}
    done = hafo(cluster, "submit", spec_file(tmp_path, spec), "--wait", "--timeout", "60")
    assert done.returncode == 1, done.stderr
    out = lines(done.stderr)
    assert re.fullmatch(r"wait-fail-\w+: failed after \d+\.\d s: .*exited with code 1.*",
                        out[-1]), out
    wid = done.stdout.strip()
    assert snapshot(cluster).assignments[wid].phase == "failed"
    delete(cluster, wid)


def test_drain_wait_until_the_node_is_empty(cluster: LocalCluster) -> None:
    first, node = submit_running(cluster, "wait-drain-1")
    second, other = submit_running(cluster, "wait-drain-2")
    on_node = [first] + ([second] if other == node else [])
    try:
        done = hafo(cluster, "drain", node, "--wait", "--timeout", "60")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"cordoned {node}; ")  # unchanged without --wait
        out = lines(done.stderr)
        assert re.fullmatch(rf"drain {node}: {node} is empty: .+ {FINAL}", out[-1]), out
        after = snapshot(cluster)
        assert not after.holders.get(node)
        assert not [k for k, s in after.statuses.items() if k[1] == node and s.state != "exited"]
        for wid in (first, second):
            view = workload_view(after, wid)
            if view["node"] == node or view["state"] != "running":
                pytest.fail(f"{wid} does not run elsewhere: {view}")
            if wid in on_node:
                assert f"{wid} running on {view['node']}" in out[-1]
        print(f"drain --wait: {out}")
    finally:
        assert hafo(cluster, "uncordon", node).returncode == 0
        delete(cluster, first, second)


def test_migrate_wait_until_running_elsewhere(cluster: LocalCluster) -> None:
    wid, node = submit_running(cluster, "wait-move")
    _, epoch = running_on(cluster, wid)
    try:
        done = hafo(cluster, "migrate", wid, "--wait", "--json")
        assert done.returncode == 0, done.stderr
        new_node, new_epoch = running_on(cluster, wid)
        assert new_node != node and new_epoch > epoch
        out = lines(done.stderr)
        assert re.fullmatch(rf"{wid}: running on {new_node} \(epoch {new_epoch}\) {FINAL}",
                            out[-1]), out
        assert any("stopping on" in line for line in out), out
        body = json.loads(done.stdout)
        assert body["id"] == wid and body["outcome"]["result"] == "done"
        assert body["outcome"]["node"] == new_node and body["outcome"]["epoch"] == new_epoch
        print(f"migrate --wait: {out}")
    finally:
        delete(cluster, wid)


def test_ctrl_c_leaves_the_request(cluster: LocalCluster, tmp_path: Path) -> None:
    path = spec_file(tmp_path, demo_workload_spec(name="wait-int", gpus=8))
    proc = subprocess.Popen([sys.executable, "-m", "hafo", "submit", path, "--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_of(cluster))
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the first progress line: waiting has begun
        assert "pending" in first or "waiting" in first, first
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert re.fullmatch(r"wait-int-\w+: interrupted after \d+\.\d s: .+; the workload stays "
                        r"submitted", stderr.splitlines()[-1]), stderr
    wid = stdout.strip()
    assert wid in snapshot(cluster).workloads
    delete(cluster, wid)


def test_submit_wait_on_a_terminal(cluster: LocalCluster, tmp_path: Path) -> None:
    path = spec_file(tmp_path, demo_workload_spec(name="wait-tty"))
    leader, follower = pty.openpty()
    env = {**env_of(cluster), "TERM": "xterm-256color", "COLUMNS": "160"}
    proc = subprocess.Popen([sys.executable, "-m", "hafo", "submit", path, "--wait",
                             "--timeout", "60"], stdout=subprocess.PIPE, stderr=follower,
                            env=env)
    os.close(follower)
    raw = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other end is closed
                break
            if not chunk:
                break
            raw += chunk
        assert proc.wait(timeout=20) == 0, raw
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stdout is not None
    wid = proc.stdout.read().decode().strip()
    text = raw.decode(errors="replace")
    assert "\x1b[" in text  # a live display, not plain lines
    shown = [line.strip() for line in ANSI.sub("\n", text).splitlines() if line.strip()]
    node, epoch = running_on(cluster, wid)
    assert re.fullmatch(rf"{wid}: running on {node} \(epoch {epoch}\) {FINAL}", shown[-1]), \
        shown
    print(f"on a terminal: {len(raw)} bytes, {text.count(chr(27))} escape sequences; {shown}")
    delete(cluster, wid)


def test_service_submit_and_replica_migrate_wait(cluster: LocalCluster, tmp_path: Path) -> None:
    spec = {**demo_workload_spec(name="wait-svc"), "replicas": 2}
    done = hafo(cluster, "submit", spec_file(tmp_path, spec), "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    out = lines(done.stderr)
    assert re.fullmatch(rf"{sid}: 2 of 2 replica\(s\) ready on node-\d, node-\d {FINAL}",
                        out[-1]), out
    try:
        before = snapshot(cluster)
        replica = before.replicas[sid][0]
        node = before.assignments[replica].node
        assert node is not None
        moved = hafo(cluster, "migrate", sid, "--from", node, "--wait", "--timeout", "60")
        assert moved.returncode == 0, moved.stderr
        out = lines(moved.stderr)
        found = re.fullmatch(rf"{re.escape(replica)}: replaced by ({re.escape(sid)}\.\d+), "
                             rf"ready on (node-\d) \(epoch \d+\) {FINAL}", out[-1])
        assert found, out
        assert found[2] != node
        assert snapshot(cluster).workloads[found[1]].replaces == replica
        print(f"service --wait: {done.stderr.splitlines()}; replica move: {out}")
    finally:
        delete(cluster, sid)

"""HTTP API and CLI against one live local cluster (real etcd, controllers, agents)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hafo import __version__
from hafo.local.cluster import LocalCluster, demo_workload_spec
from tests.integration.helpers import started_cluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from started_cluster(tmp_path_factory.mktemp("api"), nodes=2, controllers=2)


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def hafo(cluster: LocalCluster, *args: str,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints)}
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True, text=True,
                          env=env, timeout=30, cwd=cwd)


def eventually(port: int, path: str, check: Any, timeout: float = 10.0) -> Any:
    """GET until ``check(body)`` holds: each controller's cache follows etcd a moment later."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = get(port, path)
        if code == 200 and check(body):
            return body
        assert time.monotonic() < deadline, f"{path} on {port} never satisfied: {body}"
        time.sleep(0.05)


def test_controller_api_read_side(cluster: LocalCluster) -> None:
    ports = {n: h.api_port for n, h in cluster.controller_handles.items()}
    leaders = [n for n, p in ports.items() if get(p, "/leader")[0] == 200]
    assert len(leaders) == 1
    standby = next(n for n in ports if n not in leaders)
    code, body = get(ports[standby], "/leader")
    assert code == 503 and "error" in body
    for port in ports.values():
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/readyz")[0] == 200
        status = eventually(port, "/v1/status", lambda s: s["leader"] and s["nodes"]["ready"])
        assert set(status) == {"leader", "controllers", "nodes", "workloads", "stale",
                               "stale_seconds", "etcd_contact_age"}
        assert status["stale"] is False and status["stale_seconds"] is None
        assert status["leader"] == leaders[0]
        assert status["nodes"]["ready"] == 2
        code, nodes = get(port, "/v1/nodes")
        assert code == 200 and [n["name"] for n in nodes] == ["node-1", "node-2"]
        gpu = nodes[0]["gpus"][0]
        assert set(gpu) >= {"index", "uuid", "model", "memory_mib", "healthy", "allocated_to"}
    assert get(ports[standby], "/v1/nodes/nope")[0] == 404
    assert get(ports[standby], "/v1/workloads/nope")[0] == 404
    code, body = get(ports[standby], "/v1/events?limit=zero")
    assert code == 400 and body["error"].startswith("limit")


def test_agent_api(cluster: LocalCluster) -> None:
    handle = cluster.node_handles["node-1"]
    assert get(handle.api_port, "/healthz") == (200, {"status": "ok", "node": "node-1",
                                                      "version": __version__})
    assert get(handle.api_port, "/readyz")[0] == 200
    code, body = get(handle.api_port, "/v1/node")
    assert code == 200 and body["node"]["name"] == "node-1" and body["lease_valid"]


def test_cli_submit_list_delete(cluster: LocalCluster, tmp_path: Path) -> None:
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(demo_workload_spec(name="cli-job", gpus=1)))
    submitted = hafo(cluster, "submit", str(spec))
    assert submitted.returncode == 0, submitted.stderr
    wid = submitted.stdout.strip()
    assert wid.startswith("cli-job-")
    again = hafo(cluster, "submit", str(spec))  # names are identities: no second copy
    assert again.returncode == 0 and again.stdout.strip() == wid
    assert "unchanged" in again.stderr
    for _ in range(100):
        listed = json.loads(hafo(cluster, "workloads", "--json").stdout)
        mine = [w for w in listed if w["id"] == wid]
        if mine and mine[0]["state"] == "running":
            break
        asyncio.run(asyncio.sleep(0.1))
    assert mine[0]["state"] == "running"
    assert set(mine[0]) >= {"id", "name", "state", "node", "epoch", "restarts", "gpus",
                            "checkpoint"}
    table = hafo(cluster, "workloads")
    assert wid in table.stdout and "running" in table.stdout
    port = next(iter(cluster.controller_handles.values())).api_port
    assert get(port, f"/v1/workloads/{wid}")[0] == 200
    status = json.loads(hafo(cluster, "status", "--json").stdout)
    assert status["workloads"]["running"] >= 1
    nodes = json.loads(hafo(cluster, "nodes", "--json").stdout)
    assert any(wid in n["workloads"] for n in nodes)
    assert "submitted" in hafo(cluster, "events").stdout
    assert get(port, "/v1/workloads/cli-job")[1]["id"] == wid  # a name works as an id
    assert hafo(cluster, "delete", "cli-job").returncode == 0
    missing = hafo(cluster, "delete", wid)
    assert missing.returncode == 4 and missing.stderr.count("\n") == 1


@pytest.mark.parametrize(("args", "content", "needle"), [
    (["submit", "{spec}"], "name: Bad_Name\ncommand: [x]\n", "spec.name"),
    (["submit", "{spec}"], "name: ok\ncommand: python run.py\n", "spec.command"),
    (["submit", "{spec}"], "name: ok\ncommand: [x]\ngpus: -1\n", "spec.gpus"),
    (["submit", "{spec}"], "name: [unclosed\n", "invalid YAML"),
    (["submit", "/nonexistent/spec.yaml"], None, "not found"),
    (["agent", "--config", "{spec}"], "cluster: default\n", "node"),
    (["agent", "--config", "{spec}"], "node: {name: n1}\ntiming: {heartbeat: 5}\n",
     "timing.heartbeat"),
    (["controller", "--config", "{spec}"], "etcd: {endpoints: [ftp://x]}\n",
     "etcd.endpoints[0]"),
    (["nodes", "--etcd", "not-a-url"], None, "--etcd"),
    (["bogus-command"], None, "invalid choice"),
])
def test_bad_input_is_one_clear_line(cluster: LocalCluster, tmp_path: Path, args: list[str],
                                     content: str | None, needle: str) -> None:
    path = tmp_path / "input.yaml"
    if content is not None:
        path.write_text(content)
    result = hafo(cluster, *[a.replace("{spec}", str(path)) for a in args])
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr


def test_unreachable_etcd_is_reported(tmp_path: Path) -> None:
    from hafo.local.procs import free_port

    result = subprocess.run([sys.executable, "-m", "hafo", "status", "--etcd",
                             f"http://127.0.0.1:{free_port()}"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3
    # one line: the error, not the etcd client's own warning before it
    assert result.stderr.startswith("hafo: cannot reach etcd"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_shell_completion_offers_the_cluster_s_names(cluster: LocalCluster,
                                                      tmp_path: Path) -> None:
    """bash with ``hafo completion bash`` sourced completes node names from etcd."""
    hafo_bin = Path(sys.executable).with_name("hafo")
    script = tmp_path / "hafo.bash"
    script.write_text(subprocess.run([str(hafo_bin), "completion", "bash"], capture_output=True,
                                     text=True, timeout=30, check=True).stdout)
    line = "hafo drain node"
    program = (f"source {script}; COMP_LINE='{line}'; COMP_POINT={len(line)}; "
               "COMP_WORDS=(hafo drain node); COMP_CWORD=2; _python_argcomplete hafo; "
               "printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = {**os.environ, "PATH": f"{hafo_bin.parent}:{os.environ['PATH']}",
           "HAFO_ETCD": ",".join(cluster.etcd.endpoints), "HAFO_CLUSTER": cluster.cluster}
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert {w.strip() for w in done.stdout.split()} == set(cluster.node_handles)

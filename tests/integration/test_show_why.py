"""Why, on a live cluster: a workload that fails says what it printed last (events,
``hafo workloads``, ``--json`` and the detail view), a restarted workload that runs again no
longer shows its old failure, ``hafo workloads WORKLOAD`` and ``hafo nodes NODE`` give detail
views (also under ``--watch``), and a cluster name nobody registered in is called out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster
from hafo.model.cluster import ClusterSnapshot

from .conftest import ClusterFactory
from .helpers import view

pytestmark = pytest.mark.timeout(150)
MISSING = "ModuleNotFoundError: No module named 'nosuchmodule'"
FIRST_RUN = "RuntimeError: the first run fails"


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints)}
    env.pop("HAFO_CLUSTER", None)
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True,
                          text=True, env=env, timeout=30)


def ok(cluster: LocalCluster, *args: str) -> str:
    result = hafo(cluster, *args)
    assert result.returncode == 0, f"hafo {' '.join(args)}: {result.returncode}\n{result.stderr}"
    return result.stdout


def failed(wid: str) -> Any:
    def check(snapshot: ClusterSnapshot) -> bool:
        assignment = snapshot.assignments.get(wid)
        return assignment is not None and assignment.phase == "failed"
    return check


def runs_again(wid: str) -> Any:
    def check(snapshot: ClusterSnapshot) -> bool:
        shown = view(snapshot, wid)
        return bool(shown["state"] == "running" and shown["restarts"] == 1)
    return check


def not_found(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 4, result
    assert result.stderr.count("\n") == 1 and text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


async def test_why_a_workload_is_where_it_is(local_cluster: ClusterFactory,
                                             tmp_path: Path) -> None:
    cluster = await local_cluster.start(nodes=1, controllers=1)
    node = next(iter(cluster.node_handles))

    # A workload that cannot even import: it fails at once, and says why everywhere.
    broken = await cluster.submit({"name": "no-module", "gpus": 1,
                                   "command": [sys.executable, "-c", "import nosuchmodule"],
                                   "restart": {"max_restarts": 0}})
    await cluster.wait_for(failed(broken), 30, what="the broken workload failed")
    events = json.loads(ok(cluster, "events", "--json", "--limit", "0"))
    ends = [e for e in events if e["workload"] == broken and e["kind"] == "failed"]
    assert ends and MISSING in ends[-1]["message"], events
    assert f"exited with code 1 on {node}" in ends[-1]["message"]
    assert MISSING in ok(cluster, "events")
    listed = {w["id"]: w for w in json.loads(ok(cluster, "workloads", "--json"))}
    assert MISSING in listed[broken]["reason"]
    assert (listed[broken]["state"], listed[broken]["gpus_requested"]) == ("failed", 1)
    row = next(line for line in ok(cluster, "workloads").splitlines()
               if line.startswith(broken))
    assert MISSING in row and row.split()[1] == "failed"  # whole: stdout is no terminal
    detail = ok(cluster, "workloads", "no-module")
    reason_line = next(line for line in detail.splitlines() if line.startswith("reason:"))
    assert MISSING in reason_line and reason_line == f"reason:     {listed[broken]['reason']}"
    assert f"hafo show {broken}" in detail
    one = json.loads(ok(cluster, "workloads", broken, "--json"))
    assert (one["id"], one["state"]) == (broken, "failed") and MISSING in one["reason"]
    not_found(hafo(cluster, "workloads", "nosuch"), "no workload 'nosuch'")

    # A workload that fails once, then runs: its reason no longer reads as a failure.
    marker = tmp_path / "ran-once"
    script = (f"import pathlib, sys, time\np = pathlib.Path({str(marker)!r})\n"
              f"if not p.exists():\n    p.touch()\n    sys.exit({FIRST_RUN!r})\n"
              "time.sleep(600)\n")
    flaky = await cluster.submit({"name": "flaky", "gpus": 2,
                                  "command": [sys.executable, "-c", script]})
    snapshot = await cluster.wait_for(runs_again(flaky), 30, what="flaky running again")
    reason = view(snapshot, flaky)["reason"]
    assert reason.startswith(f"running again after: exited with code 1 on {node}: {FIRST_RUN}; "
                             "restart 1/3 in place"), reason
    restarted = [e for e in json.loads(ok(cluster, "events", "--json", "--limit", "0"))
                 if e["workload"] == flaky and e["kind"] == "restarted"]
    assert restarted and FIRST_RUN in restarted[0]["message"]
    row = next(line for line in ok(cluster, "workloads").splitlines() if line.startswith(flaky))
    assert row.split()[:2] == [flaky, "running"] and "running again after: " in row
    assert row.split()[5] == "2/2"  # GPUS: allocated/requested

    # The node's detail view: its GPUs, which workload holds which, its workloads.
    shown = ok(cluster, "nodes", node)
    assert shown.startswith(f"node:       {node} (ready)")
    assert "2 of 4 allocated, 4 of 4 healthy" in shown
    assert sum(1 for line in shown.splitlines() if f"  {flaky}" in line) == 3  # 2 GPUs + row
    data = json.loads(ok(cluster, "nodes", node, "--json"))
    assert (data["name"], data["workloads"]) == (node, [flaky]) and data["api"]
    not_found(hafo(cluster, "nodes", "nosuch"), f"no node 'nosuch' (nodes: {node})")

    # --watch with a detail view: one JSON object per line until Ctrl-C, then exit 0.
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints)}
    watch = subprocess.Popen([sys.executable, "-m", "hafo", "workloads", "flaky", "--json",
                              "--watch", "0.2"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert watch.stdout is not None
        lines = [watch.stdout.readline() for _ in range(2)]
        assert [json.loads(line)["id"] for line in lines] == [flaky, flaky]
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=15) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(timeout=10)

    # A cluster nobody registered in: said on stderr; an empty cluster is still exit 0.
    warning = ("warning: no node or controller has registered in cluster 'nosuch' (check "
               "--cluster / $HAFO_CLUSTER)\n")
    for command in (["status"], ["nodes"], ["workloads", "--json"]):
        result = hafo(cluster, *command, "--cluster", "nosuch")
        assert (result.returncode, result.stderr) == (0, warning), result
    assert json.loads(hafo(cluster, "workloads", "--json", "--cluster", "nosuch").stdout) == []
    assert hafo(cluster, "status").stderr == ""

"""Elastic capacity on a live local cluster (real etcd, a controller, three agents):
``hafo node remove`` refuses a node with work, ``--drain`` moves the work and then refuses
while the agent is alive; once the node is powered off it is removed, leaving no record (not
in ``hafo nodes``, the snapshot, the failsafe acknowledgements, any per-node key), a fresh
submit runs at once, and an agent of that name registers again as a new node. The autoscale
hook (a python script writing its stdin to a file) is called with a pending 2-node gang's
shape, which ``GET /v1/demand`` and ``hafo_pending_demand`` show too (docs/reference/elastic.md,
"Elastic capacity")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import running, view

pytestmark = pytest.mark.timeout(150)

HOOK = """import json, sys
data = sys.stdin.read()
json.loads(data)
with open(sys.argv[1], "a") as out:
    out.write(data.replace("\\n", " ") + "\\n")
print("ok")
"""


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints),
           "HAFO_CLUSTER": cluster.cluster}
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True,
                          text=True, env=env, timeout=90)


def get(cluster: LocalCluster, path: str) -> str:
    port = next(iter(cluster.controller_handles.values())).api_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return str(resp.read().decode())


def calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_remove_a_node_and_tell_the_autoscaler(local_cluster: ClusterFactory,
                                                     tmp_path: Path) -> None:
    hook, got = tmp_path / "hook.py", tmp_path / "calls.jsonl"
    hook.write_text(HOOK)
    cluster = await local_cluster.start(nodes=3, controllers=1, gpus_per_node=2,
                                        controller_config={"autoscale": {
                                            "command": [sys.executable, str(hook), str(got)],
                                            "interval": 0.5, "timeout": 10}})
    started = time.monotonic()
    wid = await cluster.submit(demo_workload_spec(name="train", gpus=1))
    snapshot = await cluster.wait_for(running(wid), 30, what="the workload runs")
    node = view(snapshot, wid)["node"]

    # (a) refused with work; --drain moves it, then refuses while the agent lives
    busy = hafo(cluster, "node", "remove", node)
    assert busy.returncode == 5, busy.stderr
    assert f"holds 1 workload ({wid}): drain it first" in busy.stderr
    drained = hafo(cluster, "node", "remove", node, "--drain", "--timeout", "60")
    assert drained.returncode == 5, (drained.stdout, drained.stderr)
    assert f"cordoned {node}; 1 planned move requested: {wid}" in drained.stdout
    assert "stop its agent first (systemctl stop hafo-agent)" in drained.stderr
    snapshot = await cluster.wait_for(running(wid, not_on=node), 30, what="moved off")
    assert node in snapshot.nodes and node in snapshot.cordoned

    cluster.power_off(node)
    await cluster.wait_for(lambda s: node not in s.alive, 20, what="its lease expires")
    removed = hafo(cluster, "node", "remove", node)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"removed node {node}"
    listed = hafo(cluster, "nodes", "--json")
    assert node not in {n["name"] for n in json.loads(listed.stdout)}
    snapshot = await cluster.snapshot()
    assert node not in snapshot.nodes and node not in snapshot.cordoned
    acks = {name for name in snapshot.nodes}  # what a new leader's failsafe rule waits for
    assert node not in acks and len(acks) == 2
    _, kvs = await cluster.store.get_prefix(cluster.keys.root)
    left = [kv.key for kv in kvs if cluster.keys.parse(kv.key).node == node
            and cluster.keys.parse(kv.key).kind != "event"]
    assert not left, left
    events = await read_events(cluster.store, cluster.keys, 0)
    assert any(e.kind == "node-removed" and e.node == node for e in events)
    assert hafo(cluster, "node", "remove", node).returncode == 4

    submitted = time.monotonic()
    fresh = await cluster.submit(demo_workload_spec(name="fresh", gpus=1))
    await cluster.wait_for(running(fresh), 20, what="a fresh submit runs")
    took = time.monotonic() - submitted
    assert took < 10, f"a fresh submit took {took:.1f} s"

    # (b) a 2-node gang that no two nodes can take: the hook is told its shape
    gang = await cluster.submit({**demo_workload_spec(name="gang", gpus=2), "nodes": 2})
    shape = {"queue": "default", "gpu_model": None, "gpu_profile": None, "nodes": 2,
             "gpus_per_node": 2, "count": 1}
    deadline = time.monotonic() + 20
    while not any(shape in c["pending"] for c in calls(got)):
        assert time.monotonic() < deadline, f"hook not called with the gang: {calls(got)}"
        await asyncio.sleep(0.1)
    assert view(await cluster.snapshot(), gang)["state"] == "pending"
    demand = json.loads(get(cluster, "/v1/demand"))
    assert shape in demand["pending"] and demand["leader"] is True
    metrics = get(cluster, "/metrics")
    assert ('hafo_pending_demand{gpu_model="",gpus_per_node="2",nodes="2",queue="default"} '
            '1.0') in metrics
    assert 'hafo_autoscale_calls_total{result="ok"}' in metrics

    # the removed name registers again as a new node
    assert cluster.power_on(node)
    await cluster.wait_for(lambda s: s.node_state(node) in ("ready", "cordoned")
                           and node not in s.cordoned, 30, what="it registers anew")
    print(f"\nelastic: removal, fresh submit ({took:.2f} s) and the hook's call in "
          f"{time.monotonic() - started:.0f} s")

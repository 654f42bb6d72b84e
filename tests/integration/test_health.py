"""Health on a live cluster: GPU faults move exactly the work they must, failing application
checks restart in place and then move, and an outside plugin adds a check type."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from hafo.local.cluster import demo_workload_spec
from hafo.local.procs import free_port
from hafo.model.views import node_view
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, view

pytestmark = pytest.mark.timeout(150)


def gpu_of(snapshot: object, wid: str) -> tuple[str, int]:
    assignment = snapshot.assignments[wid]  # type: ignore[attr-defined]
    return assignment.node, assignment.gpus[0]


async def test_xid48_moves_only_the_workload_on_that_gpu(local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    ids = [await cluster.submit(demo_workload_spec(name=f"w{i}")) for i in range(3)]
    snapshot = await cluster.wait_for(lambda s: all(running(w)(s) for w in ids), 30,
                                      what="all running")
    by_node: dict[str, list[str]] = {}
    for wid in ids:
        by_node.setdefault(view(snapshot, wid)["node"], []).append(wid)
    node, (victim, _neighbour) = next((n, ws) for n, ws in by_node.items() if len(ws) == 2)
    epochs = {w: view(snapshot, w)["epoch"] for w in ids}
    gpu = gpu_of(snapshot, victim)[1]
    cluster.inject_fault(node, gpu, xid=48)
    snapshot = await cluster.wait_for(
        lambda s: running(victim)(s) and view(s, victim)["epoch"] != epochs[victim], 30,
        what="the workload on the faulty GPU moved")
    assert gpu_of(snapshot, victim) != (node, gpu)
    assert all(view(snapshot, w)["epoch"] == epochs[w] for w in ids if w != victim), \
        "the other workloads are left alone"
    nodes = {n["name"]: n for n in (node_view(snapshot, name) for name in snapshot.nodes)}
    bad = nodes[node]["gpus"][gpu]
    assert bad["healthy"] is False and "xid 48" in bad["reason"]
    assert nodes[node]["state"] == "ready"
    kinds = [(e.kind, e.workload) for e in await read_events(cluster.store, cluster.keys, 0)]
    assert ("gpu-unhealthy", victim) in kinds and ("moved", victim) in kinds
    assert_never_two_copies(cluster, victim)


async def test_xid79_moves_everything_off_the_node(local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    ids = [await cluster.submit(demo_workload_spec(name=f"w{i}")) for i in range(4)]
    snapshot = await cluster.wait_for(lambda s: all(running(w)(s) for w in ids), 30,
                                      what="all running")
    node = "node-1"
    on_node = [w for w in ids if view(snapshot, w)["node"] == node]
    assert on_node
    cluster.inject_fault(node, gpu_of(snapshot, on_node[0])[1], xid=79)
    snapshot = await cluster.wait_for(
        lambda s: all(running(w, not_on=node)(s) for w in ids), 40, what="node drained")
    assert snapshot.node_state(node) == "unhealthy"
    assert "xid 79" in snapshot.nodes[node].reason
    for wid in on_node:
        assert_never_two_copies(cluster, wid)


HTTP_APP = """
import http.server, os, pathlib, sys, time
sick = pathlib.Path(os.environ["HAFO_CHECKPOINT_DIR"]) / "sick"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500 if sick.exists() else 200)
        self.end_headers()
        self.wfile.write(b"sick" if sick.exists() else b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("serving", flush=True)
server.serve_forever()
"""


async def test_failing_http_check_restarts_in_place_then_moves(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    port = free_port()
    wid = await cluster.submit({
        "name": "web", "command": [sys.executable, "-c", HTTP_APP, str(port)], "gpus": 1,
        "restart": {"max_restarts": 1, "window": 600, "backoff": 0.2},
        "checks": [{"type": "http", "url": f"http://127.0.0.1:{port}/healthz",
                    "interval": 0.2, "timeout": 1, "failure_threshold": 2,
                    "initial_delay": 0.5}]})
    snapshot = await cluster.wait_for(running(wid), 30, what="running")
    first_node, first_epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    await asyncio.sleep(1.5)  # on purpose: healthy checks pass for 1.5 s: nothing happens
    snapshot = await cluster.snapshot()
    assert view(snapshot, wid)["epoch"] == first_epoch and view(snapshot, wid)["restarts"] == 0
    sick = Path(cluster.checkpoint_root) / wid / "sick"
    sick.write_text("yes")
    snapshot = await cluster.wait_for(
        lambda s: view(s, wid)["restarts"] == 1 and running(wid)(s), 30, what="restarted")
    assert view(snapshot, wid)["node"] == first_node, "the first restart is in place"
    snapshot = await cluster.wait_for(
        lambda s: view(s, wid)["restarts"] == 2 and running(wid)(s), 30, what="moved")
    assert view(snapshot, wid)["node"] != first_node, "restarts used up: another node"
    assert first_node in snapshot.assignments[wid].failed_on
    sick.unlink()
    await asyncio.sleep(1.5)  # on purpose: checks pass again for 1.5 s: no further restart
    snapshot = await cluster.snapshot()
    assert view(snapshot, wid)["restarts"] == 2 and view(snapshot, wid)["state"] == "running"
    events = [e for e in await read_events(cluster.store, cluster.keys, 0) if e.workload == wid]
    failed = [e.message for e in events if e.kind == "app-failed"]
    assert len(failed) == 2 and "check http[0]" in failed[0]


async def test_outside_plugin_check_type_restarts_a_stalled_job(
        local_cluster: ClusterFactory) -> None:
    """``type: training`` comes from the separately installed hafo-check-training package,
    found through its entry point alone."""
    from hafo.checks.registry import available_types

    assert available_types().get("training") == "hafo-check-training"
    cluster = await local_cluster.start(nodes=2, controllers=1)
    spec = demo_workload_spec(name="stalls", stall_at=30)
    spec["checks"] = [{"type": "training", "stall_after": 1.5, "interval": 0.3,
                       "failure_threshold": 2, "timeout": 2}]
    wid = await cluster.submit(spec)
    snapshot = await cluster.wait_for(
        lambda s: view(s, wid)["restarts"] == 1 and running(wid)(s), 40,
        what="the stalled job restarted")
    events = [e for e in await read_events(cluster.store, cluster.keys, 0)
              if e.workload == wid and e.kind == "app-failed"]
    assert events and "training" in events[0].message and "no" in events[0].message
    snapshot = await cluster.wait_for(
        lambda s: (view(s, wid)["checkpoint"] or {}).get("step", 0) >= 40, 30,
        what="progress past the stall after the restart")
    starts = [ln for ln in cluster.progress_log(wid) if ln.get("event") == "start"]
    assert [s["resumed_from"] for s in starts] == [0, 30], "resumed from the stall checkpoint"
    assert view(snapshot, wid)["restarts"] == 1

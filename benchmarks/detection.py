"""Detection and reaction times of the three health layers on a local cluster.

Per trial, from the moment the fault is made to the moment the replacement instance runs
(its guard's start time):
- crash:  the workload's process is SIGKILLed -> restarted in place;
- check:  its HTTP health endpoint starts answering 500 -> the check fails
          ``failure_threshold`` times -> stopped and restarted in place;
- gpu:    XID 48 is written for its GPU (simulated backend) -> moved off that GPU.
Baseline, measured in the same run: a cold start (submit a new workload -> its process runs),
the part of any reaction that is not detection. Ratios: against that cold start, and against
the configured detection floor (a failing check needs failure_threshold x interval, a GPU
fault up to one health interval; an exit has no interval).

    python benchmarks/detection.py --trials 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_main import run_main

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.procs import free_port
from hafo.logs import configure
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view
from hafo.stats import percentile

CHECK_INTERVAL, CHECK_THRESHOLD, HEALTH_INTERVAL = 0.5, 2, 0.5
HTTP_APP = """
import http.server, os, pathlib, sys

sick = pathlib.Path(os.environ["HAFO_CHECKPOINT_DIR"]) / "sick"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500 if sick.exists() else 200); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def replaced(wid: str, epoch: int) -> Any:
    def check(s: ClusterSnapshot) -> bool:
        v = workload_view(s, wid)
        return bool(v["state"] == "running" and v["epoch"] != epoch)
    return check


async def one(cluster: LocalCluster, wid: str, fault: str) -> float:
    snapshot = await cluster.snapshot()
    view = workload_view(snapshot, wid)
    node, epoch = view["node"], view["epoch"]
    status = snapshot.current_status(wid)
    assert status is not None and status.pid
    sick = cluster.checkpoint_root / wid / "sick"
    old_gpu = snapshot.assignments[wid].gpus[0]
    assert node is not None
    host = cluster.host_pid(node, status.pid)  # the agent reports the node's number
    assert host is not None, f"{node} runs no process {status.pid}"
    started = time.time()
    if fault == "crash":
        os.kill(host, signal.SIGKILL)
    elif fault == "check":
        sick.write_text("yes")
    else:
        cluster.inject_fault(node, old_gpu, xid=48)
    snapshot = await cluster.wait_for(replaced(wid, epoch), 60, interval=0.02, what=fault)
    if fault == "check":
        sick.unlink()
    if fault == "gpu":
        cluster.inject_fault(node, old_gpu)  # cleared: healthy again after the hold-down
    new = snapshot.current_status(wid)
    assert new is not None and new.started_at is not None
    await asyncio.sleep(1.5)  # past the window and the check's initial delay
    return new.started_at - started


async def cold_start(cluster: LocalCluster, i: int) -> float:
    """Submit -> running for a fresh workload (then deleted)."""
    from hafo.store import intents

    submitted = time.time()
    wid = await cluster.submit(demo_workload_spec(name=f"cold-{i}", gpus=0))
    snapshot = await cluster.wait_for(lambda s: workload_view(s, wid)["state"] == "running",
                                      30, interval=0.02, what="cold start")
    status = snapshot.current_status(wid)
    assert status is not None and status.started_at is not None
    await intents.delete(cluster.store, cluster.keys, wid)
    return status.started_at - submitted


async def main(trials: int) -> int:
    cluster = LocalCluster(nodes=2, controllers=1,
                           health={"interval": HEALTH_INTERVAL, "hold_down": 3})
    cluster.start()
    try:
        await cluster.wait_ready(60)
        restart = {"max_restarts": 1000, "window": 1, "backoff": 1}
        crash = await cluster.submit({**demo_workload_spec(name="crash"), "restart": restart})
        port = free_port()
        check = await cluster.submit({
            "name": "check", "command": [sys.executable, "-c", HTTP_APP, str(port)],
            "gpus": 1, "restart": restart,
            "checks": [{"type": "http", "url": f"http://127.0.0.1:{port}/", "timeout": 1,
                        "interval": CHECK_INTERVAL, "failure_threshold": CHECK_THRESHOLD,
                        "initial_delay": 0.5}]})
        gpu = await cluster.submit(demo_workload_spec(name="gpu"))
        ids = {"crash": crash, "check": check, "gpu": gpu}
        await cluster.wait_for(lambda s: all(workload_view(s, w)["state"] == "running"
                                             for w in ids.values()), 30, what="running")
        floors = {"crash": 0.0, "check": CHECK_INTERVAL * CHECK_THRESHOLD,
                  "gpu": HEALTH_INTERVAL}
        results: dict[str, list[float]] = {k: [] for k in ("cold", *ids)}
        for i in range(trials):
            results["cold"].append(await cold_start(cluster, i))
            for fault, wid in ids.items():
                results[fault].append(await one(cluster, wid, fault))
            print(f"trial {i + 1:2d}: " + "  ".join(f"{k} {v[-1]:.2f}s"
                                                    for k, v in results.items()), flush=True)
        print(f"\nfault -> replacement running, {trials} trials (health interval "
              f"{HEALTH_INTERVAL}s; check every {CHECK_INTERVAL}s, threshold "
              f"{CHECK_THRESHOLD})")
        cold = percentile(results["cold"], 50)
        print(f"baseline: cold start (submit -> running) p50 {cold:.2f}s, "
              f"max {max(results['cold']):.2f}s")
        print(f"{'':7s} {'p50':>7s} {'max':>7s}  {'p50/cold':>8s}  {'floor':>6s} "
              f"{'p50 - floor':>11s} {'(p50-floor)/cold':>16s}")
        for fault in ids:
            values = results[fault]
            p50, worst, floor = percentile(values, 50), max(values), floors[fault]
            print(f"{fault:7s} {p50:6.2f}s {worst:6.2f}s  {p50 / cold:8.2f}  {floor:5.2f}s "
                  f"{p50 - floor:10.2f}s {(p50 - floor) / cold:16.2f}")
        await cluster.close_store()
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    configure("console", level="warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    run_main(lambda: asyncio.run(main(parser.parse_args().trials)))

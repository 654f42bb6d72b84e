"""``hafo sim``: simulated nodes with real leases, placed on by a real controller, crashed
in bulk and re-placed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter

import pytest

from hafo.model.views import workload_view
from hafo.sim import SimFleet
from hafo.store import intents

from .conftest import ClusterFactory

pytestmark = pytest.mark.timeout(120)


async def test_fleet_is_placed_on_and_recovers_from_a_mass_crash(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=0, controllers=1)
    fleet = SimFleet(cluster.store, cluster.keys, 40, gpus_per_node=4, ttl=3, heartbeat=1.0)
    await fleet.start()
    runner = asyncio.create_task(fleet.run())
    try:
        await cluster.wait_for(lambda s: sum(s.node_state(n) == "ready" for n in s.nodes) == 40,
                               20, what="40 simulated nodes ready")
        from hafo.model.spec import parse_spec

        ids = [(await intents.submit(cluster.store, cluster.keys, parse_spec(
            {"name": f"w{i}", "command": ["true"], "gpus": 1}))).submission.id
               for i in range(80)]
        snapshot = await cluster.wait_for(
            lambda s: all(workload_view(s, w)["state"] == "running" for w in ids), 30,
            what="80 simulated instances running")
        assert sorted(Counter(workload_view(snapshot, w)["node"] for w in ids).values()) \
            == [2] * 40, "spread evenly"
        victims = set(fleet.kill(0.25, seed=3))
        killed = time.time()
        displaced = [w for w in ids if workload_view(snapshot, w)["node"] in victims]
        snapshot = await cluster.wait_for(
            lambda s: all(workload_view(s, w)["state"] == "running"
                          and workload_view(s, w)["node"] not in victims for w in displaced),
            30, what="displaced work running elsewhere")
        assert displaced and all(fleet.started[w] > killed for w in displaced)
        assert time.time() - killed < 3 + 5
        assert all(snapshot.node_state(v) == "down" for v in victims)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await fleet.revoke_all()


async def test_hafo_sim_command(local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=0, controllers=1)
    proc = subprocess.run(
        [sys.executable, "-m", "hafo", "sim", "--nodes", "25", "--gpus-per-node", "2",
         "--duration", "4", "--kill-after", "2", "--kill-fraction", "0.2",
         "--etcd", ",".join(cluster.etcd.endpoints), "--cluster", cluster.cluster],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "25 nodes x 2 GPUs registered" in proc.stdout
    assert "crashed 5 nodes" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "hafo", "sim", "--nodes", "0"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--nodes" in bad.stderr and "Traceback" not in bad.stderr

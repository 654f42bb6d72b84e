"""Warm survivors and a warm spare through hafo, end to end: a real 3-member DDP gang
(examples/warm_train.py under the SDK's ``run_warm``, one process per node, gloo on the CPU,
a real local cluster with a spare node) with tiered checkpoints, durable only every 1000
steps.

Power loss of a member's node: the survivors park and are handed the next epoch in the same
processes (their pids unchanged), the standby that waited on the spare becomes the lost rank
(its pid is the standby's) and fetches the lost rank's snapshot from its peer's RAM; the gang
resumes at the step it reached (one step at most lost) and no two epochs overlap in the
progress log, where a process that changes epoch logs each epoch under its own number. A
member's process killed: the others stay warm, that member starts anew on its node.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster
from hafo.local.procs import descendants
from hafo.model.views import workload_view

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies
from .test_gang_tiers import assert_each_rank_got_its_own, assert_ram_bounded, starts
from .test_gangs import gang_cluster, members, steps, training, wait_steps

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def warm_spec(name: str, nodes: int) -> dict[str, Any]:
    """The warm example as a gang: tiers every step, durable every 1000 steps."""
    return {"name": name, "nodes": nodes, "gpus": 1, "stop_grace": 15, "warm": True,
            "command": [sys.executable, str(ROOT / "examples" / "warm_train.py"), "--steps",
                        "0", "--every", "1000", "--sleep", "0.05"],
            "env": {"HAFO_DDP_TIMEOUT": "30"}}


def _runs_the_example(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"warm_train.py") for part in cmdline)


def pids_of(cluster: LocalCluster, wid: str, epoch: int) -> dict[int, tuple[str, int]]:
    """rank -> (node, pid) of the process that logged ``epoch``'s start (each node has a
    PID namespace of its own, as a machine has)."""
    return {rank: (line["node"], line["pid"])
            for rank, line in starts(cluster, wid, epoch).items()}


async def standby_pid(cluster: LocalCluster, wid: str) -> tuple[str, int]:
    """(node, pid) of the gang's standby, once it parked in the gang's epoch."""
    def parked(s: Any) -> bool:
        assignment = s.assignments.get(wid)
        if assignment is None or assignment.phase != "placed" or not assignment.standby:
            return False
        status = s.statuses.get((wid, assignment.standby[0].node))
        # of the gang's epoch, or later: a standby chosen after the placement
        return bool(status is not None and status.state == "parked"
                    and status.epoch >= assignment.epoch)

    snapshot = await cluster.wait_for(parked, 60, what="the gang's standby parked")
    node = snapshot.assignments[wid].standby[0].node
    status = snapshot.statuses[(wid, node)]
    assert status.pid
    return node, status.pid


async def test_power_loss_keeps_the_survivors_and_the_standby_warm(
        local_cluster: ClusterFactory) -> None:
    # four nodes, one kept idle as a spare (placement.spares): each node that comes back
    # idle becomes the next spare
    cluster = await local_cluster.start(nodes=4, controllers=1, gpus_per_node=1,
                                        controller_config={"placement": {"spares": 1}})
    wid = await cluster.submit(warm_spec("warm-power", nodes=3))
    snapshot = before = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    await wait_steps(cluster, wid, epoch, 20)
    standby = await standby_pid(cluster, wid)
    old = pids_of(cluster, wid, epoch)
    lost = members(before, wid)[1][1]  # rank 1's node
    cut = time.time()
    cluster.power_off(lost)
    last_old = max(s["step"] for s in steps(cluster, wid, epoch))
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    new = workload_view(snapshot, wid)
    assert [(r, n) for r, n, _ in members(snapshot, wid)][1] == (1, standby[0])
    fresh = await wait_steps(cluster, wid, new["epoch"], 5)
    again = min(s["t"] for s in fresh if s["rank"] == 0) - cut
    print(f"training again {again:.2f}s after the power cut")
    assert pids_of(cluster, wid, new["epoch"]) == {0: old[0], 1: standby, 2: old[2]}, \
        "the survivors and the standby go on in their processes"
    begun = starts(cluster, wid, new["epoch"])
    assert {rank: line["warm"] for rank, line in begun.items()} == {0: True, 1: True, 2: True}
    assert {rank: line["tier"] for rank, line in begun.items()} == {
        0: "own", 1: "peer", 2: "own"}
    resumed = assert_each_rank_got_its_own(cluster, wid, new["epoch"], 3)
    assert last_old - 1 <= resumed <= last_old + 1, (resumed, last_old)
    parked = [line for line in cluster.progress_log(wid) if line.get("event") == "parked"]
    assert sorted(line["rank"] for line in parked if line["epoch"] == epoch) == [0, 2]
    assert again < 30, f"training again {again:.1f}s after the power cut"
    assert_ram_bounded(cluster, wid)
    assert new["restarts"] == 0
    assert_never_two_copies(cluster, wid)
    # the node comes back with its disk, idle: the gang's next standby goes there, with the
    # gang's epoch unchanged (its members keep running)
    cluster.start_node(lost)
    await cluster.wait_ready(60)
    second = await standby_pid(cluster, wid)
    assert second[0] == lost
    snapshot = await cluster.snapshot()
    assert workload_view(snapshot, wid)["epoch"] == new["epoch"]
    assert pids_of(cluster, wid, new["epoch"]) == {0: old[0], 1: standby, 2: old[2]}
    # and takes rank 1 when the first standby's node, rank 1's now, loses power in turn
    await wait_steps(cluster, wid, new["epoch"], 30)
    cluster.power_off(standby[0])
    snapshot = await cluster.wait_for(training(wid, new["epoch"]), 90,
                                      what="gang trains again, twice")
    third = workload_view(snapshot, wid)
    await wait_steps(cluster, wid, third["epoch"], 5)
    assert pids_of(cluster, wid, third["epoch"]) == {0: old[0], 1: second, 2: old[2]}
    assert_never_two_copies(cluster, wid)


async def test_a_member_crash_keeps_the_others_warm(local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(warm_spec("warm-crash", nodes=2))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    await wait_steps(cluster, wid, epoch, 15)
    old = pids_of(cluster, wid, epoch)
    node = members(snapshot, wid)[1][1]
    workers = [p for p in descendants(cluster.node_handles[node].agent_pid() or 0)
               if _runs_the_example(p)]
    assert len(workers) == 1, workers
    os.kill(workers[0], signal.SIGKILL)
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    await wait_steps(cluster, wid, view["epoch"], 5)
    now = pids_of(cluster, wid, view["epoch"])
    assert now[0] == old[0], "rank 0 stays warm"
    assert now[1] != old[1], "rank 1 starts anew"
    assert_each_rank_got_its_own(cluster, wid, view["epoch"], 2)
    assert_never_two_copies(cluster, wid)

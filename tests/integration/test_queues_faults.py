"""A reclaim under faults, on a live local cluster: while team-a takes back the quota it lent
to team-b, the leader controller is SIGKILLed and the node of the victims loses power, then
comes back with its disk. team-a's work waits while the pool cannot hold both quotas (the
queues' quotas are then more than the GPUs left), runs once the node is back, team-b keeps
its own quota, and no workload ever runs twice."""

from __future__ import annotations

import time

import pytest

from hafo.local.cluster import demo_workload_spec
from hafo.model.queues import QueueSpec
from hafo.store import intents

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, view

pytestmark = pytest.mark.timeout(240)


def spec(name: str, queue: str, gpus: int = 1) -> dict[str, object]:
    return {**demo_workload_spec(name=name, gpus=gpus), "queue": queue, "stop_grace": 5}


async def test_a_reclaim_survives_a_leader_kill_and_a_power_loss(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2, gpus_per_node=4,
                                        controller_config={"fair_sharing": {"min_runtime": 0}})
    for team in ("team-a", "team-b"):
        await intents.set_queue(cluster.store, cluster.keys,
                                QueueSpec(name=team, gpus=4 if team == "team-a" else 8,
                                          cohort="pool"))
    borrowers = [await cluster.submit(spec(f"b{i}", "team-b")) for i in range(12)]
    snap = await cluster.wait_for(
        lambda s: all(running(w)(s) and (view(s, w)["checkpoint"] or {}).get("step", 0) >= 5
                      for w in borrowers), 90, what="b borrows all 12")
    lender = await cluster.submit(spec("a-big", "team-a", gpus=4))
    leader = snap.leader
    assert leader is not None
    cluster.kill_controller(leader)
    # The node the victims are on loses power too, while they checkpoint.
    snap = await cluster.wait_for(lambda s: any(a.phase == "moving"
                                               for a in s.assignments.values()), 30,
                                  what="a reclaim under way")
    moving_nodes = {a.node for a in snap.assignments.values() if a.phase == "moving"}
    victim_node = sorted(n for n in moving_nodes if n)[0]
    cluster.power_off(victim_node)
    snap = await cluster.wait_for(lambda s: victim_node not in s.alive, 30, what="node down")
    print("\nafter the power-off:", view(snap, lender)["state"], view(snap, lender)["reason"])
    cluster.power_on(victim_node)  # back with its disk
    t = time.monotonic()
    snap = await cluster.wait_for(running(lender), 90, what="a runs once the node is back")
    print(f"lender running {time.monotonic() - t:.1f}s after the power-on of {victim_node}")
    b_running = sum(1 for w in borrowers if running(w)(snap))
    print("b running:", b_running, "a node:", view(snap, lender)["node"])
    assert b_running >= 8, "b keeps its own quota"
    for wid in [*borrowers, lender]:
        assert_never_two_copies(cluster, wid)

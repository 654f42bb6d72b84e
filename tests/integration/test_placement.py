"""Load-balanced placement on a live cluster: spread, re-spread after a node dies, new nodes
first, constraints honoured, and the unplaceable kept pending with the reason."""

from __future__ import annotations

from collections import Counter

import pytest

from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view
from hafo.store import read_events

from .conftest import ClusterFactory

pytestmark = pytest.mark.timeout(150)

SLEEPER = ["sleep", "600"]


def spec(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "command": SLEEPER, "gpus": 1, "stop_grace": 1, **extra}


def per_node(snapshot: ClusterSnapshot, ids: list[str]) -> Counter[str]:
    return Counter(workload_view(snapshot, w)["node"] for w in ids)


def all_running(ids: list[str], avoid: str | None = None) -> object:
    def check(s: ClusterSnapshot) -> bool:
        return all(workload_view(s, w)["state"] == "running"
                   and workload_view(s, w)["node"] != avoid for w in ids)
    return check


async def test_spread_respread_new_node_first_and_constraints(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=1, gpus_per_node=8)
    ids = [await cluster.submit(spec(f"w{i:02d}")) for i in range(12)]
    snapshot = await cluster.wait_for(all_running(ids), 40, what="12 running")
    assert sorted(per_node(snapshot, ids).values()) == [4, 4, 4]

    cluster.power_off("node-3")
    snapshot = await cluster.wait_for(all_running(ids, avoid="node-3"), 40,
                                      what="re-spread after node-3 died")
    assert per_node(snapshot, ids) == {"node-1": 6, "node-2": 6}

    cluster.add_node("node-4")
    cluster.start_node("node-4")
    await cluster.wait_for(lambda s: s.node_state("node-4") == "ready", 30, what="node-4")
    new = [await cluster.submit(spec(f"n{i}")) for i in range(6)]
    snapshot = await cluster.wait_for(all_running(new), 40, what="new work running")
    assert per_node(snapshot, new) == {"node-4": 6}, "the new node gets new work first"
    extra = await cluster.submit(spec("balanced"))
    snapshot = await cluster.wait_for(all_running([extra]), 30, what="7th running")
    assert workload_view(snapshot, extra)["node"] in ("node-1", "node-2", "node-4")

    h100 = await cluster.submit(spec("h100", gpu_model="*H100*", gpu_memory_mib=80000))
    a100 = await cluster.submit(spec("a100", gpu_model="*A100*"))
    huge = await cluster.submit(spec("huge", gpu_memory_mib=200000))
    snapshot = await cluster.wait_for(
        lambda s: all_running([h100])(s)  # type: ignore[operator]
        and all(workload_view(s, w)["state"] == "pending" and workload_view(s, w)["reason"]
                for w in (a100, huge)), 30, what="constraints decided")
    for wid, names in ((a100, "*A100*"), (huge, "200000 MiB")):
        reason = workload_view(snapshot, wid)["reason"]
        assert "no node fits" in reason and names in reason, reason
    events = [e for e in await read_events(cluster.store, cluster.keys, 0)
              if e.workload == a100 and e.kind == "pending"]
    assert events and "no node fits" in events[0].message

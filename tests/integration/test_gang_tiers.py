"""Tiered checkpoints through hafo, end to end: a real 3-member DDP gang (examples/ddp_train.py
--tiers, real torchrun, a real local cluster with a spare node) that snapshots every step into
its nodes' RAM and its peers', and to disk only every 1000 steps: so every resume here comes
from RAM.

Power loss of a member's node (its RAM goes with it, as on a machine): the member moves to
the spare, which fetches the lost rank's snapshot from the RAM of the node that held its copy
(``peer``); the survivors read theirs from their own node's RAM (``own``); every rank gets
back exactly its own state, at most one step behind the last step the gang logged. A member's
process killed: the gang restarts in place, every rank from its own node's RAM.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from hafo.checkpoint.format import NAME_RE, scan_refs
from hafo.checkpoint.memory_store import PLACES, RANK_DIR_RE
from hafo.local.cluster import LocalCluster
from hafo.local.procs import descendants
from hafo.model.views import workload_view
from hafo.render import render_workload

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies
from .test_gangs import (
    SPARE,
    _is_worker,
    ddp_spec,
    gang_cluster,
    members,
    resumed_from,
    steps,
    training,
    wait_steps,
)

pytestmark = pytest.mark.timeout(300)


def tiered_spec(name: str, nodes: int) -> dict[str, Any]:
    """The DDP example as a gang with tiered checkpoints, durable only every 1000 steps."""
    spec = ddp_spec(name, nodes=nodes)
    spec["command"] = [*spec["command"][:-4], "--every", "1000", "--sleep", "0.05", "--tiers"]
    return spec


def starts(cluster: LocalCluster, wid: str, epoch: int) -> dict[int, dict[str, Any]]:
    """Every rank's ``start`` line of ``epoch``."""
    return {line["rank"]: line for line in cluster.progress_log(wid)
            if line.get("event") == "start" and line["epoch"] == epoch}


def assert_each_rank_got_its_own(cluster: LocalCluster, wid: str, epoch: int,
                                 nodes: int) -> int:
    """Every rank of ``epoch`` restored its own stream at the same step; that step."""
    begun = starts(cluster, wid, epoch)
    assert sorted(begun) == list(range(nodes)), begun
    step = resumed_from(cluster, wid, epoch)
    for rank, line in begun.items():
        restored = line["restored"]
        assert restored is not None, line
        assert restored["rank"] == rank
        assert restored["seen"] == 64 * step  # its own stream went this far, no further
    assert len({line["restored"]["rng"] for line in begun.values()}) == nodes
    return step


def assert_not_back_at_the_start(cluster: LocalCluster, wid: str, epoch: int) -> None:
    """The epoch's first loss is far below the gang's very first (its model was restored)."""
    first = next(s for s in steps(cluster, wid) if s["rank"] == 0)["loss"]
    resumed = next(s for s in steps(cluster, wid, epoch) if s["rank"] == 0)["loss"]
    assert resumed < first / 2, (first, resumed)


def assert_ram_bounded(cluster: LocalCluster, wid: str) -> None:
    """At most two snapshots per rank and place in any node's RAM (three while one is
    written)."""
    for handle in cluster.node_handles.values():
        assert handle.memory_dir is not None
        for place in PLACES:
            base = handle.memory_dir / wid / place
            for entry in (os.listdir(base) if base.is_dir() else []):
                if RANK_DIR_RE.match(entry):
                    assert len(scan_refs(base / entry, NAME_RE)) <= 3, (handle.name, entry)


async def test_power_loss_restores_the_lost_rank_from_its_peers_ram(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=3)
    wid = await cluster.submit(tiered_spec("tiers-power", nodes=3))
    snapshot = before = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    await wait_steps(cluster, wid, epoch, 20)
    lost = members(before, wid)[1][1]  # rank 1's node
    cluster.power_off(lost)
    last_old = max(s["step"] for s in steps(cluster, wid, epoch))
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    new = workload_view(snapshot, wid)
    assert [(r, n) for r, n, _ in members(snapshot, wid)][1] == (1, SPARE)
    await wait_steps(cluster, wid, new["epoch"], 5)
    begun = starts(cluster, wid, new["epoch"])
    assert {rank: line["tier"] for rank, line in begun.items()} == {
        0: "own", 1: "peer", 2: "own"}
    resumed = assert_each_rank_got_its_own(cluster, wid, new["epoch"], 3)
    assert last_old - 1 <= resumed <= last_old + 1, (resumed, last_old)  # one step at most
    assert_not_back_at_the_start(cluster, wid, new["epoch"])
    snapshot = await cluster.wait_for(
        lambda s: all(m["restored"] for m in workload_view(s, wid)["members"]), 30,
        what="every member's restore reported")
    shown = workload_view(snapshot, wid)
    assert [(m["restored"]["tier"], m["restored"]["step"]) for m in shown["members"]] == [
        ("own", resumed), ("peer", resumed), ("own", resumed)]
    text = render_workload(shown)  # what `hafo show` prints
    assert f"step {resumed} from peer RAM" in text and f"step {resumed} from own RAM" in text
    assert_ram_bounded(cluster, wid)
    assert new["restarts"] == 0
    assert_never_two_copies(cluster, wid)


async def test_a_member_crash_restarts_the_gang_from_its_own_ram(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(tiered_spec("tiers-crash", nodes=2))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    await wait_steps(cluster, wid, epoch, 15)
    node = members(snapshot, wid)[1][1]
    workers = [p for p in descendants(cluster.node_handles[node].agent_pid() or 0)
               if _is_worker(p)]
    assert workers, "the member's training process"
    os.kill(workers[0], signal.SIGKILL)
    last_old = max(s["step"] for s in steps(cluster, wid, epoch))
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    await wait_steps(cluster, wid, view["epoch"], 5)
    begun = starts(cluster, wid, view["epoch"])
    assert {line["tier"] for line in begun.values()} == {"own"}, begun
    resumed = assert_each_rank_got_its_own(cluster, wid, view["epoch"], 2)
    assert last_old - 1 <= resumed <= last_old + 1, (resumed, last_old)  # one step at most
    assert_ram_bounded(cluster, wid)
    assert_never_two_copies(cluster, wid)

"""Sharded gang checkpoints through hafo, end to end: a real 2-member DDP gang
(examples/ddp_train.py --sharded, real torchrun, a real local cluster with a spare node) in
which every member saves a shard of its own and rank 0 commits it.

A drain of a member's node: the member moves to the spare, and every rank resumes from the
step the gang stopped at (a planned move loses no step), each from its own shard. Power loss
of rank 0's node (the member that writes the commit record, killed wherever it is, maybe in
the middle of a save): the gang resumes on the spare from the newest committed checkpoint, the
same step on every rank, each from its own shard; never two epochs alive.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hafo.checkpoint.codec import unflatten
from hafo.checkpoint.format import CheckpointRef, read_checkpoint
from hafo.checkpoint.sharded import (
    COMMIT,
    gang_dir_name,
    list_sharded_checkpoints,
    read_commit,
)
from hafo.local.cluster import LocalCluster
from hafo.model.views import workload_view
from hafo.store import intents, read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies
from .test_gangs import (
    SPARE,
    assert_loss_goes_on,
    ddp_spec,
    gang_cluster,
    members,
    resumed_from,
    steps,
    training,
    wait_steps,
)

pytestmark = pytest.mark.timeout(300)


def sharded_spec(name: str) -> dict[str, Any]:
    """The DDP example as a 2-member gang in which every member saves its own shard. It keeps
    every checkpoint: the gang saves every 10 steps, about one a second here, so with the
    default three kept, the old epoch's checkpoints the test reads back would be pruned a few
    seconds into the new epoch."""
    spec = ddp_spec(name, nodes=2)
    spec["command"] = [*spec["command"], "--sharded", "--keep-last", "1000"]
    return spec


def lines(cluster: LocalCluster, wid: str, epoch: int, event: str) -> list[dict[str, Any]]:
    """The progress lines of ``epoch`` with ``event``."""
    return [line for line in cluster.progress_log(wid)
            if line.get("event") == event and line["epoch"] == epoch]


def shard_on_disk(root: Path, epoch: int, step: int, rank: int) -> dict[str, Any]:
    """What ``rank`` wrote as its own part in the committed gang checkpoint of ``epoch`` and
    ``step``, read from disk (verified) and summarised the way the example logs it."""
    gang = root / gang_dir_name(epoch, step)
    record = read_commit(gang)
    assert (record["epoch"], record["step"], record["world_size"]) == (epoch, step, 2)
    tree, blobs = read_checkpoint(
        CheckpointRef(epoch, step, gang / record["shards"][rank]["path"]))
    own = unflatten(tree, list(blobs))["own"]
    rng = np.asarray(own["rng"]).tobytes()
    return {"rank": int(own["rank"]), "seen": int(own["seen"]),
            "loss_sum": float(own["loss_sum"]), "rng": hashlib.sha256(rng).hexdigest()[:16]}


def assert_each_rank_restored_its_own(cluster: LocalCluster, wid: str, old: int, new: int,
                                      step: int) -> None:
    """Every rank of epoch ``new`` restored, from the checkpoint of epoch ``old`` at ``step``,
    exactly what that rank wrote there (and what it logged saving, where it lived to log it);
    the two ranks' parts differ."""
    root = cluster.checkpoint_root / wid
    starts = {line["rank"]: line for line in lines(cluster, wid, new, "start")}
    assert sorted(starts) == [0, 1], starts
    saved = {line["rank"]: line["own"] for line in lines(cluster, wid, old, "saved")
             if line["step"] == step}
    for rank in (0, 1):
        restored = starts[rank]["restored"]
        assert restored is not None, starts[rank]
        assert restored["rank"] == rank
        assert restored == shard_on_disk(root, old, step, rank)
        if rank in saved:
            assert restored == saved[rank]
        assert restored["seen"] == 64 * step  # its own stream went this far, no further
    assert starts[0]["restored"]["rng"] != starts[1]["restored"]["rng"]
    assert starts[0]["restored"]["loss_sum"] != starts[1]["restored"]["loss_sum"]


async def test_a_drain_moves_a_sharded_gang_with_no_step_lost(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(sharded_spec("sharded-drain"))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    before = members(snapshot, wid)
    await wait_steps(cluster, wid, epoch, 15)
    node = before[1][1]  # rank 1's node
    moved = await intents.drain(cluster.store, cluster.keys, node)
    assert moved == [wid]
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    after = members(snapshot, wid)
    assert [(r, n) for r, n, _ in after] == [(0, before[0][1]), (1, SPARE)], after
    await wait_steps(cluster, wid, view["epoch"], 5)

    last_old = max(s["step"] for s in steps(cluster, wid, epoch))
    preempted = lines(cluster, wid, epoch, "preempted")
    assert sorted((p["rank"], p["step"]) for p in preempted) == [(0, last_old), (1, last_old)]
    root = cluster.checkpoint_root / wid
    assert (root / gang_dir_name(epoch, last_old) / COMMIT).is_file()
    assert resumed_from(cluster, wid, view["epoch"]) == last_old  # zero steps lost
    assert_each_rank_restored_its_own(cluster, wid, epoch, view["epoch"], last_old)
    kinds = [e.kind for e in await read_events(cluster.store, cluster.keys, 0)
             if e.workload == wid]
    assert "checkpoint-requested" in kinds and "moved" in kinds
    assert view["restarts"] == 0
    assert_never_two_copies(cluster, wid)


async def test_power_loss_resumes_a_sharded_gang_from_the_newest_commit(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(sharded_spec("sharded-power"))
    snapshot = before = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = workload_view(snapshot, wid)["epoch"]
    await wait_steps(cluster, wid, epoch, 25)
    lost = members(before, wid)[0][1]  # rank 0's node: the member that commits
    cluster.power_off(lost)
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    new = workload_view(snapshot, wid)
    ranks = members(snapshot, wid)
    assert [(r, n) for r, n, _ in ranks] == [(0, SPARE), (1, members(before, wid)[1][1])]
    root = cluster.checkpoint_root / wid
    committed = [ref.step for ref in list_sharded_checkpoints(root) if ref.epoch == epoch]
    assert committed, "the old epoch committed no checkpoint"
    newest = max(committed)
    assert newest >= 20  # saves every 10 steps; 25 were done

    await wait_steps(cluster, wid, new["epoch"], 10)
    assert resumed_from(cluster, wid, new["epoch"]) == newest  # the same step on every rank
    assert_each_rank_restored_its_own(cluster, wid, epoch, new["epoch"], newest)
    assert_loss_goes_on(cluster, wid, epoch, new["epoch"])
    # The gang commits again in its new epoch, on its new nodes.
    await cluster.wait_for(
        lambda _: any(ref.epoch == new["epoch"] for ref in list_sharded_checkpoints(root)),
        30, what="a checkpoint of the new epoch")
    assert new["restarts"] == 0  # a lost node is not the job's failure
    assert_never_two_copies(cluster, wid)

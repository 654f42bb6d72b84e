"""Issue 28, finding 3, through the controller's loops on the in-memory store in virtual time:
when every node reports its (shared) checkpoint filesystem full, no workload is stopped or
moved and the leader says so once (a ``cluster-condition`` event, ``hafo_cluster_condition``);
when one node alone reports it, that node's work is moved as before."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from hafo.controller.daemon import Controller
from hafo.decisions.shared_faults import SETTLE
from hafo.model import health as h
from hafo.model.cluster import Gpu, Liveness, NodeRecord, ResourceFault
from hafo.model.config import parse_config
from hafo.model.spec import parse_spec
from hafo.store import Keys, codec, intents
from hafo.store.memory import MemoryStore

from .virtual_time import run, stop, wait_for

TTL = 3
NODES = ("a", "b", "c", "d")
FULL = ResourceFault(h.DISK_FULL, "checkpoint root /shared/ckpt",
                     "disk full (/shared/ckpt: 49.9 MiB free of 50 MiB required): checkpoint "
                     "filesystem nearly full")


async def start_node(store: MemoryStore, keys: Keys, name: str) -> tuple[NodeRecord, Any]:
    """A node record and a liveness key on a lease kept alive (what an agent writes)."""
    lease, _ = await store.grant_lease(TTL)
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{name}-{i}", model="H100", memory_mib=80_000)
                 for i in range(2))
    record = NodeRecord(name=name, gpus=gpus, lease=lease)
    await store.put(keys.node(name), codec.encode(record.to_dict()))
    await store.put(keys.alive(name), codec.encode(Liveness(node=name, lease=lease,
                                                            since=0.0).to_dict()), lease=lease)

    async def keep() -> None:
        while True:
            await asyncio.sleep(1.0)
            await store.keepalive(lease, 1.0)

    return record, asyncio.create_task(keep())


async def scenario(faulty: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any],
                                                     list[str], float | None]:
    """Four nodes, one 2-GPU workload on each; then ``faulty`` report FULL for a while.
    Returns the assignments before and after (workload -> (node, epoch, phase)), the event
    kinds, and the hafo_cluster_condition sample."""
    store = MemoryStore()
    config = parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                           "controller": {"name": "ctl-1"},
                           "timing": {"lease_ttl": TTL, "failsafe_max": 0}}, "controller")
    controller = Controller(config, clock=asyncio.get_running_loop().time, store=store)
    keys = controller.keys
    started = [await start_node(store, keys, n) for n in NODES]
    task = asyncio.create_task(controller.run())
    ids = [(await intents.submit(store, keys, parse_spec(
        {"name": f"train-{i}", "command": ["python", "train.py"], "gpus": 2}))).submission.id
        for i in range(len(NODES))]

    async def assignments() -> dict[str, Any]:
        found = {}
        for wid in ids:
            kv = await store.get(keys.assignment(wid))
            if kv is not None:
                a = codec.decode_assignment(kv.value, kv.mod_revision)
                found[wid] = (a.node, a.epoch, a.phase)
        return found

    async def all_placed() -> dict[str, Any] | None:
        found = await assignments()
        return found if len(found) == len(ids) and all(
            phase == "placed" for _, _, phase in found.values()) else None

    before = await wait_for(all_placed, 10.0)
    for record, _ in started:
        if record.name in faulty:
            sick = replace(record, resource_faults=(FULL,))
            await store.put(keys.node(record.name), codec.encode(sick.to_dict()))
    await asyncio.sleep(3 * SETTLE)
    after = await assignments()
    kinds = [codec.decode_event(kv.value).kind
             for kv in (await store.get_prefix(keys.events))[1]]
    sample = controller.registry.get_sample_value(
        "hafo_cluster_condition", {"kind": h.DISK_FULL, "resource": FULL.resource})
    await stop(task)
    for _, keeper in started:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
    return before, after, kinds, sample


def test_a_fault_every_node_shares_stops_and_moves_no_work() -> None:
    async def main() -> None:
        before, after, kinds, sample = await scenario(NODES)
        assert after == before  # same node, same epoch, still placed: nothing stopped
        assert kinds.count("cluster-condition") == 1
        assert "failover" not in kinds and not any("unhealthy" in k for k in kinds)
        assert sample == 1.0

    run(main)


def test_a_fault_of_one_node_alone_moves_its_work_as_before() -> None:
    async def main() -> None:
        before, after, kinds, sample = await scenario(("a",))
        on_a = [wid for wid, (node, _, _) in before.items() if node == "a"]
        assert len(on_a) == 1
        assert after[on_a[0]] != before[on_a[0]]  # moving off a (or placed elsewhere)
        assert {w: v for w, v in after.items() if w not in on_a} == \
            {w: v for w, v in before.items() if w not in on_a}
        assert "cluster-condition" not in kinds and sample is None

    run(main)

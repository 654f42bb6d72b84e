"""Simulated work (``hafo.sim.fleet``): an instance given a runtime completes with code 0 once
its workload has done that much work; a planned stop reports ``stopping`` for the checkpoint
time, then exits with a checkpoint of the work done, which the next instance resumes from; an
urgent stop exits at once and loses the work since the last checkpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

import pytest

from hafo.model.cluster import Assignment, InstanceStatus
from hafo.sim.fleet import SimFleet
from hafo.store import EtcdStore, Keys, codec
from hafo.store.memory import MemoryStore

KEYS = Keys("simwork")


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def assign(store: MemoryStore, node: str, assignment: Assignment) -> None:
    await store.put(KEYS.node_assignment(node, assignment.workload),
                    codec.encode(assignment.to_dict()))


async def status(store: MemoryStore, workload: str, node: str) -> InstanceStatus | None:
    kv = await store.get(KEYS.status(workload, node))
    return None if kv is None else codec.decode_status(kv.value)


@pytest.fixture
async def fleet_and_store() -> tuple[SimFleet, MemoryStore, list[InstanceStatus]]:
    store = MemoryStore()
    reports: list[InstanceStatus] = []
    runtimes = {"short": 0.3, "long": 1.0}
    fleet = SimFleet(cast(EtcdStore, store), KEYS, 1, gpus_per_node=2, prefix="s",
                     runtime=runtimes.get, checkpoint=0.2, on_report=reports.append)
    return fleet, store, reports


async def test_an_instance_completes_after_its_runtime(
        fleet_and_store: tuple[SimFleet, MemoryStore, list[InstanceStatus]]) -> None:
    fleet, store, reports = fleet_and_store
    await fleet.start()
    runner = asyncio.create_task(fleet.run())
    try:
        node = next(iter(fleet.nodes))
        await assign(store, node, Assignment(workload="short", phase="placed", node=node,
                                             gpus=(0,)))
        await assign(store, node, Assignment(workload="forever", phase="placed", node=node,
                                             gpus=(1,)))
        await wait_for(lambda: "short" in fleet.finished)
        ran = fleet.finished["short"] - fleet.started["short"]
        assert 0.3 <= ran < 0.6
        done = await status(store, "short", node)
        assert done is not None and done.state == "exited" and done.exit_code == 0
        assert [(r.workload, r.state) for r in reports] == [
            ("forever", "running"), ("short", "running"), ("short", "exited")] or [
            (r.workload, r.state) for r in reports] == [
            ("short", "running"), ("forever", "running"), ("short", "exited")]
        forever = await status(store, "forever", node)
        assert forever is not None and forever.state == "running"  # no runtime: runs on
        # the controller finishes it: its copy goes, and so does its report
        await store.delete(KEYS.node_assignment(node, "short"))
        await wait_for(lambda: "short" not in fleet.nodes[node].exited)
        assert await status(store, "short", node) is None
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_planned_stop_checkpoints_and_the_next_instance_resumes(
        fleet_and_store: tuple[SimFleet, MemoryStore, list[InstanceStatus]]) -> None:
    fleet, store, reports = fleet_and_store
    await fleet.start()
    runner = asyncio.create_task(fleet.run())
    try:
        node = next(iter(fleet.nodes))
        await assign(store, node, Assignment(workload="long", phase="placed", node=node,
                                             gpus=(0,)))
        await wait_for(lambda: "long" in fleet.nodes[node].running)
        epoch = fleet.nodes[node].running["long"]
        await asyncio.sleep(0.4)
        asked = time.time()
        await assign(store, node, Assignment(workload="long", phase="moving", node=node,
                                             gpus=(0,), stopping=epoch))
        await wait_for(lambda: any(r.state == "stopping" for r in reports))
        stopping = await status(store, "long", node)
        assert stopping is not None and stopping.state == "stopping"
        await wait_for(lambda: reports[-1].state == "exited")
        exited = reports[-1]
        assert exited.finished_at is not None and exited.finished_at - asked >= 0.2
        assert exited.checkpoint is not None and exited.checkpoint.epoch == epoch
        saved = fleet.progress["long"]
        assert 0.4 <= saved < 0.7 and exited.checkpoint.step == int(saved)
        # placed again (a new epoch): it does the rest of its second of work only
        await store.delete(KEYS.node_assignment(node, "long"))
        await assign(store, node, Assignment(workload="long", phase="placed", node=node,
                                             gpus=(1,)))
        await wait_for(lambda: "long" in fleet.finished)
        rest = fleet.finished["long"] - fleet.started["long"]
        assert rest == pytest.approx(1.0 - saved, abs=0.15)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_an_urgent_stop_exits_at_once_and_loses_the_work(
        fleet_and_store: tuple[SimFleet, MemoryStore, list[InstanceStatus]]) -> None:
    fleet, store, reports = fleet_and_store
    await fleet.start()
    runner = asyncio.create_task(fleet.run())
    try:
        node = next(iter(fleet.nodes))
        await assign(store, node, Assignment(workload="long", phase="placed", node=node,
                                             gpus=(0,)))
        await wait_for(lambda: "long" in fleet.nodes[node].running)
        epoch = fleet.nodes[node].running["long"]
        await asyncio.sleep(0.2)
        await assign(store, node, Assignment(workload="long", phase="moving", node=node,
                                             gpus=(0,), stopping=epoch, urgent=True))
        await wait_for(lambda: reports[-1].state == "exited")
        assert [r.state for r in reports] == ["running", "exited"]
        assert reports[-1].checkpoint is None and fleet.progress.get("long", 0.0) == 0.0
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


def test_an_instance_done_as_its_copy_goes_is_reported_once_per_pass() -> None:
    """Its work done in the pass that finds its copy gone: the exit is written in this pass,
    the report's deletion in the next (one key twice in a txn: etcd refuses the txn)."""
    fleet = SimFleet(cast(EtcdStore, MemoryStore()), KEYS, 1, prefix="s",
                     runtime={"w": 1.0}.get)
    node = next(iter(fleet.nodes.values()))
    node.running["w"] = 7
    fleet.started["w"] = 100.0
    first = fleet._pass(node, 101.5)
    assert [op.key for op in first] == [KEYS.status("w", node.name)]
    assert node.exited == {"w": 7} and fleet._due  # a pass is due to delete it
    second = fleet._pass(node, 101.6)
    assert [(type(op).__name__, op.key) for op in second] == [
        ("Delete", KEYS.status("w", node.name))]

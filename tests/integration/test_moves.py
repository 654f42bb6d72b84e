"""Planned moves on a live cluster: migrate and drain checkpoint first and lose no work."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import pytest

from hafo.agent.guard import catches
from hafo.local.cluster import demo_workload_spec
from hafo.model.cluster import Event
from hafo.store import intents, read_events

from .conftest import ClusterFactory
from .helpers import (
    assert_never_two_copies,
    node_process,
    running,
    start_with_workload,
    view,
)

pytestmark = pytest.mark.timeout(120)


async def migrate_and_read_stop_events(factory: ClusterFactory, spec: dict[str, object],
                                       listens: bool = False) -> list[Event]:
    """Run ``spec`` (1 GPU) on a 2-node cluster, migrate it, return its ``stopped`` events.
    ``listens``: the workload installs a SIGUSR1 handler; the move waits until it has."""
    cluster = await factory.start(nodes=2, controllers=1)
    wid = await cluster.submit({**spec, "gpus": 1})
    snapshot = await cluster.wait_for(running(wid), 20, what="running")
    source = view(snapshot, wid)["node"]
    if listens:  # "running" means started: the interpreter may not have got to its handler
        pid = snapshot.current_status(wid).pid  # type: ignore[union-attr]
        process = node_process(cluster, source, pid)
        deadline = time.monotonic() + 20
        while not catches(process.host, signal.SIGUSR1):
            assert time.monotonic() < deadline, "the workload never installed its handler"
            await asyncio.sleep(0.05)
    await intents.migrate(cluster.store, cluster.keys, wid)
    await cluster.wait_for(running(wid, not_on=source), 30, what="moved")
    return [e for e in await read_events(cluster.store, cluster.keys, 0)
            if e.workload == wid and e.kind == "stopped"]


async def resumed_exactly(cluster: Any, wid: str) -> tuple[int, int]:
    """(step the old instance checkpointed at when asked to stop, step the new one resumed
    from). Waits for the new instance's first log line: "running" means its process was
    started, not that the interpreter has got as far as logging."""
    epoch = view(await cluster.snapshot(), wid)["epoch"]
    deadline = time.monotonic() + 20
    while True:
        lines = cluster.progress_log(wid)
        starts = [ln["resumed_from"] for ln in lines
                  if ln.get("event") == "start" and ln.get("epoch") == epoch]
        if starts or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    preempted = [ln["step"] for ln in lines if ln.get("event") == "preempted"]
    assert starts, f"the instance of epoch {epoch} never logged its start"
    return preempted[-1], starts[-1]


async def test_migrate_checkpoints_stops_and_resumes_elsewhere_losing_no_steps(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=3, controllers=1)
    source, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    await cluster.wait_for(lambda s: (view(s, wid)["checkpoint"] or {}).get("step", 0) >= 10,
                           20, what="checkpointing (the SDK is listening)")
    await asyncio.sleep(0.3)  # on purpose: some steps past the last periodic checkpoint
    target = next(n for n in sorted(cluster.node_handles) if n != source)
    await intents.migrate(cluster.store, cluster.keys, wid, to=target)
    snapshot = await cluster.wait_for(running(wid, not_on=source), 30, what="moved")
    assert view(snapshot, wid)["node"] == target and view(snapshot, wid)["epoch"] > epoch
    assert view(snapshot, wid)["restarts"] == 0
    checkpointed, resumed = await resumed_exactly(cluster, wid)
    assert checkpointed == resumed, "a planned move loses no step"
    kinds = [e.kind for e in await read_events(cluster.store, cluster.keys, 0)
             if e.workload == wid]
    assert "checkpoint-requested" in kinds and "moved" in kinds and "failover" not in kinds
    stopped = [e for e in await read_events(cluster.store, cluster.keys, 0)
               if e.workload == wid and e.kind == "stopped"]
    assert stopped and f"checkpoint step {checkpointed}" in stopped[0].message
    assert_never_two_copies(cluster, wid)


async def test_drain_moves_every_workload_off_and_cordons(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    ids = [await cluster.submit(demo_workload_spec(name=f"d{i}", gpus=1)) for i in range(4)]
    # Running long enough to have checkpointed once: the SDK is loaded and listening.
    snapshot = await cluster.wait_for(
        lambda s: all(running(w)(s) and (view(s, w)["checkpoint"] or {}).get("step", 0) >= 10
                      for w in ids), 30, what="all running and checkpointing")
    node = "node-1"
    on_node = [w for w in ids if view(snapshot, w)["node"] == node]
    assert on_node, "spread placement puts work on both nodes"
    moved = await intents.drain(cluster.store, cluster.keys, node)
    assert sorted(moved) == sorted(on_node)
    snapshot = await cluster.wait_for(
        lambda s: all(running(w, not_on=node)(s) for w in ids), 40, what="drained")
    assert snapshot.node_state(node) == "cordoned"
    for wid in on_node:
        checkpointed, resumed = await resumed_exactly(cluster, wid)
        assert checkpointed == resumed
        assert_never_two_copies(cluster, wid)
    await intents.set_cordon(cluster.store, cluster.keys, node, False)
    fresh = await cluster.submit(demo_workload_spec(name="fresh", gpus=1))
    snapshot = await cluster.wait_for(running(fresh), 20, what="uncordoned takes work")
    assert view(snapshot, fresh)["node"] == node


async def test_migrate_to_a_full_node_is_refused_and_nothing_stops(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1, gpus_per_node=1)
    first = await cluster.submit(demo_workload_spec(name="one"))
    second = await cluster.submit(demo_workload_spec(name="two"))
    snapshot = await cluster.wait_for(lambda s: running(first)(s) and running(second)(s), 30,
                                      what="both running")
    other = view(snapshot, second)["node"]
    before = view(snapshot, first)
    pid = snapshot.current_status(first).pid  # type: ignore[union-attr]
    process = node_process(cluster, before["node"], pid)
    await intents.migrate(cluster.store, cluster.keys, first, to=other)
    await cluster.wait_for(lambda s: first not in s.moves, 10, what="request consumed")
    events = await read_events(cluster.store, cluster.keys, 0)
    refused = [e for e in events if e.kind == "move-refused" and e.workload == first]
    assert refused and "cannot take it" in refused[0].message
    assert not [e for e in events if e.workload == first and e.kind == "checkpoint-requested"]
    snapshot = await cluster.snapshot()
    after = view(snapshot, first)
    assert (after["state"], after["node"], after["epoch"]) == (
        "running", before["node"], before["epoch"]), "the assignment was left as it was"
    assert snapshot.current_status(first).pid == pid and process.alive()  # type: ignore[union-attr]


async def test_workload_that_does_not_checkpoint_is_stopped_anyway_and_says_so(
        local_cluster: ClusterFactory) -> None:
    stopped = await migrate_and_read_stop_events(local_cluster, {
        "name": "stubborn", "stop_grace": 1, "command": [
            sys.executable, "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: None)  # listens, never saves\n"
            "while True: time.sleep(0.05)\n"]}, listens=True)
    assert stopped and "no checkpoint within stop_grace" in stopped[0].message
    assert "resumes from the start (no checkpoint)" in stopped[0].message


async def test_transparent_mode_is_refused_with_the_reason_and_stops_normally(
        local_cluster: ClusterFactory) -> None:
    stopped = await migrate_and_read_stop_events(local_cluster, {
        "name": "opaque", "stop_grace": 2, "checkpoint": {"mode": "transparent"},
        "command": [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)\n"]})
    assert stopped and "transparent checkpoint refused: " in stopped[0].message
    assert "not found on this node" in stopped[0].message or "criu" in stopped[0].message

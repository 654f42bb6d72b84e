"""Two teams' queues sharing one pool on a live local cluster (real etcd, a controller, two
agents, the SDK's checkpointing workload): team-b borrows the idle team-a's quota, then
team-a takes it back, checkpoint first, losing no step; team-b keeps its own quota, and its
stopped work resumes where it stopped once there is room again (docs/reference/queues.md,
"Queues"; the decision: ``hafo.decisions.reclaim``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from hafo.decisions.pending_reasons import live_reasons
from hafo.local.cluster import demo_workload_spec
from hafo.model.queues import QueueSpec
from hafo.store import intents, read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, view

pytestmark = pytest.mark.timeout(240)


def spec(name: str, queue: str, gpus: int = 1) -> dict[str, object]:
    return {**demo_workload_spec(name=name, gpus=gpus), "queue": queue}


async def test_a_lender_takes_back_its_quota_checkpoint_first_losing_no_step(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1, gpus_per_node=4,
                                        controller_config={"fair_sharing": {"min_runtime": 0}})
    for team in ("team-a", "team-b"):
        await intents.set_queue(cluster.store, cluster.keys,
                                QueueSpec(name=team, gpus=4, cohort="pool"))
    borrowers = [await cluster.submit(spec(f"b{i}", "team-b")) for i in range(8)]
    await cluster.wait_for(
        lambda s: all(running(w)(s) and (view(s, w)["checkpoint"] or {}).get("step", 0) >= 10
                      for w in borrowers), 60, what="team-b borrows all 8 GPUs, checkpointing")

    submitted = time.monotonic()
    lender = await cluster.submit(spec("a-big", "team-a", gpus=4))
    snapshot = await cluster.wait_for(running(lender), 60, what="team-a's work runs")
    took = time.monotonic() - submitted

    still = [w for w in borrowers if running(w)(snapshot)]
    stopped = [w for w in borrowers if w not in still]
    assert len(still) == 4, "team-b keeps its own quota of 4"
    assert len(stopped) == 4 and len({view(snapshot, w)["node"] for w in still}) == 1
    live = live_reasons(snapshot)  # what `hafo workloads` and the API show
    for wid in stopped:
        assert "queue team-b: 4 of 4 GPUs used, needs 1; cohort pool lends 0 of 8 " \
               "(team-a uses 4 of its 4)" in live[wid], live[wid]
        assert view(snapshot, wid)["reason"].endswith(  # what is stored: no live figures
            "queue team-b: needs 1; cohort pool has too little to lend")
    events = [e for e in await read_events(cluster.store, cluster.keys, 0)
              if e.workload in stopped]
    reclaimed = [e for e in events if e.kind == "preempted"]
    assert len(reclaimed) == 4 and all("reclaimed by" in e.message for e in reclaimed)
    # The victims stopped checkpoint first: each logged its checkpoint at the stop.
    at_stop = {w: [ln["step"] for ln in cluster.progress_log(w) if ln.get("event") ==
                   "preempted"] for w in stopped}
    assert all(steps for steps in at_stop.values()), at_stop
    print(f"\nreclaim: team-a's 4 GPUs running {took:.2f}s after its submit "
          f"(4 victims checkpointed and stopped)")
    assert took < 30, "a reconcile cycle plus the victims' checkpoint-and-stop (bound: 30 s)"

    # Room again: team-b's stopped work resumes exactly where it checkpointed.
    await intents.delete(cluster.store, cluster.keys, lender)
    snapshot = await cluster.wait_for(lambda s: all(running(w)(s) for w in borrowers), 60,
                                      what="team-b borrows again")
    for wid in stopped:
        epoch = view(snapshot, wid)["epoch"]
        deadline = time.monotonic() + 20
        while True:
            starts = [ln["resumed_from"] for ln in cluster.progress_log(wid)
                      if ln.get("event") == "start" and ln.get("epoch") == epoch]
            if starts or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert starts == [at_stop[wid][-1]], (wid, starts, at_stop[wid])  # no step lost
        assert view(snapshot, wid)["restarts"] == 0
    for wid in borrowers:
        assert_never_two_copies(cluster, wid)


async def test_a_gang_is_reclaimed_whole_and_waits_whole(local_cluster: ClusterFactory) -> None:
    """team-b runs a 2x2 gang (lowest priority) and four singles, 8 GPUs of its 4; team-a
    asks for 2: the gang is the fewest victims on one node, and every member stops (one
    epoch ends); it then waits whole, holding no GPU, with its queue's reason."""
    cluster = await local_cluster.start(nodes=2, controllers=1, gpus_per_node=4,
                                        controller_config={"fair_sharing": {"min_runtime": 0}})
    for team in ("team-a", "team-b"):
        await intents.set_queue(cluster.store, cluster.keys,
                                QueueSpec(name=team, gpus=4, cohort="pool"))
    gang = await cluster.submit({**spec("bg", "team-b", gpus=2), "nodes": 2, "priority": -1})
    await cluster.wait_for(running(gang), 60, what="team-b's gang runs")
    singles = [await cluster.submit(spec(f"s{i}", "team-b")) for i in range(4)]
    await cluster.wait_for(lambda s: all(running(w)(s) for w in singles), 60,
                           what="team-b borrows all 8")
    lender = await cluster.submit(spec("a-small", "team-a", gpus=2))
    snapshot = await cluster.wait_for(running(lender), 60, what="team-a's work runs")
    assert all(running(w)(snapshot) for w in singles), "only the gang was reclaimed"
    gang_view = view(snapshot, gang)
    assert gang_view["state"] == "pending" and gang_view["members"] == [], gang_view
    assert "queue team-b: 4 of 4 GPUs used, needs 4" in live_reasons(snapshot)[gang]
    events = [e for e in await read_events(cluster.store, cluster.keys, 0)
              if e.workload == gang and e.kind == "preempted"]
    assert len(events) == 1 and "reclaimed by" in events[0].message
    assert_never_two_copies(cluster, gang)

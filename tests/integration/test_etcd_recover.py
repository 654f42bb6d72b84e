"""etcd loses its data and there is no backup (issue 28, finding 2): the agents publish what
they run into the store that is not their cluster (``Keys.report``), and ``hafo recover
--from-agents`` rebuilds every workload's spec, name and assignment from those reports.
Every workload then runs again where it ran, with its spec, at an epoch higher than every
epoch before the loss, never two copies, its restarts not counted."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from hafo.local.cluster import demo_workload_spec, lose_etcd_data
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, view
from .test_etcd_data_loss import hafo
from .test_etcd_restart import five_workloads


def members_of(snapshot: object, wid: str) -> list[tuple[int, str]]:
    return sorted((m["rank"], m["node"]) for m in view(snapshot, wid)["members"])  # type: ignore[arg-type]


@pytest.mark.timeout(300)
async def test_etcd_restarted_empty_without_a_backup_is_recovered_from_the_agents(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2, etcd_members=1,
                                        failsafe_max=60)
    wids, before = await five_workloads(cluster)
    gang = await cluster.submit({**demo_workload_spec(name="g", gpus=1), "nodes": 2})
    snapshot = await cluster.wait_for(running(gang), 30, what="the gang running")
    gang_members, gang_epoch = members_of(snapshot, gang), view(snapshot, gang)["epoch"]
    everything = [*wids, gang]
    specs = {w: snapshot.workloads[w] for w in everything}
    where = {w: view(snapshot, w)["node"] for w in wids}
    highest = max(view(snapshot, w)["epoch"] for w in everything)
    await lose_etcd_data(cluster)
    lost_at = time.monotonic()

    # Every agent publishes what it runs: five workloads and the gang's two members.
    deadline = time.monotonic() + 20
    while True:
        _, kvs = await cluster.store.get_prefix(cluster.keys.reports)
        reports = [json.loads(kv.value) for kv in kvs]
        reported = sorted(i["workload"] for r in reports for i in r["instances"])
        if len(reports) == 3 and reported == sorted([*wids, gang, gang]):
            break
        assert time.monotonic() < deadline, f"reports: {reports}"
        await asyncio.sleep(0.5)
    assert all(kv.lease == 0 for kv in kvs), "a plain put: the store's leases are not ours"
    dead = [w for w, (_n, _e, process) in before.items() if not process.alive()]
    assert not dead, f"killed after etcd lost its data: {dead}"

    # The plan, printed; nothing written without --yes.
    plan = hafo(cluster, "recover", "--from-agents")
    assert plan.returncode == 0, plan.stderr
    for w in everything:
        assert f"({w}) on " in plan.stdout, plan.stdout
    for w in wids:
        assert f"({w}) on {where[w]} (GPUs" in plan.stdout, plan.stdout
    assert "nothing written" in plan.stdout and "not rebuilt" not in plan.stdout, plan.stdout
    assert (await cluster.wait_for(lambda s: True, 5)).workloads == {}, "nothing written"

    done = hafo(cluster, "recover", "--from-agents", "--yes")
    assert done.returncode == 0 and "6 workload(s) and 0 service(s) recovered" in done.stdout, (
        done.stdout, done.stderr)
    again = hafo(cluster, "recover", "--from-agents", "--yes")
    assert again.returncode == 5 and "--replace" in again.stderr, "refused over keys"

    try:
        snapshot = await cluster.wait_for(
            lambda s: all(running(w)(s) for w in everything)
            and all(not before[w][2].alive() for w in wids)
            and all(view(s, w)["epoch"] > highest for w in everything), 90,
            what="every workload running again, recovered, at a higher epoch")
    except TimeoutError:
        snapshot = await cluster.snapshot()
        seen = {w: {k: view(snapshot, w)[k] for k in ("state", "node", "epoch", "reason")}
                for w in everything}
        events = [f"{e.kind}: {e.message}" for e in await read_events(
            cluster.store, cluster.keys, 300)]
        raise AssertionError(f"not recovered (epochs before: up to {highest}): {seen}; "
                             f"events: {events[-40:]}") from None
    print(f"every workload running again {time.monotonic() - lost_at:.1f}s after etcd lost "
          "its data")
    for w in wids:
        assert view(snapshot, w)["node"] == where[w], "on the node it ran on"
    assert members_of(snapshot, gang) == gang_members, "each member where it ran"
    assert view(snapshot, gang)["epoch"] > gang_epoch
    for w in everything:
        assert snapshot.workloads[w] == specs[w], "its spec, as submitted"
        name = await cluster.store.get(cluster.keys.name(specs[w].spec.name))
        assert name is not None and name.value.decode() == w
        assert view(snapshot, w)["restarts"] == 0, "infrastructure: not counted"
        assert_never_two_copies(cluster, w)
    kinds = [e.kind for e in await read_events(cluster.store, cluster.keys, 300)]
    assert "store-untrusted" in kinds and "store-trusted" in kinds, kinds
    assert hafo(cluster, "status").returncode == 0
    # The agents forget their reports once the store is the cluster again.
    deadline = time.monotonic() + 10
    while (await cluster.store.get_prefix(cluster.keys.reports))[1]:
        assert time.monotonic() < deadline, "reports left behind"
        await asyncio.sleep(0.5)

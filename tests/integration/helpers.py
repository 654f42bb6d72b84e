"""Shared checks for cluster tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hafo.local.cluster import LocalCluster
from hafo.local.progress import overlaps
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view


def view(snapshot: ClusterSnapshot, wid: str) -> dict[str, Any]:
    """The workload's contract view."""
    return workload_view(snapshot, wid)


def running(wid: str, not_on: str | None = None) -> Any:
    """Predicate: the workload runs (on another node than ``not_on``)."""
    def check(snapshot: ClusterSnapshot) -> bool:
        v = workload_view(snapshot, wid)
        return bool(v["state"] == "running" and v["node"] is not None and v["node"] != not_on)
    return check


def assert_never_two_copies(cluster: LocalCluster, wid: str) -> None:
    """Logged lifetimes of the workload's epochs never overlap."""
    found = overlaps(cluster.progress_log(wid))
    assert not found, f"epochs alive at the same time: {found}"


async def start_with_workload(factory: Any, **kwargs: Any) -> tuple[LocalCluster, str,
                                                                   ClusterSnapshot]:
    """A started local cluster running one built-in workload: (cluster, id, snapshot)."""
    from hafo.local.cluster import demo_workload_spec

    cluster = await factory.start(**kwargs)
    wid = await cluster.submit(demo_workload_spec())
    snapshot = await cluster.wait_for(running(wid), 20, what="running")
    return cluster, wid, snapshot


def started_cluster(base_dir: Path, **kwargs: Any) -> Iterator[LocalCluster]:
    """A ready local cluster for a module-scoped fixture; stopped after, leaving no process."""
    local = LocalCluster(base_dir=base_dir, **kwargs)
    local.start()

    async def ready() -> None:
        try:
            await local.wait_ready(45)
        finally:
            await local.close_store()

    try:
        asyncio.run(ready())
        yield local
    finally:
        local.stop()
        assert not local.leftover_pids()

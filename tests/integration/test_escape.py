"""A process that leaves its instance every way but its cgroup is still killed with it (issue 27,
finding 2; docs/safety.md, rule 7).

The workload double-forks a grandchild in a new session that re-executes itself with an empty
environment and ignores SIGTERM (``hafo.local.workload --escape``): it is no descendant of the
guard once the guard is gone and carries no ``HAFO_*`` mark. Then the guard is SIGKILLed (as the
OOM killer may), and later the workload is deleted. Each time the escaped process must be dead
before another epoch of the workload runs, and after the delete, none may be left.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.procs import kill_pid
from hafo.store import intents
from tests.integration.conftest import ClusterFactory
from tests.integration.helpers import assert_never_two_copies, running, view

pytestmark = pytest.mark.timeout(180)


def escaped(cluster: LocalCluster, wid: str) -> dict[int, tuple[str, int, str]]:
    """Every escaped process the progress log names: epoch -> (node, pid, boot)."""
    return {int(line["epoch"]): (line["node"], int(line["pid"]), line["boot"])
            for line in cluster.progress_log(wid) if line.get("event") == "escaped"}


def alive(cluster: LocalCluster, where: tuple[str, int, str]) -> bool:
    """The escaped process still runs (same node, same boot, that number)."""
    node, pid, boot = where
    handle = cluster.node_handles[node]
    return handle.boot() in ("", boot) and handle.host_pid(pid) is not None


async def wait_escaped(cluster: LocalCluster, wid: str, epoch: int) -> tuple[str, int, str]:
    deadline = time.monotonic() + 20
    while epoch not in escaped(cluster, wid):
        assert time.monotonic() < deadline, "the workload never left its escaped process"
        await asyncio.sleep(0.1)
    return escaped(cluster, wid)[epoch]


def guard_host_pid(cluster: LocalCluster, node: str, wid: str, epoch: int) -> int:
    state: dict[str, Any] = json.loads(
        (cluster.node_handles[node].state_dir / "instances" / f"{wid}.{epoch}" / "state.json")
        .read_text())
    pid = cluster.host_pid(node, state["guard"]["pid"])
    assert pid is not None, "the guard runs"
    return pid


async def test_an_escaped_process_dies_with_its_instance(local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    if cluster.cgroup_base is None:
        pytest.skip("no cgroups here (not root, or no cgroup v2): the weaker fallback applies")
    wid = await cluster.submit(demo_workload_spec(name="escaper", escape=True))
    snapshot = await cluster.wait_for(running(wid), 30, what="running")
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    first = await wait_escaped(cluster, wid, epoch)
    assert alive(cluster, first)

    kill_pid(guard_host_pid(cluster, node, wid, epoch), signal.SIGKILL)  # as the OOM killer
    snapshot = await cluster.wait_for(
        lambda s: running(wid)(s) and view(s, wid)["epoch"] > epoch, 30,
        what="running again after its guard was killed")
    second_epoch = view(snapshot, wid)["epoch"]
    assert not alive(cluster, first), "the escaped process outlived its instance"
    second = await wait_escaped(cluster, wid, second_epoch)
    assert not alive(cluster, first) and alive(cluster, second)

    await intents.delete(cluster.store, cluster.keys, wid)
    deadline = time.monotonic() + 20
    while alive(cluster, second):
        assert time.monotonic() < deadline, "the escaped process outlived the delete"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # the log's last line is written before the process dies
    assert_never_two_copies(cluster, wid)  # no escaped line of an epoch after the next began

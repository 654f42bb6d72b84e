"""A gang's pre-flight (spec ``preflight``) on a real local cluster: the DDP example
(examples/ddp_train.py, real torchrun, gloo on the CPU) as a 3-member gang beside a spare.

One member's node is slow: every process of that node (its agent, so every guard and
workload it starts after) runs in a cgroup v1 ``cpu`` group limited to a fraction of one CPU,
as a node with a throttled or broken CPU or GPU would be. The pre-flight must name that
member before the job starts (event ``preflight-failed``, its node excluded), replace it
with the spare, pass on the new set of nodes, and exec torchrun in the pre-flight's own
process; no two epochs of the gang are ever alive at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster
from hafo.model.views import workload_view
from hafo.render import render_workload

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies
from .test_gang_hang import events_of, wait_event
from .test_gangs import SPARE, ddp_spec, gang_cluster, members, training, wait_steps

CPU_V1 = Path("/sys/fs/cgroup/cpu")
SLOW_NODE = "node-2"
#: The slow node's share of one CPU: its probe takes several times the others' (its torch
#: import, about 3 s of CPU, takes half a minute; the others wait for it to join).
SLOW_SHARE = 0.08
# A bound for liveness; in the timing lane (conftest.TIMING_MODULES): a node slowed by a CPU
# share is told from the others only on a machine not loaded by other tests.
pytestmark = pytest.mark.timeout(300)


@contextlib.contextmanager
def throttled(cluster: LocalCluster, node: str, share: float) -> Iterator[Path]:
    """Every process of ``node``, and every one born of them later, limited to ``share`` of
    one CPU (a cgroup v1 ``cpu`` group: ``cpu.cfs_quota_us``); the processes left in it are
    moved back to the root group and the group removed afterwards."""
    if not (CPU_V1 / "cpu.cfs_quota_us").exists():
        pytest.skip("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu to slow a node with")
    group = CPU_V1 / f"hafo-test-slow-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(100000 * share)))
        for pid in cluster.node_handles[node].processes().values():
            with contextlib.suppress(OSError):  # one that just exited
                (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for line in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_V1 / "cgroup.procs").write_text(line)
        with contextlib.suppress(OSError):
            group.rmdir()


def _launches(cluster: LocalCluster, wid: str) -> str:
    """What each node's instances of ``wid`` were launched with, and their progress files."""
    out = []
    for name, handle in cluster.node_handles.items():
        for path in sorted((handle.state_dir / "instances").glob(f"{wid}*")):
            launch = (path / "launch.json").read_text() if (path / "launch.json").exists() \
                else ""
            pre = '"preflight"' in launch
            files = sorted(p.name for p in (path / "progress").glob("*"))
            out.append(f"{name}/{path.name}: preflight in launch {pre}, progress {files}")
    return "\n".join(out)


def preflight_spec(name: str, **extra: Any) -> dict[str, Any]:
    return ddp_spec(name, nodes=3, preflight={"timeout": 90, "slowdown": 3}, **extra)


async def test_a_slow_member_is_replaced_before_the_job_starts(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=3)
    with throttled(cluster, SLOW_NODE, SLOW_SHARE):
        wid = await cluster.submit(preflight_spec("pf"))
        failed = await wait_event(cluster, wid, 0, "pre-flight failed", timeout=150)
        assert failed.kind == "preflight-failed"
        assert f"(on {SLOW_NODE}), {SLOW_NODE} excluded for 600s; not counted" \
            in failed.message, failed.message
        assert "probe took" in failed.message, failed.message
        snapshot = await cluster.wait_for(training(wid), 150, what="gang training")
    view = workload_view(snapshot, wid)
    ranks = members(snapshot, wid)
    assert SLOW_NODE not in {n for _, n, _ in ranks}, ranks
    assert SPARE in {n for _, n, _ in ranks}, ranks
    assert view["restarts"] == 0  # a slow node is not the job's failure
    # no step of the first epoch: the job never started on the slow node's gang
    await wait_steps(cluster, wid, view["epoch"], 5)
    first_epoch_steps = [line for line in cluster.progress_log(wid)
                         if line.get("event") == "step" and line["epoch"] < view["epoch"]]
    assert first_epoch_steps == []
    # each member passed (a member is running from its pre-flight's start: its report comes
    # once the test is over), and its command runs in the pre-flight's own process
    view = workload_view(await cluster.snapshot(), wid)
    for member in view["members"]:
        report = member["preflight"]
        assert report is not None and report["passed"], (member, _launches(cluster, wid))
        assert report["compute"] is not None
    text = render_workload(view)
    assert "PRE-FLIGHT" in text and "passed in" in text, text
    snapshot = await cluster.snapshot()
    for rank, node, _ in members(snapshot, wid):
        status = snapshot.statuses[(wid, node)]
        assert status.pid is not None
        pid = cluster.node_handles[node].host_pid(status.pid) or status.pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert any(b"torchrun" in a for a in argv), (rank, argv)
    kinds = [e.kind for e in await events_of(cluster, wid)]
    assert kinds.count("preflight-failed") == 1, kinds
    assert_never_two_copies(cluster, wid)

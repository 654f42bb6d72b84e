"""A node's state directory turns read-only under a running workload (a failing disk
remounted read-only), for real: a read-only bind mount over it (needs root). The agent stays
up, reports the node unhealthy with the path and the error, its work moves with never two
copies alive, and once the directory is writable again the node is ready and takes work
(docs/safety.md, "The agent and its environment")."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.procs import pid_alive

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, start_with_workload, view

pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=15, check=False)


def on_node(cluster: LocalCluster, node: str) -> list[str]:
    """The prefix that runs a command in the node's mount namespace (a simulated node has its
    own, as a machine has its own mounts; none: the host's)."""
    handle = cluster.node_handles[node]
    if not handle.isolated:
        return []
    init = handle.processes().get(1)
    assert init is not None, "the node has a PID 1 of its own"
    return ["nsenter", "-t", str(init), "-m", "--"]


@contextlib.contextmanager
def read_only(cluster: LocalCluster, node: str, path: Path) -> Iterator[None]:
    """``path`` read-only for every process of the node (root included) until the block
    ends: a bind mount of it over itself in the node's mounts, remounted read-only; unmounted
    after, whatever happens."""
    there = on_node(cluster, node)
    bound = _run(*there, "mount", "--bind", str(path), str(path))
    if bound.returncode != 0:
        pytest.skip(f"mount --bind not permitted here: {bound.stderr.strip()}")
    try:
        done = _run(*there, "mount", "-o", "remount,bind,ro", str(path))
        assert done.returncode == 0, done.stderr
        yield
    finally:
        if _run(*there, "umount", str(path)).returncode != 0:
            _run(*there, "umount", "-l", str(path))  # busy: detach it at once all the same


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints),
           "HAFO_CLUSTER": cluster.cluster}
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True,
                          text=True, env=env, timeout=30, check=False)


async def test_a_read_only_state_dir_fences_the_node_without_killing_its_agent(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=2, controllers=1)
    victim = view(snapshot, wid)["node"]
    handle = cluster.node_handles[victim]
    agent = handle.agent_pid()
    old = snapshot.current_status(wid)
    assert agent is not None and old is not None and old.pid
    old_pid = cluster.host_pid(victim, old.pid)  # the host's number of the node's process
    assert old_pid is not None and pid_alive(old_pid)
    state_dir = handle.state_dir

    with read_only(cluster, victim, state_dir):
        probe = _run(*on_node(cluster, victim), "touch", str(state_dir / "probe"))
        assert probe.returncode != 0, "really read-only on the node, for root too"
        snapshot = await cluster.wait_for(
            lambda s: s.node_state(victim) == "unhealthy", 20, what="node unhealthy")
        reason = snapshot.nodes[victim].reason
        assert f"state dir ({state_dir}" in reason and "read-only file system" in reason
        snapshot = await cluster.wait_for(running(wid, not_on=victim), 30,
                                          what="the workload moved off the node")
        assert not pid_alive(old_pid), "the old instance outlived its move"
        assert handle.agent_pid() == agent and pid_alive(agent), "the agent died"
        listed = hafo(cluster, "nodes")
        assert listed.returncode == 0, listed.stderr
        line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(victim))
        assert "unhealthy" in line and "state dir" in line, listed.stdout
        detail = hafo(cluster, "nodes", victim)
        assert "read-only file system" in detail.stdout, detail.stdout
        time.sleep(1.0)  # it stays up well past its last published deadline
        assert pid_alive(agent)

    started = time.monotonic()
    snapshot = await cluster.wait_for(
        lambda s: s.node_state(victim) == "ready" and s.nodes[victim].reason == "", 30,
        what="node ready and healthy again")
    assert time.monotonic() - started < 30
    assert handle.agent_pid() == agent and pid_alive(agent)
    # It takes work again: a workload of 4 GPUs fits nowhere else (the other node runs wid).
    big = await cluster.submit({**demo_workload_spec("whole-node"), "gpus": 4})
    snapshot = await cluster.wait_for(
        lambda s: running(big)(s) and view(s, big)["node"] == victim, 30,
        what="new work placed on the recovered node")
    assert running(wid, not_on=victim)(snapshot)
    assert_never_two_copies(cluster, wid)

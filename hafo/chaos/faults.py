"""The faults a chaos run injects, each with its own way back to a whole cluster."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from hafo.local.cluster import LocalCluster
from hafo.local.procs import kill_pid, stop_process
from hafo.model.cluster import ClusterSnapshot, InstanceStatus

FAULT_KINDS = (
    "node-power-loss", "agent-crash", "agent-restart", "agent-freeze", "agent-partition",
    "leader-crash", "leader-freeze", "etcd-member-crash", "workload-crash",
    "etcd-restart", "whole-etcd-restart", "duplicate-agent", "agent-restart-without-state",
    "deleted-liveness-key",
)


@dataclass
class Fault:
    """One injected fault: what, where, and how to undo it once the cluster recovered."""

    kind: str
    target: str
    disruptive: bool
    undo: Callable[[], Awaitable[None]] | None = None
    hitless: dict[str, tuple[int, int]] = field(default_factory=dict)  # wid@node -> (epoch, pid)
    hold: float = 0.0  # the fault lasts this long from injection before ``undo``
    details: dict[str, Any] = field(default_factory=dict)
    downtime: float = 0.0  # etcd was away this long inside ``inject``: not recovery time


async def inject(kind: str, cluster: LocalCluster, rng: Random, outage: float,
                 node: str | None = None) -> Fault:
    """Inject one fault of ``kind`` on a target chosen by ``rng`` (a node fault: on ``node``
    if given); lasting faults (freezes, partitions, a dead etcd member) are undone by the
    caller after ``hold`` seconds."""
    snapshot = await cluster.snapshot()
    running = running_instances(snapshot)
    busy_nodes = sorted({s.node for s in running.values()}) or sorted(cluster.node_handles)
    node = node or rng.choice(busy_nodes)

    if kind == "node-power-loss":
        cluster.power_off(node)

        async def power_on() -> None:
            cluster.start_node(node)
        return Fault(kind, node, True, power_on)
    if kind == "agent-crash":
        cluster.kill_agent(node)

        async def restart() -> None:
            cluster.restart_agent(node)
        return Fault(kind, node, True, restart)
    if kind == "agent-restart":
        hitless = {k: (s.epoch, s.pid or 0) for k, s in running.items() if s.node == node}
        cluster.kill_agent(node)
        # systemd restarts a crashed agent after RestartSec=100ms; the new one must renew the
        # lease within lease_ttl - fence_margin - heartbeat of the crash (docs/safety.md,
        # "Hitless agent restarts").
        await asyncio.sleep(rng.uniform(0.1, 0.6))
        cluster.restart_agent(node)
        return Fault(kind, node, False, None, hitless)
    if kind == "agent-freeze":
        cluster.freeze_agent(node)

        async def thaw() -> None:
            cluster.thaw_agent(node)
        return Fault(kind, node, True, thaw, hold=outage)
    if kind == "agent-partition":
        cluster.partition(node)

        async def heal() -> None:
            cluster.heal(node)
        return Fault(kind, node, True, heal, hold=outage)
    if kind in ("leader-crash", "leader-freeze"):
        ctl = snapshot.leader or rng.choice(sorted(cluster.controller_handles))
        if kind == "leader-crash":
            cluster.kill_controller(ctl)

            async def start() -> None:
                cluster.start_controller(ctl)
            return Fault(kind, ctl, False, start)
        cluster.freeze_controller(ctl)

        async def thaw_controller() -> None:
            cluster.thaw_controller(ctl)
        return Fault(kind, ctl, False, thaw_controller, hold=outage)
    if kind == "etcd-member-crash":
        index = rng.randrange(len(cluster.etcd.members))
        raft_leader = await cluster.etcd_leader_index()
        if rng.random() < 0.5 and raft_leader is not None:
            index = raft_leader  # the raft leader half of the time
        await cluster.close_store()
        cluster.etcd.kill_member(index)

        async def restart_member() -> None:
            cluster.etcd.restart_member(index)
            await asyncio.to_thread(cluster.etcd.wait_ready, 20.0)
        return Fault(kind, cluster.etcd.members[index].name, False, restart_member,
                     hold=rng.uniform(1.0, outage), details={"raft_leader": index == raft_leader})
    every_running = {k: (s.epoch, s.pid or 0) for k, s in running.items()}
    if kind == "etcd-restart":  # a rolling restart, member by member (an etcd upgrade):
        # each member stopped cleanly, so a raft leader hands over first; a crashed raft leader
        # is etcd-member-crash's, which allows the restarts in place of docs/safety.md
        await cluster.close_store()
        for index in range(len(cluster.etcd.members)):
            await asyncio.to_thread(cluster.etcd.stop_member, index)
            cluster.etcd.restart_member(index)
            await asyncio.to_thread(cluster.etcd.wait_ready, 20.0)
        return Fault(kind, "etcd", False, None, every_running)
    if kind == "whole-etcd-restart":  # every member killed at once, then started again
        await cluster.close_store()
        for index in range(len(cluster.etcd.members)):
            cluster.etcd.kill_member(index)
        down = rng.uniform(1.0, 3 * outage)
        await asyncio.sleep(down)
        for index in range(len(cluster.etcd.members)):
            cluster.etcd.restart_member(index)
        await asyncio.to_thread(cluster.etcd.wait_ready, 20.0)
        return Fault(kind, "etcd", False, None, every_running, downtime=down,
                     details={"down": round(down, 1)})
    if kind == "duplicate-agent":  # a second agent started with a busy node's name
        tag = f"dup{rng.randrange(1 << 30)}"
        proc, _state, _port = cluster.start_duplicate_agent(node, tag=tag)
        hitless = {k: v for k, v in every_running.items() if running[k].node == node}

        async def stop_duplicate() -> None:
            stop_process(proc, grace=3.0)
        return Fault(kind, node, False, stop_duplicate, hitless, hold=outage)
    if kind == "agent-restart-without-state":  # an upgrade moved the state dir, or a wipe
        cluster.kill_agent(node)
        cluster.move_state_dir(node, tag=f"state-{rng.randrange(1 << 30)}")
        cluster.restart_agent(node)
        return Fault(kind, node, True, None)
    if kind == "deleted-liveness-key":  # by hand, while the agent and its lease live
        await cluster.store.delete(cluster.keys.alive(node))
        await cluster.store.delete(cluster.keys.node(node))
        hitless = {k: v for k, v in every_running.items() if running[k].node == node}
        return Fault(kind, node, False, None, hitless)
    if kind == "workload-crash":
        if not running:
            return Fault(kind, "-", False, None)
        key = rng.choice(sorted(running))
        pid = running[key].pid  # in the node's numbering: the host's is another
        host = cluster.host_pid(running[key].node, pid)
        if host is not None:
            kill_pid(host, signal.SIGKILL)
        return Fault(kind, running[key].workload, True, None,
                     details={"pid": pid, "node": running[key].node})
    raise ValueError(f"unknown fault kind {kind!r}")


def running_instances(snapshot: ClusterSnapshot) -> dict[str, InstanceStatus]:
    """``"workload@node"`` -> the report of each running instance of a workload's current
    epoch (one per gang member)."""
    out: dict[str, InstanceStatus] = {}
    for (wid, node), status in snapshot.statuses.items():
        assignment = snapshot.assignments.get(wid)
        if (status.state == "running" and assignment is not None
                and assignment.phase == "placed" and status.epoch == assignment.epoch
                and node in assignment.nodes):
            out[f"{wid}@{node}"] = status
    return out


def hitless_violations(fault: Fault, statuses: dict[str, tuple[int, int]],
                       alive: Callable[[str, int], bool]) -> list[str]:
    """For an agent restart: every instance (``"workload@node"``) must still run with the
    same epoch and pid (``alive(node, pid)``: the node runs a process of that number)."""
    broken = []
    for key, before in fault.hitless.items():
        after = statuses.get(key)
        if after != before or not alive(key.rpartition("@")[2], before[1]):
            broken.append(f"{key}: {before} -> {after}")
    return broken

"""The faults a chaos run injects, each with its own way back to a whole cluster."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from hafo.agent.procid import start_time
from hafo.api.client import ApiClient, ApiUnavailable
from hafo.local.cluster import LocalCluster, lose_etcd_data
from hafo.local.procs import kill_pid, pid_alive, stop_process
from hafo.model.cluster import ClusterSnapshot, InstanceStatus
from hafo.store.backup import Backup, restore_backup, take_backup

FAULT_KINDS = (
    "node-power-loss", "agent-crash", "agent-restart", "agent-freeze", "agent-partition",
    "leader-crash", "leader-freeze", "etcd-member-crash", "workload-crash", "workload-freeze",
    "etcd-restart", "whole-etcd-restart", "duplicate-agent", "agent-restart-without-state",
    "deleted-liveness-key", "etcd-stall", "etcd-lost-data",
)

#: The faults aimed at one workload's process (the others at a node or a service).
WORKLOAD_FAULTS = ("workload-crash", "workload-freeze")

#: Events a hitless etcd stall must not cause (docs/safety.md, "An etcd stall").
STALL_QUIET = ("fenced", "restarted", "failover", "node-reregistered")

#: A host process: its pid and start time (``hafo.agent.procid.start_time``).
HostProcess = tuple[int, int]


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
    quiet: tuple[str, ...] = ()  # event kinds that must not happen up to the hitless check
    # wid@node -> the host process that recovery must have replaced (etcd-lost-data's restore)
    replaced: dict[str, HostProcess] = field(default_factory=dict)
    restored_at: float | None = None  # wall-clock time the store's history was replaced
    violations: list[str] = field(default_factory=list)  # seen by ``inject`` itself


async def inject(kind: str, cluster: LocalCluster, rng: Random, outage: float,
                 node: str | None = None) -> Fault:
    """Inject one fault of ``kind`` on a target chosen by ``rng`` (a node fault: on ``node``
    if given); lasting faults (freezes, partitions, a dead etcd member) are undone by the
    caller after ``hold`` seconds."""
    began = time.monotonic()
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
    if kind == "etcd-stall":  # SIGSTOP: a GC pause, a slow fsync, a VM stall
        members = len(cluster.etcd.members)
        frozen = list(range(members)) if members == 1 or rng.random() < 0.5 else [
            rng.randrange(members)]
        stall = rng.uniform(2.5, 20.0)
        await cluster.close_store()  # the harness's client must not wait on a frozen member
        cluster.etcd.freeze(frozen)
        try:
            await asyncio.sleep(stall)
        finally:
            cluster.etcd.thaw(frozen)
        # Hitless (docs/safety.md, "An etcd stall"): the agents resume their nodes with new
        # leases, nobody fails over; the stall itself is not recovery time.
        target = "etcd" if len(frozen) == members else cluster.etcd.members[frozen[0]].name
        return Fault(kind, target, False, None, every_running, downtime=stall,
                     quiet=STALL_QUIET, details={"stall": round(stall, 1), "frozen": frozen})
    if kind == "etcd-lost-data":
        return await _lose_etcd_data(cluster, rng, outage, running, began)
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
    if kind == "workload-freeze":  # SIGSTOP: a hung process, caught by hang_timeout
        if not running:
            return Fault(kind, "-", False, None)
        key = rng.choice(sorted(running))
        pid = running[key].pid
        host = cluster.host_pid(running[key].node, pid)
        if host is not None:
            kill_pid(host, signal.SIGSTOP)  # SIGKILLed by its guard when it is restarted
        return Fault(kind, running[key].workload, True, None,
                     details={"pid": pid, "node": running[key].node})
    raise ValueError(f"unknown fault kind {kind!r}")


async def _lose_etcd_data(cluster: LocalCluster, rng: Random, outage: float,
                          running: dict[str, InstanceStatus], began: float) -> Fault:
    """etcd restarted empty, then the operator's ``hafo restore`` of a backup taken before
    (docs/safety.md, "etcd losing its data"). Meanwhile, checked at the end of a hold: every
    instance's process still runs (untouched), nothing is placed on the empty store, every
    controller's ``/readyz`` is 503 naming the store. Recovery: every workload running again
    from the restored store (new epochs of a new history), its old processes gone."""
    backup = await take_backup(cluster.store, cluster.keys)
    path = cluster.base / f"backup-{backup.revision}.json"  # the operator's file, as written
    path.write_text(json.dumps(backup.to_dict()))
    old: dict[str, HostProcess] = {}
    for key, status in running.items():
        host = cluster.host_pid(status.node, status.pid)
        started = start_time(host) if host is not None else None
        if host is not None and started:
            old[key] = (host, started)
    await lose_etcd_data(cluster)
    hold = rng.uniform(2.0, 2 * outage)
    await asyncio.sleep(hold)
    violations = [f"{key}: killed while etcd was not the cluster"
                  for key, process in sorted(old.items()) if not host_alive(process)]
    empty = await cluster.snapshot()
    placed = sorted({*empty.workloads, *empty.assignments})
    if placed:
        violations.append(f"decided on the empty store: {placed}")
    for name, ctl in sorted(cluster.controller_handles.items()):
        if not ctl.running():
            continue
        code, body = await _get_json(f"http://127.0.0.1:{ctl.api_port}", "/readyz")
        if code != 503 or "not the cluster" not in str(body.get("error", "")):
            violations.append(f"{name} /readyz on the empty store: {code} {body}")
    restored = Backup.from_dict(json.loads(path.read_text()))
    restored_at = time.time()
    await restore_backup(cluster.store, cluster.keys, restored)
    return Fault("etcd-lost-data", "etcd", False, None, downtime=time.monotonic() - began,
                 replaced=old, restored_at=restored_at, violations=violations,
                 details={"hold": round(hold, 1), "keys": len(backup.keys)})


def host_alive(process: HostProcess) -> bool:
    """True while that host process runs (same pid, same start time)."""
    return pid_alive(process[0]) and start_time(process[0]) == process[1]


async def _get_json(base: str, path: str) -> tuple[int, dict[str, Any]]:
    """GET a JSON document from hafo's API at ``base``: (status, body); (0, {}) where
    nothing answered."""
    try:
        async with ApiClient(timeout=5.0) as client:
            response = await client.get(base, path)
    except ApiUnavailable:
        return 0, {}
    code, raw = response.status, response.body
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return code, {"text": raw[:200].decode(errors="replace")}
    return code, body if isinstance(body, dict) else {"body": body}


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

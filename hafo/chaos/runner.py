"""A seeded series of real faults against a local cluster, with the invariants checked."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from hafo.agent.procid import start_time
from hafo.chaos.bystanders import Bystanders
from hafo.chaos.faults import (
    FAULT_KINDS,
    WORKLOAD_FAULTS,
    Fault,
    hitless_violations,
    host_alive,
    inject,
    running_instances,
)
from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.procs import children_map, pid_alive
from hafo.local.progress import Overlap, history, overlaps
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view
from hafo.stats import percentile
from hafo.store import read_events


@dataclass
class FaultResult:
    """What one fault did."""

    kind: str
    target: str
    recovery: float | None
    violations: list[str] = field(default_factory=list)


@dataclass
class ChaosReport:
    """Everything a run found."""

    seed: int
    results: list[FaultResult]
    overlaps: list[Overlap]
    concurrent: list[str]
    not_running: list[str]
    duration: float
    bystanders: list[str] = field(default_factory=list)  # processes hafo did not start, hit
    rebooted: dict[str, int] = field(default_factory=dict)  # kind of workload -> reboots

    @property
    def ok(self) -> bool:
        """No invariant broken."""
        return not (self.overlaps or self.concurrent or self.not_running or self.bystanders
                    or any(r.violations or r.recovery is None for r in self.results))

    def table(self) -> str:
        """Per fault kind: count, recovery p50/max, violations."""
        rows = [f"{'fault':28s} {'count':>5s} {'recovery p50':>12s} {'max':>7s} "
                f"{'violations':>10s}"]
        for kind in FAULT_KINDS:
            mine = [r for r in self.results if r.kind == kind]
            if not mine:
                continue
            times = [r.recovery for r in mine if r.recovery is not None]
            bad = sum(len(r.violations) + (r.recovery is None) for r in mine)
            rows.append(f"{kind:28s} {len(mine):5d} {percentile(times, 50):11.2f}s "
                        f"{max(times, default=0):6.2f}s {bad:10d}")
        rows.append(f"{len(self.results)} faults in {self.duration:.0f}s, seed {self.seed}: "
                    f"{len(self.overlaps)} logged overlaps, {len(self.concurrent)} "
                    f"concurrent-pid sightings, {len(self.not_running)} workloads not running "
                    f"at the end, {len(self.bystanders)} bystanders signalled -> "
                    f"{'OK' if self.ok else 'VIOLATIONS'}")
        rows.append("rebooted with their node: " + ", ".join(
            f"{kind} x{count}" for kind, count in sorted(self.rebooted.items())))
        return "\n".join(rows)


#: A process as a progress line names it: node, pid (in the node's numbering), boot id.
LoggedProcess = tuple[str, int, str]


#: The epoch of a logged process whose last line says it parked (a warm gang's member between
#: two instances: it belongs to neither).
PARKED = -1


class PidSampler:
    """Every 50 ms, looks at the live processes of each workload (from its progress log) and
    the epochs they belong to: processes of two epochs alive together are a sighting (a gang's
    members share one epoch). A logged process is found once, when its first line is read, as
    a host process (its node must run the boot it was logged in and a process of that number);
    it is alive while that host process runs (same host pid, same host start time).

    ``restores``: the times the store's history was replaced (etcd-lost-data's ``hafo
    restore``; the runner appends to it): as in ``hafo.local.progress.overlaps``, a process's
    instance is its history (of its first line, ``hafo.local.progress.history``) and its
    epoch, so an epoch number repeated by another history is never taken for the same one."""

    def __init__(self, cluster: LocalCluster, workloads: list[str],
                 restores: list[float] | None = None) -> None:
        self.cluster = cluster
        self.workloads = workloads
        self.restores = restores if restores is not None else []
        self.offsets: dict[str, int] = {}
        # -> (time of its first line read, epoch)
        self.pids: dict[str, dict[LoggedProcess, tuple[float, int]]] = {w: {} for w in workloads}
        self.hosts: dict[LoggedProcess, tuple[int, int] | None] = {}  # -> host pid, start
        self.sightings: list[str] = []

    def _read_new(self, wid: str) -> None:
        path = self.cluster.checkpoint_root / wid / "progress.jsonl"
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(wid, 0))
                data = fh.read()
        except OSError:
            return
        complete = data[:data.rfind(b"\n") + 1]
        self.offsets[wid] = self.offsets.get(wid, 0) + len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
                process = (str(record["node"]), int(record["pid"]), str(record.get("boot", "")))
                epoch, t = int(record["epoch"]), float(record["t"])
            except (ValueError, KeyError, TypeError):
                continue
            if record.get("event") == "parked":
                epoch = PARKED  # a warm member left its epoch; its next line names the next
            known = self.pids[wid].get(process)
            if known is None or known[1] != epoch:
                self.pids[wid][process] = (t, epoch)

    def _find(self, processes: list[LoggedProcess]) -> None:
        """Find newly logged processes on the host (one look at /proc for all of them)."""
        children = children_map()
        nodes: dict[str, tuple[str, dict[int, int]]] = {}
        for process in processes:
            node, pid, boot = process
            handle = self.cluster.node_handles.get(node)
            if handle is None:
                self.hosts[process] = None
                continue
            if node not in nodes:
                nodes[node] = (handle.boot(), handle.processes(children))
            current, numbers = nodes[node]
            host = numbers.get(pid) if not current or current == boot else None
            start = start_time(host) if host is not None else None
            self.hosts[process] = (host, start) if host is not None and start else None

    def alive(self, process: LoggedProcess) -> bool:
        """True while the logged process runs (found once, then by its host identity)."""
        found = self.hosts.get(process)
        return found is not None and start_time(found[0]) == found[1] and pid_alive(found[0])

    def sample(self) -> None:
        """One look at every workload."""
        for wid in self.workloads:
            self._read_new(wid)
        new = [p for wid in self.workloads for p in self.pids[wid] if p not in self.hosts]
        if new:
            self._find(new)
        for wid in self.workloads:
            alive = {p: e for p, e in self.pids[wid].items() if self.alive(p)}
            for gone in set(self.pids[wid]) - set(alive):
                self.hosts[gone] = None  # dead for good: never looked up again
            self.pids[wid] = alive
            instances = {(history(t, self.restores), e) for t, e in alive.values()
                         if e != PARKED}
            if len(instances) > 1:
                pids = sorted(f"{node}:{pid}" for node, pid, _ in alive)
                epochs = [str(e) if h == 0 else f"{e} (history {h})"
                          for h, e in sorted(instances)]
                self.sightings.append(f"{time.time():.3f} {wid}: pids {pids} of "
                                      f"epochs {epochs} alive together")

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(0.05)


def nodes_of(snapshot: ClusterSnapshot, wid: str) -> set[str]:
    """The nodes a workload runs on (every member's, for a gang)."""
    view = workload_view(snapshot, wid)
    return {m["node"] for m in view["members"]} or ({view["node"]} if view["node"] else set())


#: Seconds the cluster is left alone after bystanders start (not part of the next fault).
SETTLE = 1.0
#: Every chaos workload's ``hang_timeout``: a frozen one (``workload-freeze``) is restarted
#: after it; long enough that no other fault, nor this busy machine, makes one look hung.
CHAOS_HANG_TIMEOUT = 8.0

#: The kinds of workload a chaos run watches; each must run on a node that reboots.
WORKLOAD_KINDS = ("single", "gang-member", "service-replica", "escaping")


def kinds_on(snapshot: ClusterSnapshot, kinds: dict[str, str], node: str) -> set[str]:
    """The kinds of workload running on ``node`` (``kinds``: workload id -> kind)."""
    return {kind for wid, kind in kinds.items() if node in nodes_of(snapshot, wid)}


def reboot_target(snapshot: ClusterSnapshot, kinds: dict[str, str], missing: set[str],
                  rng: Random) -> str | None:
    """The node to power-cycle next: the one running most of the kinds not yet rebooted
    (seeded choice among equals), or None if no node runs any of them."""
    nodes = sorted(snapshot.nodes)
    rng.shuffle(nodes)
    best = max(nodes, key=lambda n: len(kinds_on(snapshot, kinds, n) & missing), default=None)
    return best if best is not None and kinds_on(snapshot, kinds, best) & missing else None


def all_running(workloads: list[str]) -> Callable[[ClusterSnapshot], bool]:
    """Predicate: every workload runs."""
    return lambda s: all(workload_view(s, w)["state"] == "running" for w in workloads)


async def _wait_recovered(cluster: LocalCluster, fault: Fault, before: ClusterSnapshot,
                          workloads: list[str], timeout: float) -> None:
    affected = [w for w in workloads
                if (fault.kind in WORKLOAD_FAULTS and w == fault.target)
                or (fault.kind not in WORKLOAD_FAULTS and fault.target in nodes_of(before, w))
                ] if fault.disruptive else []
    epochs = {w: workload_view(before, w)["epoch"] for w in affected}

    def recovered(s: ClusterSnapshot) -> bool:
        if fault.kind in ("leader-crash", "leader-freeze") and s.leader in (None, fault.target):
            return False
        if s.leader is None:
            return False
        return all_running(workloads)(s) and all(
            workload_view(s, w)["epoch"] != epochs[w] for w in affected) and not any(
            host_alive(process) for process in fault.replaced.values())

    await cluster.wait_for(recovered, timeout, interval=0.05, what=f"recovery from {fault.kind}")


async def _watch(bystanders: Bystanders) -> None:
    """Look at the bystanders every 100 ms until cancelled."""
    while True:
        bystanders.check()
        await asyncio.sleep(0.1)


async def run_chaos(seed: int, faults: int, *, nodes: int = 4, controllers: int = 2,
                    workloads: int = 4, gangs: int = 1, services: int = 1,
                    base_dir: Path | None = None, keep: bool = False,
                    only_kinds: Sequence[str] | None = None,
                    say: Callable[[str], Any] = print, profile: str = "default") -> ChaosReport:
    """Start a cluster, inject ``faults`` seeded faults, check the invariants, tear down.
    ``gangs``: how many 2-member gangs run beside the ``workloads`` single-node ones (one of
    them leaves an escaped process behind, ``hafo.local.workload --escape``); ``services``:
    how many 2-replica services (each replica is watched like a workload). A power loss
    targets the node that runs most kinds of workload not yet rebooted, and more power
    cycles follow the seeded faults until every kind has rebooted with its node at least
    once. Processes hafo did not start run on every node (``hafo.chaos.bystanders``).
    ``only_kinds``: the fault kinds to draw from (default: every kind, ``FAULT_KINDS``).
    ``profile``: the cluster's timing profile (``hafo.model.timing_profile``)."""
    unknown = sorted(set(only_kinds or ()) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds: {', '.join(unknown)}")
    rng = Random(seed)
    cluster = LocalCluster(base_dir=base_dir, nodes=nodes, controllers=controllers,
                           etcd_members=3, partitionable=True, keep=keep, profile=profile)
    outage = cluster.lease_ttl + 2.0
    started = time.monotonic()
    results: list[FaultResult] = []
    cluster.start()
    sampler_task: asyncio.Task[None] | None = None
    watch_task: asyncio.Task[None] | None = None
    bystanders: Bystanders | None = None
    try:
        await cluster.wait_ready(60)
        ids = []
        kinds: dict[str, str] = {}
        for i in range(workloads):
            spec = demo_workload_spec(name=f"chaos-{i}", interval=0.02, every=10,
                                      escape=i == 0)
            spec["restart"] = {"max_restarts": 100000, "window": 60}
            spec["hang_timeout"] = CHAOS_HANG_TIMEOUT
            ids.append(await cluster.submit(spec))
            kinds[ids[-1]] = "escaping" if i == 0 else "single"
        for i in range(gangs):
            # the first gang is warm: its survivors park and take the next epoch in their
            # processes (an epoch change is one instance ending, the next beginning)
            spec = demo_workload_spec(name=f"chaos-gang-{i}", interval=0.02, every=10,
                                      warm=i == 0)
            spec["restart"] = {"max_restarts": 100000, "window": 60}
            spec["hang_timeout"] = CHAOS_HANG_TIMEOUT
            spec["nodes"] = 2
            ids.append(await cluster.submit(spec))
            kinds[ids[-1]] = "gang-member"
        for i in range(services):
            spec = demo_workload_spec(name=f"chaos-svc-{i}", interval=0.02, every=10)
            spec["restart"] = {"max_restarts": 100000, "window": 60}
            spec["hang_timeout"] = CHAOS_HANG_TIMEOUT
            spec["replicas"] = 2
            sid = await cluster.submit(spec)
            found = await cluster.wait_for(lambda s, sid=sid: len(s.replicas.get(sid, ())) == 2,
                                           30, what=f"the replicas of {sid}")
            ids.extend(found.replicas[sid])
            kinds.update({replica: "service-replica" for replica in found.replicas[sid]})
        await cluster.wait_for(all_running(ids), 60, what="workloads running")
        restores: list[float] = []  # when etcd-lost-data's restores replaced the history
        sampler = PidSampler(cluster, ids, restores)
        sampler_task = asyncio.create_task(sampler.run())
        bystanders = Bystanders(cluster)
        for name in cluster.node_handles:
            bystanders.start(name)
        watch_task = asyncio.create_task(_watch(bystanders))
        await asyncio.sleep(SETTLE)  # their start-up is not part of the first fault
        rebooted: dict[str, int] = {}
        fault_kinds = [k for k in FAULT_KINDS if not only_kinds or k in only_kinds]
        extra_reboots = 0
        n = 0
        while True:
            missing = {k for k in WORKLOAD_KINDS if k in kinds.values()} - set(rebooted)
            if n < faults:
                if n % len(fault_kinds) == 0:
                    rng.shuffle(fault_kinds)  # every kind once per round, in a seeded order
                kind = fault_kinds[n % len(fault_kinds)]
            elif missing and extra_reboots < 3:  # until every kind rebooted with its node
                kind, extra_reboots = "node-power-loss", extra_reboots + 1
            else:
                break
            n += 1
            before = await cluster.snapshot()
            target = reboot_target(before, kinds, missing or set(WORKLOAD_KINDS), rng) if (
                kind == "node-power-loss") else None
            t0, wall0 = time.monotonic(), time.time()
            fault = await inject(kind, cluster, rng, outage, node=target)
            if fault.restored_at is not None:
                restores.append(fault.restored_at)
            if kind == "node-power-loss":
                bystanders.powered_off(fault.target)
                for rebooted_kind in kinds_on(before, kinds, fault.target):
                    rebooted[rebooted_kind] = rebooted.get(rebooted_kind, 0) + 1
            result = FaultResult(kind, fault.target, None, list(fault.violations))
            try:
                await _wait_recovered(cluster, fault, before, ids, 60)
                result.recovery = time.monotonic() - t0 - fault.downtime
            except TimeoutError as exc:
                result.violations.append(str(exc))
            await asyncio.sleep(max(0.0, t0 + fault.hold - time.monotonic()))
            if fault.hitless:
                await asyncio.sleep(cluster.lease_ttl + 1.0)
                snap = await cluster.snapshot()
                now = {k: (s.epoch, s.pid or 0) for k, s in running_instances(snap).items()
                       if k in fault.hitless}
                result.violations += hitless_violations(
                    fault, now, lambda node, pid: cluster.host_pid(node, pid) is not None)
            if fault.quiet:
                result.violations += [
                    f"{e.kind}: {e.message}" for e in await read_events(cluster.store,
                                                                         cluster.keys, 300)
                    if e.ts >= wall0 and e.kind in fault.quiet]
            if fault.undo is not None:
                await fault.undo()
            await cluster.wait_ready(60)
            if kind == "node-power-loss":  # it booted again: new processes to watch there
                bystanders.start(fault.target)
                await asyncio.sleep(SETTLE)
            await cluster.wait_for(all_running(ids), 60, what="all running after undo")
            results.append(result)
            say(f"[{n:3d}/{faults}] {kind:18s} {fault.target:12s} recovered in "
                + (f"{result.recovery:5.2f}s" if result.recovery is not None else "  never")
                + (f"  {fault.details}" if fault.details else "")
                + (f"  VIOLATIONS: {result.violations}" if result.violations else ""))
        final = await cluster.wait_for(all_running(ids), 60, what="all running at the end")
        sampler.sample()
        bystanders.check()
        lines = [line for w in ids for line in cluster.progress_log(w)]
        return ChaosReport(seed=seed, results=results, overlaps=overlaps(lines, restores),
                           concurrent=sampler.sightings,
                           not_running=[w for w in ids
                                        if workload_view(final, w)["state"] != "running"],
                           duration=time.monotonic() - started,
                           bystanders=bystanders.violations, rebooted=rebooted)
    finally:
        for task in (sampler_task, watch_task):
            if task is not None:
                task.cancel()
        if bystanders is not None:
            bystanders.stop()
        await cluster.close_store()
        cluster.stop()

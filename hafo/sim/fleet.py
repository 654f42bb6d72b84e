"""Many simulated agents in one process, each with its own real etcd lease and node record.

What is shared with the real agent: the store client, lease grants and keepalives, the node
record and liveness key (``NodeRecord``, ``Liveness``), the simulated GPU inventory
(``hafo.gpu.SimulatedGpus``), the reading of assignments (``hafo.agent.assignments.for_node``),
the per-node instance decision (``hafo.decisions.instances.plan_instances``) and the instance
reports (``InstanceStatus`` under the node's lease). What is simulated: workloads are not
processes; an instance "starts" and "stops" the moment the agent would launch or stop its
guard, and by default runs until it is stopped. Given ``runtime`` (workload -> seconds of
work), an instance completes (reports exited with code 0) once its workload has done that
much work, counting the work its earlier instances checkpointed; given ``checkpoint``
(seconds), a planned stop (a move or a preemption, not urgent) reports ``stopping`` for that
long, then exits with a checkpoint of all the work done until the stop was asked
(``CheckpointInfo.step``: whole seconds of work), as a guard does on SIGUSR1; an urgent stop
exits at once and loses the work since the last checkpoint. Keepalives of all nodes are
multiplexed over a few LeaseKeepAlive streams (``EtcdStore.keepalive_many``), as etcd's Go
client does, and writes are batched into transactions: one process can then carry 10,000
nodes at the real heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from hafo.agent.assignments import for_node
from hafo.decisions.instances import plan_instances
from hafo.gpu.simulated import SimulatedGpus
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    FailsafeSet,
    Gpu,
    InstanceStatus,
    Liveness,
    NodeRecord,
)
from hafo.retry import Retry, RetryPolicy
from hafo.store import (
    TRANSIENT,
    Delete,
    EtcdStore,
    Keys,
    Put,
    StoreError,
    codec,
)
from hafo.store.watched import WatchedPrefix
from hafo.tasks import run_all

log = structlog.get_logger("hafo.sim")

KEEPALIVE_CHUNK = 1000
NODES_PER_TXN = 60  # node record + liveness key: 2 ops each, under etcd's 128
REGISTER_CHUNK = 1000  # nodes granted and registered together
#: A chunk's registration refused (a lease expired before its keys were written): granted
#: again and retried at once (a wait would let the fresh leases expire too), 4 attempts.
ENROL_POLICY = RetryPolicy(first=0.0, cap=0.0, jitter=0.0, attempts=4, warn_after=1)
#: The simulated agents' reports not written: forever, 0.05 s doubling up to 0.2 s (jittered).
REPORT_POLICY = RetryPolicy(first=0.05, cap=0.2, jitter=0.5, warn_after=3)
RECOVERABLE: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError)


@dataclass
class SimNode:
    """One simulated node: its lease, inventory and the instances it "runs"."""

    name: str
    gpus: tuple[Gpu, ...]
    labels: dict[str, str]
    lease: int = 0
    alive: bool = True
    desired: dict[str, Assignment] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)  # workload -> epoch
    exited: dict[str, int] = field(default_factory=dict)   # reported exited, not yet gone
    #: workload -> (epoch, when its checkpoint commits, its work then): a planned stop
    stopping: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    urgent: set[str] = field(default_factory=set)  # workloads to stop at once, no checkpoint

    def record(self, failsafe_seen: int) -> NodeRecord:
        """Its node record, as the agent writes it."""
        return NodeRecord(name=self.name, labels=self.labels, gpus=self.gpus,
                          failsafe_seen=failsafe_seen)


class SimFleet:
    """``count`` simulated nodes named ``<prefix>-00001``... ``runtime``: workload -> the
    seconds of work it does before it completes (None, or no ``runtime``: it runs until
    stopped); ``checkpoint``: seconds a planned stop takes (module docstring);
    ``on_report``: called with every instance report as it is written."""

    def __init__(self, store: EtcdStore, keys: Keys, count: int, gpus_per_node: int = 8,
                 ttl: int = 3, heartbeat: float = 1.0, prefix: str = "sim",
                 model: str = "NVIDIA H100 80GB HBM3", memory_mib: int = 81559,
                 runtime: Callable[[str], float | None] | None = None,
                 checkpoint: float = 0.0,
                 on_report: Callable[[InstanceStatus], None] | None = None) -> None:
        self.store = store
        self.runtime = runtime
        self.checkpoint = checkpoint
        self.on_report = on_report
        self.progress: dict[str, float] = {}  # workload -> seconds of work checkpointed
        self.finished: dict[str, float] = {}  # workload -> wall time it completed
        self._due: list[tuple[float, str]] = []  # (wall time, node): a pass is due then
        self._timer_changed = asyncio.Event()
        self.keys = keys
        self.ttl = ttl
        self.heartbeat = heartbeat
        width = max(5, len(str(count)))
        self.nodes: dict[str, SimNode] = {}
        for i in range(1, count + 1):
            name = f"{prefix}-{i:0{width}d}"
            gpus = tuple(SimulatedGpus(name, gpus_per_node, model, memory_mib).inventory())
            self.nodes[name] = SimNode(name, gpus, {"zone": f"z{i % 4}", "sim": "true"})
        self.failsafe = FailsafeSet()
        self._dirty: set[str] = set()
        self.placed_on: dict[str, str] = {}  # workload -> the node it was last placed on
        self.copies: WatchedPrefix[Assignment] = WatchedPrefix(
            store, keys.by_node, lambda kv: codec.decode_assignment(kv.value, kv.mod_revision),
            self._changed)
        self._wake = self.copies.changed  # set by every change of a copy
        self.started: dict[str, float] = {}  # workload -> wall time its newest instance started
        self._keeper: asyncio.Future[None] | None = None  # started by ``start``
        self._lost: list[SimNode] = []  # lost their lease, to register again (``_rejoin``)
        self._rejoiner: asyncio.Task[None] | None = None

    # -- registration ------------------------------------------------------------------

    async def _grant(self, nodes: list[SimNode]) -> None:
        for start in range(0, len(nodes), 200):
            chunk = nodes[start:start + 200]
            leases = await asyncio.gather(*(self.store.grant_lease(self.ttl) for _ in chunk))
            for node, (lease, _ttl) in zip(chunk, leases, strict=True):
                node.lease = lease

    async def _register(self, nodes: list[SimNode]) -> None:
        ops: list[Put | Delete] = []
        now = time.time()
        for node in nodes:
            ops.append(Put(self.keys.node(node.name),
                           codec.encode(node.record(self.failsafe.version).to_dict())))
            ops.append(Put(self.keys.alive(node.name),
                           codec.encode(Liveness(node.name, node.lease, now).to_dict()),
                           lease=node.lease))
        await self.store.write_many(ops, per_txn=2 * NODES_PER_TXN)

    async def start(self) -> None:
        """Grant every lease and register every node, chunk by chunk. Leases are kept alive
        from the moment they are granted (as an agent keeps its own): on a slow machine,
        granting and registering 10,000 nodes takes longer than the TTL."""
        kv = await self.store.get(self.keys.failsafe)
        if kv is not None:
            self.failsafe = codec.decode_failsafe(kv.value)
        self._keeper = asyncio.create_task(self._keep_leases())
        nodes = list(self.nodes.values())
        try:
            for start in range(0, len(nodes), REGISTER_CHUNK):
                await self._enrol(nodes[start:start + REGISTER_CHUNK])
        except BaseException:
            self._keeper.cancel()
            if self._rejoiner is not None:
                self._rejoiner.cancel()
            raise
        log.info("simulated nodes registered", nodes=len(nodes))

    async def _enrol(self, nodes: list[SimNode]) -> None:
        """Grant leases to ``nodes`` and register them; a lease that expired before its keys
        were written (etcd: "requested lease not found") is granted again."""
        await self._grant(nodes)
        retry = Retry("sim registration", ENROL_POLICY, logger=log, nodes=len(nodes))
        while True:
            try:
                await self._register(nodes)
                return
            except StoreError as exc:
                await retry.failed(exc)  # the last refusal is raised
                await self._grant(nodes)

    # -- loops -------------------------------------------------------------------------

    async def _keepalive_round(self) -> None:
        live = [n for n in self.nodes.values() if n.alive and n.lease]
        chunks = [live[i:i + KEEPALIVE_CHUNK] for i in range(0, len(live), KEEPALIVE_CHUNK)]
        replies = await asyncio.gather(
            *(self.store.keepalive_many([n.lease for n in chunk], self.heartbeat * 2)
              for chunk in chunks), return_exceptions=True)
        lost: list[SimNode] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, BaseException):
                log.warning("keepalive round failed", error=type(reply).__name__)
                continue
            lost += [n for n in chunk if reply.get(n.lease, 1) == 0]
        if lost:  # as an agent does: its work is fenced, it registers anew
            log.warning("simulated nodes lost their lease; re-registering", nodes=len(lost))
            for node in lost:
                node.running.clear()
                node.exited.clear()
                node.stopping.clear()
                node.lease = 0  # no keepalives, no reports until it is registered again
            self._lost += lost
            if self._rejoiner is None or self._rejoiner.done():
                self._rejoiner = asyncio.create_task(self._rejoin())

    async def _rejoin(self) -> None:
        """Register again, ``REGISTER_CHUNK`` at a time, the nodes that lost their lease, while
        the keepalive rounds go on for the others. (Inline in the round, thousands of nodes
        lost at once took longer than the TTL to register, each retry granted leases that
        expired before their keys were written, and every other node's lease expired
        meanwhile: the whole fleet never came back.)"""
        # Forever, about a heartbeat apart (jittered down): the keepalive rounds go on meanwhile.
        retry = Retry("sim re-registration", RetryPolicy(
            first=self.heartbeat, cap=self.heartbeat, jitter=0.5, warn_after=1), logger=log)
        while self._lost:
            chunk = [n for n in self._lost[:REGISTER_CHUNK] if n.alive]
            del self._lost[:REGISTER_CHUNK]
            try:
                await self._enrol(chunk)
            except RECOVERABLE as exc:
                for node in chunk:
                    node.lease = 0
                self._lost[:0] = chunk
                await retry.failed(exc)
                continue
            retry.succeeded()

    async def _keep_leases(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._keepalive_round()
            except TRANSIENT:
                pass  # etcd unavailable: the next round tries again
            except StoreError as exc:  # etcd refused the round: the next one tries again
                log.warning("keepalive round refused; trying again next round",
                            error=str(exc))
            await asyncio.sleep(max(0.0, self.heartbeat - (time.monotonic() - started)))

    def _changed(self, key: str, _old: Assignment | None, assignment: Assignment | None) -> None:
        """One change of a node's copy of an assignment (``Keys.node_assignment``)."""
        parsed = self.keys.parse(key)
        node, workload = self.nodes.get(parsed.node or ""), parsed.workload
        if node is None or workload is None:
            return
        node_name = node.name
        self._dirty.add(node_name)
        placed = urgent = None
        if assignment is not None:
            placed, urgent = for_node(assignment, node_name)
            if placed is not None:
                node.desired[workload] = placed
                self.placed_on[workload] = node_name
        if placed is None:
            node.desired.pop(workload, None)
        if urgent is not None:
            node.urgent.add(workload)
        else:
            node.urgent.discard(workload)

    async def _follow_assignments(self) -> None:
        """One watch over every node's copies (a real agent watches only its own)."""
        await self.copies.load()
        await self.copies.follow()

    def _status(self, ops: list[Put | Delete], node: SimNode, status: InstanceStatus) -> None:
        """Report ``status`` (under the node's lease), and tell ``on_report``."""
        ops.append(Put(self.keys.status(status.workload, node.name),
                       codec.encode(status.to_dict()), lease=node.lease))
        if self.on_report is not None:
            self.on_report(status)

    def _at(self, when: float, node: str) -> None:
        """A pass of ``node`` is due at ``when`` (wall time)."""
        heapq.heappush(self._due, (when, node))
        self._timer_changed.set()

    def _work_done(self, workload: str, now: float) -> float:
        """Seconds of work ``workload`` has done by ``now`` (its running instance's too)."""
        return self.progress.get(workload, 0.0) + max(0.0, now - self.started[workload])

    def _complete(self, node: SimNode, now: float, ops: list[Put | Delete]) -> None:
        """Running instances whose workload has done its ``runtime`` of work exit 0."""
        if self.runtime is None:
            return
        for workload, epoch in list(node.running.items()):
            total = self.runtime(workload)
            if total is None or self._work_done(workload, now) < total - 1e-6:
                continue
            del node.running[workload]
            node.exited[workload] = epoch
            self.progress[workload] = total
            self.finished[workload] = now
            self._status(ops, node, InstanceStatus(workload, node.name, epoch, "exited",
                                                   exit_code=0, finished_at=now))

    def _stop(self, node: SimNode, workload: str, epoch: int, now: float,
              ops: list[Put | Delete]) -> None:
        """Stop one instance: at once if urgent (its work since the last checkpoint lost)
        or without a checkpoint time; else ``stopping`` until its checkpoint commits."""
        if workload in node.stopping:
            _epoch, due, work = node.stopping[workload]
            if due > now and workload not in node.urgent:
                return  # still checkpointing
            del node.stopping[workload]
            node.exited[workload] = epoch
            self.progress[workload] = work
            self._status(ops, node, InstanceStatus(
                workload, node.name, epoch, "exited", exit_code=-15, finished_at=now,
                checkpoint=CheckpointInfo(step=int(work), epoch=epoch,
                                          path=f"sim://{workload}/{epoch}")))
            return
        if workload not in node.running:
            return  # it completed in this pass
        del node.running[workload]
        planned = workload not in node.urgent
        if planned and workload in self.started:
            work = self._work_done(workload, now)
            if self.checkpoint > 0:
                node.stopping[workload] = (epoch, now + self.checkpoint, work)
                self._at(now + self.checkpoint, node.name)
                self._status(ops, node, InstanceStatus(workload, node.name, epoch, "stopping",
                                                       started_at=self.started[workload]))
                return
            self.progress[workload] = work
        node.exited[workload] = epoch
        self._status(ops, node, InstanceStatus(workload, node.name, epoch, "exited",
                                               exit_code=-15, finished_at=now))

    def _pass(self, node: SimNode, now: float) -> list[Put | Delete]:
        """One agent pass for one node: the instances that completed, those to stop and to
        start, and the reports."""
        ops: list[Put | Delete] = []
        self._complete(node, now, ops)
        desired = [(w, a.epoch) for w, a in node.desired.items()]
        running = {(w, e): True for w, e in node.running.items()}
        running.update({(w, e): False for w, e in node.exited.items()})
        running.update({(w, e): True for w, (e, _due, _work) in node.stopping.items()})
        plan = plan_instances(desired, running, may_start=node.alive)
        for workload, epoch in plan.stop:
            self._stop(node, workload, epoch, now, ops)
        reported = {self.keys.status(w, node.name) for w, _epoch in plan.stop}
        reported |= {op.key for op in ops}
        for workload, epoch in list(node.exited.items()):
            if workload not in node.desired and (workload, epoch) not in plan.stop:
                key = self.keys.status(workload, node.name)
                if key in reported:  # reported exited in this pass: gone in the next one
                    self._at(now, node.name)
                    continue
                del node.exited[workload]
                ops.append(Delete(key))
        for workload, epoch in plan.start:
            node.exited.pop(workload, None)
            node.running[workload] = epoch
            self.started[workload] = now
            if self.runtime is not None and (total := self.runtime(workload)) is not None:
                self._at(now + max(0.0, total - self.progress.get(workload, 0.0)), node.name)
            self._status(ops, node, InstanceStatus(workload, node.name, epoch, "running",
                                                   started_at=now))
        return ops

    async def _timers(self) -> None:
        """Wake the supervisor when a pass is due: an instance's work done, a checkpoint
        committed."""
        while True:
            self._timer_changed.clear()
            if not self._due:
                await self._timer_changed.wait()
                continue
            delay = self._due[0][0] - time.time()
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._timer_changed.wait(), delay)
                continue
            now = time.time()
            while self._due and self._due[0][0] <= now:
                self._dirty.add(heapq.heappop(self._due)[1])
            self._wake.set()

    async def _supervise(self) -> None:
        retry = Retry("sim reports", REPORT_POLICY, logger=log)
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0.02)  # gather a burst of assignment changes into one pass
            dirty, self._dirty = self._dirty, set()
            now = time.time()
            reports = {name: self._pass(self.nodes[name], now) for name in sorted(dirty)
                       if self.nodes[name].alive and self.nodes[name].lease}
            try:
                await self._report(reports)
            except TRANSIENT as exc:
                self._dirty |= dirty
                self._wake.set()
                await retry.failed(exc)
                continue
            retry.succeeded()

    async def _report(self, reports: dict[str, list[Put | Delete]]) -> None:
        """Write the nodes' reports, batched into transactions. A node whose lease expired
        before the keepalive loop noticed (a late round, on a loaded machine) makes etcd
        refuse the whole transaction its lease-bound reports are in ("requested lease not
        found"): then each node's reports are written on their own, and a node refused loses
        its instances, as a real agent without its lease is fenced; the keepalive loop
        registers it again. (Raising would end ``run``: every node's keepalives with it.)"""
        try:
            await self.store.write_many([op for ops in reports.values() for op in ops])
            return
        except StoreError as exc:
            log.warning("reports refused; writing them node by node", error=str(exc))
        fenced = 0
        for name, ops in reports.items():
            if not ops:
                continue
            try:
                await self.store.write_many(ops)
            except StoreError:
                node = self.nodes[name]
                node.running.clear()
                node.exited.clear()
                node.stopping.clear()
                fenced += 1
        if fenced:
            log.warning("simulated nodes whose lease is gone lost their instances",
                        nodes=fenced)

    async def _follow_failsafe(self) -> None:
        while True:
            await asyncio.sleep(2.0)
            with contextlib.suppress(*TRANSIENT):
                kv = await self.store.get(self.keys.failsafe)
                current = FailsafeSet() if kv is None else codec.decode_failsafe(kv.value)
                if current.version != self.failsafe.version:
                    self.failsafe = current
                    live = [n for n in self.nodes.values() if n.alive]
                    await self.store.write_many(
                        [Put(self.keys.node(n.name),
                             codec.encode(n.record(current.version).to_dict())) for n in live])

    async def _leases(self) -> None:
        """The keepalive loop ``start`` began (or a new one)."""
        keeper = self._keeper if self._keeper is not None else asyncio.ensure_future(
            self._keep_leases())
        try:
            await keeper
        finally:
            keeper.cancel()
            if self._rejoiner is not None:
                self._rejoiner.cancel()

    async def run(self) -> None:
        """Keep leases, follow assignments and report instances until cancelled."""
        await run_all(leases=self._leases(), assignments=self._follow_assignments(),
                      supervise=self._supervise(), failsafe=self._follow_failsafe(),
                      timers=self._timers())

    # -- faults ------------------------------------------------------------------------

    def kill(self, fraction: float, seed: int = 0) -> list[str]:
        """Crash ``fraction`` of the live nodes at once: their keepalives stop (the leases
        expire after the TTL) and their instances are gone. Returns their names."""
        live = sorted(n for n, node in self.nodes.items() if node.alive)
        count = max(1, round(len(live) * fraction)) if live and fraction > 0 else 0
        victims = sorted(random.Random(seed).sample(live, count))
        for name in victims:
            node = self.nodes[name]
            node.alive = False
            node.running.clear()
            node.exited.clear()
            node.stopping.clear()
        log.warning("simulated nodes crashed", nodes=len(victims))
        return victims

    async def revoke_all(self) -> None:
        """Give every lease back (the nodes leave at once)."""
        leases = [n.lease for n in self.nodes.values() if n.lease]
        for start in range(0, len(leases), 200):
            await asyncio.gather(*(self.store.revoke_lease(lease)
                                   for lease in leases[start:start + 200]),
                                 return_exceptions=True)

"""The node agent: lease and self-fencing, registration, assignments -> guards, reports."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from hafo.agent.address import node_address
from hafo.agent.app_checks import AppChecks
from hafo.agent.assignments import NodeAssignments
from hafo.agent.cgroups import CgroupRoot
from hafo.agent.claim import Displaced, NodeClaim, etcd_away_policy
from hafo.agent.cluster_record import read_cluster_record, write_cluster_record
from hafo.agent.early_renewal import LeaseBridge
from hafo.agent.environment import StateDirFaults, os_error_text
from hafo.agent.failsafe import AgentFailsafe
from hafo.agent.fencefile import FENCE_FILE, write_deadline
from hafo.agent.health import HealthReport, NodeHealth
from hafo.agent.instances import GuardState, InstanceKey, instance_dir, progress_dir
from hafo.agent.metrics import AgentMetrics
from hafo.agent.outputlog import list_outputs, read_output
from hafo.agent.progress_watch import ProgressWatch
from hafo.agent.recovery_report import (
    MAX_REPORT_BYTES,
    build_report,
    encode_report,
    reported_instances,
)
from hafo.agent.supervisor import Supervisor, newest_per_workload, reap_children
from hafo.checks.os_probes import LoopLagMonitor, OsProbe
from hafo.decisions.fencing import can_start
from hafo.decisions.instances import plan_instances
from hafo.decisions.store_trust import Known
from hafo.gpu import GpuBackend, backend_for
from hafo.model.cluster import (
    Assignment,
    Event,
    Gpu,
    InstanceEnd,
    InstanceStatus,
    NodeRecord,
    Pace,
    ResourceFault,
    Stall,
    Submission,
)
from hafo.model.config import Config
from hafo.model.errors import ValidationError
from hafo.model.output import OutputChunk, OutputRequest
from hafo.model.output_view import OutputLog
from hafo.model.resume import resume_note
from hafo.retry import Retry, RetryPolicy
from hafo.store import (
    TRANSIENT,
    Compare,
    EtcdStore,
    EventLog,
    Keys,
    LeaseKeeper,
    LeaseLost,
    LeaseNotFound,
    Put,
    Store,
    StoreError,
    codec,
)
from hafo.store.identity import StoreTrust
from hafo.tasks import Backoff, restarting, run_all, wait_event

log = structlog.get_logger("hafo.agent")
#: Seconds between two sweeps of the workloads' RAM-tier snapshots (``sweep_memory``: they
#: are kept for minutes after a workload's last instance left the node).
MEMORY_SWEEP_EVERY = 10.0

RECOVERABLE: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError)
REPORT_ERRORS: tuple[type[BaseException], ...] = (*RECOVERABLE, TimeoutError)
SUPERVISE_PERIOD = 0.2
TRUST_EVERY = 2.0  # how often the store's identity is read besides every lost lease
START_HEADROOM = 0.5
#: Resuming the node after its lease expired in an etcd stall: every 0.1 s (jittered down),
#: until the published deadline (``Agent._resume``); a warning from the first failure.
RESUME_POLICY = RetryPolicy(first=0.1, cap=0.1, jitter=0.5, warn_after=1)


class Agent:
    """One node's daemon."""

    def __init__(self, config: Config, gpus: GpuBackend | None = None,
                 store: Store | None = None) -> None:
        """``gpus`` and ``store`` default to the config's (tests pass a simulated backend
        and ``hafo.store.memory.MemoryStore``)."""
        assert config.node is not None, "the agent needs a node section"
        self.config = config
        self.node = config.node
        self.name = config.node.name
        self.state_dir = Path(config.node.state_dir)
        self.keys = Keys(config.cluster)
        self.store: Store = store if store is not None else EtcdStore.from_config(
            config.etcd, reconnect_backoff=config.timing.heartbeat / 2)
        self.registry = CollectorRegistry()  # Prometheus metrics served at /metrics
        self.gpus = gpus if gpus is not None else backend_for(config.node)
        self.state_faults = StateDirFaults(self.state_dir)
        self.published_deadline = 0.0  # the fencing deadline on disk, as the guards read it
        #: renews the recorded lease from the start-up's early renewal until the claim
        #: (hafo.agent.early_renewal.LeaseBridge; set by hafo.agent.main)
        self.lease_bridge: LeaseBridge | None = None
        timing = config.timing
        self.failsafe = AgentFailsafe(self.name, self.store, self.keys, timing.failsafe_max,
                                      last_contact=lambda: self.keeper.last_ack,
                                      tls_ca=config.api.tls_ca, ttl=timing.lease_ttl,
                                      margin=timing.fence_margin)
        self.keeper = LeaseKeeper(self.store, timing.lease_ttl, timing.heartbeat,
                                  timing.fence_margin, on_renew=self._publish_deadline,
                                  failsafe=self.failsafe.confirm)
        self.trust = StoreTrust(self.store, self.keys, f"agent {self.name}",
                                known=read_cluster_record(self.state_dir),
                                on_known=self._keep_known)
        self.failsafe.cluster = self._cluster_text
        self.assignments = NodeAssignments(self.store, self.keys, self.name)
        self.containment = CgroupRoot.detect()
        self.supervisor = Supervisor(self.name, self.state_dir, Path(config.checkpoint_root),
                                     config.node.ports, config.node.logs, self.containment,
                                     write_failed=self._state_dir_failed,
                                     memory_root=Path(config.node.memory_dir))
        self.events = EventLog(self.store, self.keys)
        self.inventory: list[Gpu] = []
        self.os_probe = OsProbe(Path(config.checkpoint_root), config.health,
                                state_dir=self.state_faults.findings)
        self.health = NodeHealth(self.name, self.gpus, self.os_probe, config.health)
        self.healthy, self.unhealthy_reason = True, ""
        self.resource_faults: tuple[ResourceFault, ...] = ()  # shared_faults decides on them
        self.app_checks = AppChecks(self.name, Path(config.checkpoint_root),
                                    on_change=self.assignments.changed.set)
        self.ready_since: dict[InstanceKey, float] = {}  # running instances that are ready
        self.progress = ProgressWatch(self.name)  # hang_timeout (hafo.agent.progress_watch)
        self._next_memory_sweep = 0.0  # monotonic time of the next RAM-tier sweep
        self.health_now = asyncio.Event()  # set: the health loop runs a cycle at once
        self.assignments.on_suspect = self._suspected
        self.app_faults: dict[InstanceKey, str] = {}  # restart-app findings on its GPUs
        self.reported: dict[str, InstanceStatus] = {}
        self._not_launched: dict[InstanceKey, InstanceStatus] = {}  # launches that failed
        self._logged_faults: set[str] = set()  # state directory writes logged as failing
        self.registered = asyncio.Event()
        self.identity_revision = 0
        # set when the store became another history: the identity watch starts again
        self._rewatch_identity = asyncio.Event()
        self._reclaiming = asyncio.Lock()
        self._background: set[asyncio.Future[None]] = set()  # tasks nobody waits for
        self._report_sent: str | None = None  # the recovery report last published
        self._report_put: asyncio.Future[None] | None = None
        self._report_left_out: list[str] = []
        self.claim = NodeClaim(self.name, self.store, self.keys, self.keeper, self.state_dir,
                               self.events, timing.heartbeat, self.supervisor.kill_all,
                               self._epoch_base)
        self.api_address = ""
        self.address = node_address(config.node.address, config.etcd.endpoints)
        self.supervisor.address = self.address
        self.metrics = AgentMetrics(self, self.registry)
        self.store.observer = self.metrics.observe_etcd

    # -- the store's identity (docs/safety.md, "etcd losing its data") ---------------------

    def _keep_known(self, known: Known) -> None:
        try:
            write_cluster_record(self.state_dir, known)
        except OSError as exc:
            self._state_dir_failed("cluster record", exc)

    def _cluster_text(self) -> str | None:
        known = self.trust.known
        return None if known is None else f"{known.id}/{known.generation}"

    async def _trusted_now(self) -> bool:
        """Read the store's identity now; an unreachable store counts as trusted (it is an
        outage, handled as one)."""
        try:
            return await self.trust.check()
        except RECOVERABLE:
            return self.trust.trusted

    async def _hold_untrusted(self, why: str) -> bool:
        """The store is not our cluster (etcd lost its data, an old snapshot, another etcd):
        claim nothing on it, start and stop nothing, and keep the guards' deadline on the
        failsafe's proof (every controller of the set answers "unavailable" for such a
        store) for at most ``timing.failsafe_max`` after our last keepalive, until an
        operator restores or accepts the store. True when it was accepted (a new
        generation: the cluster restarts from the store as it is)."""
        self.registered.clear()
        timing = self.config.timing
        generation = self._generation()
        log.error("etcd is not the cluster this agent knew: keeping work under the failsafe "
                  "rules until an operator decides", node=self.name, why=why,
                  reason=self.trust.reason)
        # In the background: an event write may retry for seconds, the deadline may not.
        said = asyncio.ensure_future(self._say(Event(
            ts=time.time(), kind="store-untrusted", node=self.name,
            message=(f"{self.name}: etcd is not the cluster it knew ({self.trust.reason}); "
                     "its work is kept under the failsafe rules"))))
        self._background.add(said)
        said.add_done_callback(self._background.discard)
        while self.keeper.clock() < self.published_deadline:
            self._publish_report()
            left = await self.failsafe.confirm(timing.heartbeat)
            if left is not None and self.keeper.clock() + left > self.published_deadline:
                self._publish_deadline(self.keeper.clock() + left)
            if await self._trusted_now():
                return self._generation() != generation
            await asyncio.sleep(min(0.5, timing.heartbeat / 2))
        while not await self._trusted_now():  # the guards fenced their work themselves
            self._publish_report()
            await asyncio.sleep(timing.heartbeat)
        return self._generation() != generation

    def _publish_report(self) -> None:
        """Publish this node's recovery report into the store that is not the cluster
        (``hafo.agent.recovery_report``), when it changed, in the background (a put may
        retry for seconds; the deadline may not wait). A plain put: the store's leases are
        not ours. It claims nothing and decides nothing."""
        known = self.trust.known
        if known is None or (self._report_put is not None and not self._report_put.done()):
            return
        try:
            entries, unrecorded = reported_instances(self.state_dir)
        except OSError as exc:
            self._state_dir_failed("recovery report", exc)
            return
        report, left_out = build_report(self.name, known, entries)
        content = json.dumps(report, sort_keys=True)
        if content == self._report_sent:
            return
        if left_out != self._report_left_out and left_out:
            log.warning("recovery report: instances left out, over its size limit",
                        node=self.name, left_out=left_out, count=len(left_out),
                        limit_kib=MAX_REPORT_BYTES >> 10)
        self._report_left_out = left_out

        async def put() -> None:
            try:
                await asyncio.wait_for(self.store.put(self.keys.report(self.name),
                                                      encode_report(report, time.time())),
                                       max(1.0, self.config.timing.heartbeat))
            except REPORT_ERRORS:
                return  # tried again on the next turn
            self._report_sent = content
            log.info("recovery report published", node=self.name,
                     instances=len(report["instances"]), without_record=unrecorded or None)

        self._report_put = asyncio.ensure_future(put())

    async def _forget_report(self) -> None:
        """The store is the cluster again: this node's recovery report describes work that
        is fenced now (best effort; ``hafo recover`` never needs it again)."""
        self._report_sent = None
        if self._report_put is not None and not self._report_put.done():
            self._report_put.cancel()
        with contextlib.suppress(*REPORT_ERRORS):
            await asyncio.wait_for(self.store.delete(self.keys.report(self.name)),
                                   max(1.0, self.config.timing.heartbeat))

    async def _say(self, event: Event) -> None:
        with contextlib.suppress(*RECOVERABLE):
            await self.events.append(event)

    def _generation(self) -> int:
        known = self.trust.known
        return 0 if known is None else known.generation

    async def _watch_trust(self) -> None:
        """Read the store's identity every ``TRUST_EVERY``: an operator's accept (a new
        generation) restarts this node's work from the store as it is; a store that stops
        being the cluster while our lease lives on in it (an old snapshot restored with its
        leases) stops every start and stop until it is again (``supervise_once``)."""
        while True:
            await asyncio.sleep(TRUST_EVERY)
            if not await self._trusted_now():
                self._publish_report()
            if self.trust.accepted and self.registered.is_set():
                await self._start_over("found the store accepted as the cluster by an "
                                       "operator")

    async def _start_over(self, why: str) -> None:
        """An operator accepted the store as the cluster: what ran before it is not in it,
        so fence everything, forget the records of the earlier store's epochs (its revisions
        may repeat in the accepted one) and claim the name afresh."""
        async with self._reclaiming:
            self.supervisor.kill_all(why)
            for key, state in self.supervisor.states().items():
                if state.state == "exited":
                    self.supervisor.forget(key)
            self.failsafe.forget_set()  # the accepted store's set, whatever its version
            self.assignments.copies.forget()  # and its assignments, whatever their revision
        await self._forget_report()
        await self._reclaim(why)
        # The identity watch resumes from the earlier store's revision, which the accepted
        # one may not reach for a long time: it would miss every change meanwhile.
        self._rewatch_identity.set()

    # -- lease and registration ------------------------------------------------------------

    def _publish_deadline(self, deadline: float) -> None:
        """Write the fencing deadline for the guards. A write that fails (the state directory
        read-only or full) is recorded for the health probe, never raised: the lease is still
        kept, and the guards fence their work at the deadline last written, which is the one
        this agent goes on believing (``fence_deadline``)."""
        try:
            write_deadline(self.state_dir, deadline)
        except OSError as exc:
            first = not self.state_faults.fence_failing
            detail = self.state_faults.failed(StateDirFaults.FENCE,
                                              self.state_dir / FENCE_FILE, exc)
            if first:  # once until it is written again: it fails every heartbeat meanwhile
                log.error("fencing deadline not published: the guards fence their work at "
                          "the last one written", node=self.name, error=detail,
                          fenced_in=round(self.published_deadline - self.keeper.clock(), 3))
            return
        self.published_deadline = deadline
        if self.state_faults.succeeded(StateDirFaults.FENCE):
            log.warning("fencing deadline published again", node=self.name,
                        fenced_in=round(deadline - self.keeper.clock(), 3))

    def fence_deadline(self) -> float:
        """The fencing deadline this agent's guards hold it to: the lease's, as far as it was
        published (a deadline that could not be written is not the guards')."""
        return min(self.keeper.deadline, self.published_deadline)

    def fence_valid(self) -> bool:
        """The lease is valid and the guards' deadline has not passed."""
        return self.keeper.valid() and self.keeper.clock() < self.fence_deadline()

    def _state_dir_failed(self, what: str, exc: OSError) -> None:
        """A write into the state directory failed: log it and tell the health probe."""
        path = Path(exc.filename) if exc.filename else self.state_dir
        detail = self.state_faults.failed(what, path, exc)
        if what not in self._logged_faults:  # once until the state directory works again
            self._logged_faults.add(what)
            log.error("state directory not written", what=what, node=self.name, error=detail)

    async def acquire_lease(self) -> bool:
        """Hold the node name (``hafo.agent.claim``): adopt the lease of our own records if it
        still lives (hitless restart), else wait while another live lease holds the name, then
        claim it with a fresh lease. Returns True when adopted."""
        return await self.claim.acquire()

    def node_record(self) -> NodeRecord:
        """This node's inventory and health, with the lease that holds the name."""
        return NodeRecord(name=self.name, labels=dict(self.node.labels),
                          gpus=tuple(self.inventory), healthy=self.healthy,
                          reason=self.unhealthy_reason, api=self.api_address,
                          failsafe_seen=self.failsafe.current.version,
                          lease=self.keeper.lease_id or 0, address=self.address,
                          containment=self.containment_text,
                          resource_faults=self.resource_faults)

    @property
    def containment_text(self) -> str:
        """How instances are contained, for the node record and the start-up line."""
        if self.containment.contained:
            return "cgroup"
        return f"processes ({self.containment.reason})"

    async def register(self) -> None:
        """Publish inventory and make sure the lease-bound liveness key is ours."""
        self._apply_health(await self.health.cycle())
        await self.failsafe.refresh()
        await self.store.put(self.keys.node(self.name), codec.encode(self.node_record().to_dict()))
        self.identity_revision = await self.claim.ensure_alive_key()
        self.reported.clear()
        self.registered.set()
        log.info("node registered", node=self.name, gpus=self.gpus.description,
                 claimed=self.claim.claimed)

    async def _reclaim(self, why: str) -> None:
        """Our hold on the node is gone (lease lost, or another lease took the liveness key):
        fence all work, then hold the name again (waiting while someone else holds it)."""
        async with self._reclaiming:
            self.registered.clear()
            self.supervisor.kill_all(why)
            log.warning("all work fenced, registering again", node=self.name, why=why)
            await self._register_again(
                "node-reregistered", f"{self.name} {why} and registered again; its work was "
                "fenced", acquire=True)

    async def _register_again(self, kind: str, message: str, acquire: bool) -> None:
        """Register again (``acquire``: hold the node name first), retrying while etcd is
        away, then say so with an event of ``kind``."""
        retry = Retry("node registration", etcd_away_policy(self.config.timing.heartbeat),
                      logger=log, node=self.name)
        while True:
            try:
                if acquire:
                    await self.claim.acquire()
                await self.register()
                await self.assignments.load()
                break
            except TRANSIENT as exc:
                await retry.failed(exc)
        retry.succeeded()
        with contextlib.suppress(*TRANSIENT):
            await self.events.append(Event(ts=time.time(), kind=kind, node=self.name,
                                           message=message))

    async def _keep_lease(self) -> None:
        """Keep the lease; on loss hold the node again with a new lease, keeping the work if
        that is proven safe (``_resume``), else fencing it all first (``_reclaim``)."""
        while True:
            try:
                await self.keeper.run()
            except LeaseLost as exc:
                why = f"lost its lease ({exc})"
                if not await self._trusted_now():
                    async with self._reclaiming:
                        accepted = await self._hold_untrusted(why)
                    if accepted:
                        await self._start_over(f"{why}; the store was accepted as the cluster")
                        continue
                if not await self._resume(why):
                    await self._reclaim(why)

    async def _resume(self, why: str) -> bool:
        """The lease expired while the guards' deadline is still ahead: in an etcd stall (a
        frozen or slow etcd expires every lease as it resumes) or an outage that the
        failsafe bridged. Hold the node again with a new lease and keep every instance and
        epoch, if ``NodeClaim.resume`` proves that no controller moved any of them; tried
        until that deadline, after which the guards fence their work themselves. True when
        resumed (docs/safety.md, "An etcd stall")."""
        async with self._reclaiming:
            self.registered.clear()
            live = {key.workload for key, state in self.supervisor.states().items()
                    if state.state != "exited"}
            seen_at = self.assignments.revision
            resumed = False
            # Tried until the published deadline (the loop's condition): every 0.1 s at most.
            # Meanwhile the controllers' promises still move that deadline on (rule 2).
            retry = Retry("node resume", RESUME_POLICY, logger=log, node=self.name)
            covering = asyncio.ensure_future(self._cover_while_resuming())
            try:
                while self.keeper.clock() < self.published_deadline:
                    try:
                        resumed = await self.claim.resume(live, seen_at)
                        break
                    except TRANSIENT as exc:
                        await retry.failed(exc)
            finally:
                covering.cancel()
                await asyncio.gather(covering, return_exceptions=True)
            retry.succeeded()
            if not resumed:
                return False
            await self._register_again(
                "node-resumed", f"{self.name} {why} and holds the node again with a new lease; "
                f"its {len(live)} instance(s) kept their processes and epochs", acquire=False)
            return True

    async def _cover_while_resuming(self) -> None:
        """While a resume retries on an etcd that has just come back (busy with a backlog, a
        raft election, every daemon reconnecting at once), go on asking the controllers: each
        that answers "recovering" (or "unavailable") holds its failovers for its hold from
        that answer (rule 5), so the guards' deadline may move on with it, exactly as it did
        through the stall. Without this, a resume had only the last promise's hold (about a
        lease TTL) after the stall to commit, and a slow one fenced work the stall was meant
        to leave alone. Cancelled when the resume ends."""
        heartbeat = self.config.timing.heartbeat
        while True:
            started = self.keeper.clock()
            try:
                left = await self.failsafe.confirm(heartbeat)
            except Exception as exc:  # a bug in a round must not end the resume's cover
                log.error("failsafe round failed", node=self.name, error=repr(exc))
                left = None
            if left is not None and self.keeper.clock() + left > self.published_deadline:
                self._publish_deadline(self.keeper.clock() + left)
            await asyncio.sleep(max(0.0, min(0.5, heartbeat / 2)
                                    - (self.keeper.clock() - started)))

    async def _watch_identity(self) -> None:
        """Notice at once when our liveness key or node record disappears while our lease
        lives (deleted by hand): put it back; if another lease holds the liveness key, fence
        and claim again (we cannot prove we still own the node's work)."""
        # A watch that ran longer than the policy's cap before it failed starts a new streak.
        retry = Retry("identity watch", dataclasses.replace(
            etcd_away_policy(self.config.timing.heartbeat), warn_after=1,
            reset_after=self.config.timing.heartbeat), logger=log, node=self.name)
        while True:
            await self.registered.wait()
            self._rewatch_identity.clear()
            start = self.identity_revision + 1
            try:
                async for event in self._identity_events(start):
                    key, kind, lease = event
                    if not self.registered.is_set() or not self.keeper.valid():
                        continue  # the lease path is at work
                    if key == self.keys.node(self.name) and kind == "delete":
                        log.warning("node record deleted while our lease lives: written again",
                                    node=self.name)
                        await self.store.put(key, codec.encode(self.node_record().to_dict()))
                    elif key == self.keys.alive(self.name):
                        if kind == "delete":
                            log.warning("liveness key deleted while our lease lives: put back",
                                        node=self.name)
                        if kind == "delete" or lease != self.keeper.lease_id:
                            held = self.keeper.lease_id
                            try:
                                self.identity_revision = await self.claim.ensure_alive_key()
                            except LeaseNotFound:
                                # Our key went with our lease (a stalled etcd leader that
                                # resumed revoked it): hold the node again now, before a
                                # controller acts on its absence.
                                self.keeper.declare_lost(held, "is gone (its liveness key "
                                                         "with it)")
            except Displaced as exc:
                await self._reclaim(f"was displaced ({exc})")
            except RECOVERABLE as exc:
                await retry.failed(exc)

    async def _identity_events(self, start: int) -> AsyncIterator[tuple[str, str, int]]:
        """(key, put|delete, lease) for our liveness key and node record, merged; ends when
        the store becomes another history (``_start_over``)."""
        queue: asyncio.Queue[tuple[str, str, int] | BaseException | None] = asyncio.Queue()

        async def rewatch() -> None:
            await self._rewatch_identity.wait()
            await queue.put(None)

        async def pump(key: str) -> None:
            try:
                async for event in self.store.watch_key(key, start):
                    await queue.put((key, event.kind, event.kv.lease))
            except BaseException as exc:  # handed to the consumer
                await queue.put(exc)
                raise

        tasks = [asyncio.create_task(pump(k))
                 for k in (self.keys.alive(self.name), self.keys.node(self.name))]
        tasks.append(asyncio.create_task(rewatch()))
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in tasks:
                task.cancel()

    # -- loops --------------------------------------------------------------------------

    def _apply_health(self, report: HealthReport) -> bool:
        """Take one health cycle's outcome; True if the node record changed."""
        for index, why in report.restart_apps.items():
            for workload, assignment in self.assignments.placed.items():
                key = InstanceKey(workload, assignment.epoch)
                if index in assignment.gpus and key not in self.app_faults:
                    self.app_faults[key] = why
                    log.warning("application fault on its GPU", workload=workload,
                                node=self.name, epoch=assignment.epoch, why=why)
        changed = (report.inventory != self.inventory or report.healthy != self.healthy
                   or report.reason != self.unhealthy_reason
                   or report.resource_faults != self.resource_faults)
        self.inventory = report.inventory
        self.healthy, self.unhealthy_reason = report.healthy, report.reason
        self.resource_faults = report.resource_faults
        return changed

    async def _health_loop(self) -> None:
        while True:
            await wait_event(self.health_now, self.config.health.interval)
            self.health_now.clear()
            report = await self.health.cycle()
            changed = self._apply_health(report)
            failsafe_changed = await self.failsafe.refresh()
            if changed or failsafe_changed:
                with contextlib.suppress(*TRANSIENT):
                    await self.store.put(self.keys.node(self.name),
                                         codec.encode(self.node_record().to_dict()))
            for change in report.changes:
                log.warning("health changed", node=self.name, change=change)
                with contextlib.suppress(*TRANSIENT):
                    await self.events.append(Event(ts=time.time(), kind="health",
                                                   node=self.name, message=change))
            await self.metrics.sample_gpus(self.gpus.telemetry)  # metrics only: not to etcd

    async def _loop_lag(self) -> None:
        def record(seconds: float) -> None:
            self.os_probe.set_loop_lag(seconds)
            self.metrics.loop_lag = seconds

        await LoopLagMonitor().run(record)

    async def _supervise_loop(self) -> None:
        while True:
            await wait_event(self.assignments.changed, SUPERVISE_PERIOD)
            self.assignments.changed.clear()
            try:
                await self.supervise_once()
            except TRANSIENT as exc:
                log.warning("supervise cycle: etcd unavailable", node=self.name,
                            error=type(exc).__name__)
            except Exception:  # one bad cycle (disk full, a bad spec) must not stop the agent
                log.exception("supervise cycle failed", node=self.name)

    async def supervise_once(self) -> None:
        """One pass: stop what is not wanted, start what is, report what runs. Nothing while
        the store is not the cluster (its assignments are not ours to follow)."""
        reap_children()
        if not self.trust.trusted:
            return
        states = self._states()
        desired = {InstanceKey(w, a.epoch): a for w, a in self.assignments.placed.items()}
        may_start = self.registered.is_set() and can_start(
            self.keeper.clock(), self.fence_deadline(), START_HEADROOM)
        plan = plan_instances([(k.workload, k.epoch) for k in desired],
                              {(k.workload, k.epoch): s.state != "exited"
                               for k, s in states.items()}, may_start, self.claim.claimed,
                              park=self.assignments.park,
                              parked=[(k.workload, k.epoch) for k, s in states.items()
                                      if s.state == "parked"])
        for workload, epoch in plan.park:
            key = InstanceKey(workload, epoch)
            failing = self.failing(key)
            if failing:
                self.supervisor.stop(key, states[key], failing, urgent=True)
            else:
                self.supervisor.park(key, states[key])
        for (workload, epoch), new in plan.hand_over:
            await self._hand_over(InstanceKey(workload, epoch), InstanceKey(*new),
                                  desired[InstanceKey(*new)], states)
        for workload, epoch in plan.stop:
            key = InstanceKey(workload, epoch)
            failing = self.failing(key)
            urgent = self.assignments.urgent.get(workload) == epoch or bool(failing)
            self.supervisor.stop(key, states[key], failing or "no longer assigned to this node",
                                 urgent=urgent)
        for workload, epoch in plan.start:
            key = InstanceKey(workload, epoch)
            assignment = desired[key]
            submission = await self.assignments.spec(key.workload, key.epoch)
            if submission is None:
                continue
            service = await self._service_of(submission)  # read before the announcement
            if not await self._announce_start(key, assignment):
                continue
            await self._launch(key, assignment, submission, service)
        states = self._states()
        await self._check_apps(states, desired)
        await self._report(states, desired)

    async def _hand_over(self, parked: InstanceKey, key: InstanceKey, assignment: Assignment,
                         states: dict[InstanceKey, GuardState]) -> None:
        """Hand a parked warm member's process the instance ``key`` (announced first, as any
        start); a parked member whose next instance here launches differently (another
        command, GPUs or environment) is stopped, and that instance starts anew."""
        submission = await self.assignments.spec(key.workload, key.epoch)
        if submission is None:
            return
        gpu_ids = self._gpu_ids(assignment)
        refusal = self.supervisor.handover_refusal(parked, submission, gpu_ids)
        if refusal:
            self.supervisor.stop(parked, states[parked], f"parked, not handed over: {refusal}",
                                 urgent=True)
            return
        service = await self._service_of(submission)
        if not await self._announce_start(key, assignment):
            return
        try:
            self.supervisor.hand_over(parked, assignment, submission, gpu_ids, service)
        except (ValidationError, OSError) as exc:
            log.error("hand-over failed", workload=key.workload, node=self.name,
                      epoch=key.epoch, error=str(exc))
            shutil.rmtree(instance_dir(self.state_dir, key), ignore_errors=True)
            self.supervisor.stop(parked, states[parked], "hand-over failed", urgent=True)
            return
        await self.events.append(Event(
            ts=time.time(), kind="handed-over", workload=key.workload, node=self.name,
            epoch=key.epoch, message=f"the parked process of instance {parked.epoch} is "
                                     f"handed instance {key.epoch}"))

    def _gpu_ids(self, assignment: Assignment) -> list[str]:
        """The ``CUDA_VISIBLE_DEVICES`` entries of the assignment's GPUs on this node."""
        by_index = {g.index: g.uuid for g in self.inventory}
        return [str(i) if self.node.simulate is not None else by_index.get(i, str(i))
                for i in assignment.gpus]

    async def _service_of(self, submission: Submission) -> Submission | None:
        """A replica's service's submission (None: not a replica, or the service is gone),
        kept with the instance for ``hafo recover --from-agents``."""
        if submission.service is None:
            return None
        kv = await self.store.get(self.keys.workload(submission.service))
        if kv is None:
            return None
        try:
            return codec.decode_submission(kv.value)
        except ValueError:
            return None

    async def _launch(self, key: InstanceKey, assignment: Assignment,
                      submission: Submission, service: Submission | None = None) -> None:
        """Start one announced instance. A launch the state directory refuses (read-only,
        full) is reported exited at once (``guard-lost``: not the workload's fault), so the
        controller, which saw it ``starting``, does not wait for it."""
        try:
            self.supervisor.launch(assignment, submission, self._gpu_ids(assignment), service)
        except ValidationError as exc:  # an id no submit makes: never a path from it
            log.error("refusing to start", workload=key.workload, node=self.name,
                      epoch=key.epoch, error=str(exc))
        except OSError as exc:
            self._state_dir_failed("launch files", exc)
            shutil.rmtree(instance_dir(self.state_dir, key), ignore_errors=True)
            status = InstanceStatus(workload=key.workload, node=self.name, epoch=key.epoch,
                                    state="exited", finished_at=time.time(),
                                    ended=InstanceEnd.GUARD_LOST,
                                    stderr_tail=f"not launched: {os_error_text(exc)}"
                                    + (f": {exc.filename}" if exc.filename else ""))
            if self.keeper.lease_id is not None:
                await self.store.put(self.keys.status(key.workload, self.name),
                                     codec.encode(status.to_dict()), lease=self.keeper.lease_id)
            self.reported[key.workload] = status
            self._not_launched[key] = status

    def _states(self) -> dict[InstanceKey, GuardState]:
        """Every instance's guard state (``Supervisor.states``, which keeps in memory what
        the state directory refuses); says once when the directory works again."""
        states = self.supervisor.states()
        if self._logged_faults and not (self.supervisor.pending_writes
                                        or self.state_faults.fence_failing):
            log.warning("state directory: writable again", node=self.name)
            self._logged_faults.clear()
        return states

    def memory_held(self) -> dict[str, int]:
        """Workload -> bytes of its RAM-tier snapshots on this node (for the metrics)."""
        return self.supervisor.memory_held()

    def _epoch_base(self) -> int:
        """The trusted cluster identity's ``epoch_base``: an assignment of this generation
        has the epoch of its revision plus it (``hafo.decisions.store_trust``)."""
        known = self.trust.known
        return known.epoch_base if known is not None else 0

    async def _announce_start(self, key: InstanceKey, assignment: Assignment) -> bool:
        """Report the instance as ``starting`` before it is launched, in one txn with a
        compare that its assignment is still the one that placed it (its mod revision is
        the one the epoch was made of: ``Assignment.revision``).

        A controller that moves the workload (phase ``moving``) waits until the instance it
        stops is reported exited; it takes a missing report to mean "never launched". This
        makes that true: an instance is launched only after its report is in etcd, and never
        once its assignment has changed (docs/safety.md, rule 1)."""
        lease = self.keeper.lease_id
        if lease is None:
            return False
        status = InstanceStatus(workload=key.workload, node=self.name, epoch=key.epoch,
                                state="starting")
        # a standby's copy was written after the assignment it copies (``revision_of``)
        revision = assignment.revision_of or assignment.revision
        result = await self.store.txn(
            [Compare(self.keys.assignment(key.workload), "mod", "==", revision)],
            [Put(self.keys.status(key.workload, self.name), codec.encode(status.to_dict()),
                 lease=lease)])
        if not result.succeeded:
            log.info("not started: its assignment changed meanwhile", workload=key.workload,
                     node=self.name, epoch=key.epoch)
            return False
        self.reported[key.workload] = status
        return True

    def failing(self, key: InstanceKey) -> str:
        """Why a running instance counts as failed ("" if it does not)."""
        return self.app_checks.failing(key) or self.app_faults.get(key, "")

    async def _check_apps(self, states: dict[InstanceKey, GuardState],
                          desired: dict[InstanceKey, Any]) -> None:
        """Run the checks of desired, running instances; retire the others'."""
        live = {k for k, s in states.items() if k in desired and s.state == "running"}
        await self.app_checks.retire(live)
        self.progress.retire(live)
        for key in live:
            submission = await self.assignments.spec(key.workload, key.epoch)
            if submission is not None:
                self.app_checks.ensure(key, states[key], submission,
                                       self.supervisor.ports_of(key))
        for key in [k for k in self.ready_since if k not in live]:
            del self.ready_since[key]
        for key in [k for k in self.app_faults if k not in states]:
            del self.app_faults[key]

    async def _report(self, states: dict[InstanceKey, Any],
                      desired: dict[InstanceKey, Any]) -> None:
        if not self.registered.is_set() or self.keeper.lease_id is None:
            return
        newest = newest_per_workload(states)
        for workload, key in newest.items():
            status = self.supervisor.status_of(key, states[key])
            failing = self.failing(key) if status.state == "running" else ""
            if failing:
                status = dataclasses.replace(status, failing=failing)
            stalled = self._stalled(key, status, desired)
            if stalled is not None:
                status = dataclasses.replace(status, stalled=stalled)
            if self.progress.progressed(key):
                status = dataclasses.replace(status, progressed=True)
            pace = self._pace(key, status)
            if pace is not None:
                status = dataclasses.replace(status, pace=pace)
            if status.state == "running":
                restored = self.progress.restored(
                    key, progress_dir(instance_dir(self.state_dir, key)))
                if restored is not None:
                    status = dataclasses.replace(status, restored=restored)
            since = self._readiness(key, status, desired)
            if since is not None:
                status = dataclasses.replace(status, ready=True, ready_since=since)
            if self.reported.get(workload) != status:
                await self.store.put(self.keys.status(workload, self.name),
                                     codec.encode(status.to_dict()), lease=self.keeper.lease_id)
                self.reported[workload] = status
                if status.state == "exited":
                    log.info("instance exited", workload=workload, node=self.name,
                             epoch=key.epoch, exit_code=status.exit_code,
                             reason=states[key].reason)
                    await self._exit_event(key, states[key], status)
        for key, state in states.items():
            if key not in desired and state.state == "exited":
                newest_key = newest.get(key.workload)
                if newest_key == key:
                    await self.store.delete(self.keys.status(key.workload, self.name))
                    self.reported.pop(key.workload, None)
                self.supervisor.forget(key)
        if time.monotonic() >= self._next_memory_sweep:  # minutes matter here, not cycles
            self._next_memory_sweep = time.monotonic() + MEMORY_SWEEP_EVERY
            self.supervisor.sweep_memory()
        for key in [k for k in self._not_launched if k not in desired]:
            status = self._not_launched.pop(key)
            if self.reported.get(key.workload) == status:
                await self.store.delete(self.keys.status(key.workload, self.name))
                self.reported.pop(key.workload, None)

    def _stalled(self, key: InstanceKey, status: InstanceStatus,
                 desired: dict[InstanceKey, Any]) -> Stall | None:
        """The running, wanted instance's stall (``hang_timeout``; None: it progresses, or
        its spec sets none). A new stall past start-up (a rank reported a step) makes the
        node suspect: its health checks run at once (docs/reference/workloads.md, "Hang
        detection")."""
        submission = self.assignments.specs.get(key.workload)
        if submission is None or status.state != "running" or key not in desired:
            return None
        timeout = submission.spec.hang_timeout
        if timeout is None and submission.spec.straggler_lag is None:
            return None
        stall = self.progress.stall(key, progress_dir(instance_dir(self.state_dir, key)),
                                    timeout)
        reported = self.reported.get(key.workload)
        if stall is not None and stall.step is not None and (
                reported is None or reported.stalled != stall):
            log.warning("instance made no progress: running this node's health checks now",
                        workload=key.workload, node=self.name, epoch=key.epoch,
                        stall=stall.describe())
            self.health_now.set()
        return stall

    def _suspected(self, workload: str) -> None:
        """A hang or a straggler of ``workload`` was blamed on this node: its health checks
        run at once (docs/reference/workloads.md, "Hang detection")."""
        log.warning("a hang or straggler was blamed on this node: running its health checks "
                    "now", workload=workload, node=self.name)
        self.health_now.set()

    def _pace(self, key: InstanceKey, status: InstanceStatus) -> Pace | None:
        """The running instance's slowest rank's own time per step, for a gang with
        ``straggler_lag`` (reported again only when it moved by a quarter of the lag)."""
        submission = self.assignments.specs.get(key.workload)
        lag = submission.spec.straggler_lag if submission is not None else None
        if status.state != "running" or lag is None:
            return None
        return self.progress.pace(key, max(lag / 4, 0.005))

    def _readiness(self, key: InstanceKey, status: InstanceStatus,
                   desired: dict[InstanceKey, Any]) -> float | None:
        """Since when a running, wanted instance is ready (its readiness checks pass), or
        None (docs/reference/workloads.md, "Readiness")."""
        ready = (status.state == "running" and key in desired and not status.failing
                 and self.app_checks.ready(key, self.assignments.specs.get(key.workload)))
        if not ready:
            self.ready_since.pop(key, None)
            return None
        return self.ready_since.setdefault(key, time.time())

    async def serving(self, ref: str) -> tuple[bool, str]:
        """Whether a ready instance of workload ``ref`` (its name, id, or a replica's id)
        runs on this node and is in rotation (``GET /v1/workloads/{name}/ready``): (answer,
        why). A replica being replaced is out of rotation (read from etcd; unreachable:
        this node's own view counts)."""
        if not self.ready():
            return False, "this node's agent holds no valid lease or fencing deadline"
        for workload, status in sorted(self.reported.items()):
            submission = self.assignments.specs.get(workload)
            if submission is None or ref not in (workload, submission.service,
                                                 submission.spec.name):
                continue
            if not (status.ready and status.state == "running"):
                continue
            with contextlib.suppress(*TRANSIENT):
                kv = await self.store.get(self.keys.workload(workload))
                if kv is None or codec.decode_submission(kv.value).retiring is not None:
                    continue
            return True, f"{workload} (instance {status.epoch}) is ready on {self.name}"
        return False, f"no ready instance of {ref!r} on {self.name}"

    async def _exit_event(self, key: InstanceKey, guard: GuardState,
                          status: InstanceStatus) -> None:
        """Say in the event log how a stopped or fenced instance ended (checkpoint or not)."""
        reason = guard.reason
        if key in self.supervisor.stopping:
            kind = "stopped"
            if guard.stop_checkpoint is None:  # no checkpoint committed for this stop
                # the report of an exited instance reads the checkpoints after its end
                # (Supervisor.checkpoint_info): the one the next instance restores
                reason = f"{reason}; {resume_note(status.checkpoint, exact=True)}"
            if guard.transparent:
                reason = f"transparent checkpoint refused: {guard.transparent}; {reason}"
        elif guard.ended is InstanceEnd.FENCED:
            kind = "fenced"
        else:
            return
        await self.events.append(Event(ts=time.time(), kind=kind, workload=key.workload,
                                       node=self.name, epoch=key.epoch, message=reason))

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until cancelled. The lease is kept alive from the moment it is held: the first
        registration (a health cycle, NVML on a real node) may take longer than the fencing
        deadline leaves an adopted lease."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.containment.contained:
            log.info("instances contained in cgroups", node=self.name,
                     cgroup=str(self.containment.path))
        else:
            log.warning("no cgroup for instances: their processes are found by tree and "
                        "environment, a weaker guarantee (docs/safety.md, rule 7)",
                        node=self.name, why=self.containment.reason)
        await self._until_done("read the store's identity", self.trust.check)
        while not self.trust.trusted:  # claim nothing on a store that is not our cluster
            log.error("etcd is not the cluster this agent knew: waiting for an operator to "
                      "restore or accept it", node=self.name, reason=self.trust.reason)
            self._publish_report()
            await asyncio.sleep(self.config.timing.heartbeat)
            await self._until_done("read the store's identity", self.trust.check)
        if self.lease_bridge is not None:  # the claim's keepalive takes over from here
            self.lease_bridge.stop()
        await self._until_done("claim the node name", self.acquire_lease)
        lease = asyncio.create_task(self._restarting("lease", self._keep_lease), name="lease")
        try:
            async with self._reclaiming:  # a lease lost meanwhile is reclaimed after this
                await self._until_done("register", self.register)
                await self._until_done("load assignments", self.assignments.load)
        except BaseException:
            lease.cancel()
            await asyncio.gather(lease, return_exceptions=True)
            raise
        if ready is not None:
            ready.set()
        await run_all(lease=lease, identity=self._restarting("identity", self._watch_identity),
                      assignments=self._restarting("assignments", self.assignments.follow),
                      supervise=self._restarting("supervise", self._supervise_loop),
                      health=self._restarting("health", self._health_loop),
                      loop_lag=self._restarting("loop_lag", self._loop_lag),
                      trust=self._restarting("trust", self._watch_trust))

    async def _until_done(self, what: str, step: Callable[[], Awaitable[Any]]) -> None:
        """One start-up step, tried again (logged, with backoff) while etcd is unavailable or
        refuses it (an etcd restarting, a dropped raft proposal): the agent does not exit of
        it at start-up any more than later."""
        # Forever, 0.1 s doubling up to 5 s, jittered down; every failure is a warning (the
        # first at once), rate-limited.
        retry = Retry(f"start-up: {what}", dataclasses.replace(Backoff(), warn_after=1),
                      logger=log, node=self.name)
        while True:
            try:
                await step()
                retry.succeeded()
                return
            except RECOVERABLE as exc:
                await retry.failed(exc)

    async def _restarting(self, name: str, loop: Callable[[], Awaitable[Any]]) -> None:
        """Run one of the agent's loops, started again (logged, with backoff) after an
        unexpected exception (``hafo.tasks.restarting``). Every loop may be: each starts from
        state the agent keeps (the lease loop from the keeper, whose deadline moves only on
        acknowledged keepalives; a lease lost meanwhile is found by its next keepalive and
        fences all work)."""
        await restarting(name, loop, logger=log.bind(node=self.name))

    async def close(self) -> None:
        """Release the etcd connection and the GPU backend (the lease is kept: guards and
        workloads live on, and a restarted agent adopts them). One last keepalive first, so
        the guards have the most time to wait for the next agent (``systemctl restart``)."""
        if self.lease_bridge is not None:
            self.lease_bridge.stop()
        if self.registered.is_set() and self.keeper.valid():
            with contextlib.suppress(*TRANSIENT, LeaseLost, asyncio.TimeoutError):
                await asyncio.wait_for(self.keeper.keepalive_once(),
                                       self.config.timing.heartbeat)
        await self.app_checks.close()
        self.gpus.close()
        await self.store.close()

    def output_logs(self, workload: str) -> list[OutputLog]:
        """For ``GET /v1/workloads/{id}/logs``: the output this node keeps of each instance
        of ``workload`` (an id), oldest first."""
        return list_outputs(self.state_dir, self.name, workload)

    def read_output(self, workload: str, epoch: int,
                    request: OutputRequest) -> OutputChunk | None:
        """For ``GET /v1/workloads/{id}/logs/{epoch}`` (None: none kept here). Synchronous
        on purpose: the supervise loop moves ended outputs in this event loop too, so a
        read never sees an output half moved."""
        return read_output(self.state_dir, self.name, workload, epoch, request)

    def ready(self) -> bool:
        """Registered, with a lease whose fencing deadline, as published to the guards, has
        not passed."""
        return self.registered.is_set() and self.fence_valid()

    def status(self) -> dict[str, Any]:
        """For ``GET /v1/node``."""
        return {"node": self.node_record().to_dict(), "lease_valid": self.keeper.valid(),
                "fenced_in": round(self.fence_deadline() - self.keeper.clock(), 3),
                "fence_unpublished": self.state_faults.fence_failing or None,
                "etcd_contact_age": round(self.keeper.clock() - self.keeper.last_ack, 3),
                "waiting_for_name": (f"{self.claim.waiting_for:x}"
                                     if self.claim.waiting_for else None),
                "instances": {w: s.to_dict() for w, s in self.reported.items()},
                "checks": {k.workload: self.app_checks.results(k)
                           for k in self.app_checks.running}}

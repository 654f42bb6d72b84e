"""The controller's Prometheus metrics (served at ``/metrics``, on the controller's registry).

At scrape time, from the cache's snapshot (``hafo_nodes``, ``hafo_workloads``, ``hafo_gpus``,
every state always present; per node and per workload ``hafo_node_state``,
``hafo_workload_state`` and ``hafo_workload_restarts_total``, for alerts that name them), the
election (``hafo_leader``), the failsafe side (``hafo_failsafe_active``) and whether this
controller's API auth differs from the cluster's (``hafo_api_auth_mismatch``). Counted by the
leader once per applied decision (``hafo_failovers_total``, ``hafo_restarts_total``), with
the latency of detection and recovery (``hafo_detection_seconds``,
``hafo_recovery_seconds``), and the cost of each reconcile cycle and of each etcd request.
Per declared queue (``hafo_queue_*``): ``hafo.controller.queue_metrics``.

The pure parts are plain functions over a snapshot and a plan with an injected ``now``:
``classify`` maps an applied action to (``failover`` | ``restart``, cause) from the cause the
action carries (``hafo.decisions.plan.Cause``), ``decisions`` adds the time each failure is
known from. Causes:

========================  ====================================================================
failover cause            decision
========================  ====================================================================
``node-down``             the node's liveness key expired: place the work elsewhere
``node-unhealthy``        the agent marked its node unhealthy (OS check, fatal GPU finding)
``gpu-fault``             a GPU of the workload is unhealthy (e.g. Xid 79, double-bit ECC)
``gpu-degraded``          a GPU of the workload is degrading (still usable; checkpoint first)
``app-failed``            the application failed past its restart limit: move it
``planned``               ``hafo migrate`` / ``hafo drain``
``preempted``             room for a higher-priority workload
``preflight``             a gang's pre-flight blamed a member: it goes elsewhere (not counted)
========================  ====================================================================

Restart causes (in place): ``exited`` (non-zero exit), ``failing`` (a check past its
threshold, or an application Xid on its GPU), ``hung`` (no progress for ``hang_timeout``) and
``straggler`` (a gang member slower than ``straggler_lag``), within the restart limit, and
``infrastructure`` (fenced, guard lost, node claimed anew: counted toward no limit).

What ``hafo_detection_seconds`` measures (the records carry no time of the failure itself for
most causes; every time is this controller's wall clock unless said):

- ``node-down``: from the node's last lease renewal, estimated as the reconcile cycle that
  first saw its liveness key gone minus the lease TTL (the failure came at most one heartbeat
  after that renewal);
- ``exited`` (and ``app-failed`` after an exit): from the exit time the agent reported (its
  wall clock), plus the restart backoff the policy imposes (a deliberate wait, not detection);
- ``node-unhealthy``, ``gpu-fault``, ``gpu-degraded``, ``failing``, ``hung``,
  ``straggler`` (and
  ``app-failed`` after one): from the reconcile cycle that first saw the agent's report: the
  controller's share only (the agent's own detection - health interval, hysteresis, check
  thresholds, ``hang_timeout`` - adds to it);
- not observed for ``planned`` and ``preempted`` (no failure), nor, except exits, for failures
  that happened before this controller's term as leader began.

``hafo_recovery_seconds``: from the leader's decision (the moment its write was acknowledged)
to the first reconcile cycle that sees the replacement instance (a newer epoch) report
``running``. A workload that fails again before it runs keeps its first decision time, so the
value is the whole outage as the controller saw it.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hafo.controller.queue_metrics import PendingSince, QueueCollector
from hafo.decisions.plan import Action, Cause, Plan
from hafo.model.cluster import ClusterSnapshot, Liveness
from hafo.model.service_state import service_state
from hafo.model.views import (
    NODE_STATES,
    WORKLOAD_STATES,
    allocations,
    status_view,
    workload_state,
)
from hafo.store.metrics import EtcdMetrics

log = structlog.get_logger("hafo.controller")

Kind = Literal["failover", "restart"]
FAILOVER_CAUSES = ("node-down", "node-unhealthy", "gpu-fault", "gpu-degraded", "app-failed",
                   "planned", "preempted", "preflight")
RESTART_CAUSES = ("exited", "failing", "hung", "straggler", "infrastructure")
GPU_STATES = ("healthy", "degraded", "unhealthy", "down", "allocated")
#: seconds-scale failover: lease TTL 3 s, heartbeat 1 s, restart backoff up to 30 s
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_PENDING = 10_000  # recoveries tracked at once; the oldest is dropped beyond this

#: The counted decisions: an action's cause -> (failover | restart, the metric's cause label).
#: Other causes (new work, a move's second step, completion, deletion, refusals) count nothing.
COUNTED: Mapping[Cause, tuple[Kind, str]] = {
    Cause.NODE_DOWN: ("failover", "node-down"),
    Cause.NODE_UNHEALTHY: ("failover", "node-unhealthy"),
    Cause.GPU_FAULT: ("failover", "gpu-fault"),
    Cause.GPU_DEGRADED: ("failover", "gpu-degraded"),
    Cause.APP_FAILED: ("failover", "app-failed"),
    Cause.PLANNED: ("failover", "planned"),
    Cause.PREEMPTED: ("failover", "preempted"),
    Cause.PREFLIGHT: ("failover", "preflight"),
    Cause.EXITED: ("restart", "exited"),
    Cause.FAILING: ("restart", "failing"),
    Cause.HUNG: ("restart", "hung"),
    Cause.STRAGGLER: ("restart", "straggler"),
    Cause.INFRASTRUCTURE: ("restart", "infrastructure"),
}


@dataclass(frozen=True)
class Decision:
    """One counted decision: a workload fails over or restarts because of ``cause``.

    ``replaces``: the epoch of the instance it replaces (recovery ends when a newer one runs);
    ``since``: when the failure is known from (see the module docstring), None if unknown."""

    workload: str
    kind: Kind
    cause: str
    replaces: int
    since: float | None


def classify(action: Action) -> tuple[Kind, str] | None:
    """(kind, cause) of an action, from the cause it carries; None for actions that are
    neither a failover nor a restart. A finish (exited 0, or failed on every node) counts
    nothing, whatever led to it."""
    if action.kind not in ("move", "place", "pending"):
        return None
    return COUNTED.get(action.cause)


def decisions(snapshot: ClusterSnapshot, plan: Plan, *,
              down_since: Mapping[str, float], reported_since: float | None,
              lease_ttl: float) -> list[Decision]:
    """The failovers and restarts in ``plan`` (decided on ``snapshot``), each with the time
    its failure is known from: ``down_since`` (node -> the cycle that first saw it down, this
    term), ``reported_since`` (the cycle that saw agent-reported conditions, None when they
    may be older than the term), ``lease_ttl``, and the action's own ``known_since`` (an exit's
    time plus the backoff taken; see the module docstring)."""
    out: list[Decision] = []
    for action in plan.actions:
        found = classify(action)
        if found is None:
            continue
        kind, cause = found
        previous = snapshot.assignments[action.workload]
        assert previous.node is not None
        since: float | None
        if action.cause is Cause.NODE_DOWN:
            seen = down_since.get(previous.node)
            since = None if seen is None else seen - lease_ttl
        elif action.cause in (Cause.PLANNED, Cause.PREEMPTED):
            since = None
        else:
            since = action.known_since if action.known_since is not None else reported_since
        out.append(Decision(action.workload, kind, cause, previous.epoch, since))
    return out


def gpu_counts(snapshot: ClusterSnapshot) -> dict[str, int]:
    """GPUs by state: ``healthy``, ``degraded``, ``unhealthy`` and ``down`` (on a node whose
    agent is down) partition them; ``allocated`` counts those held by a workload."""
    counts: Tally[str] = Tally()
    for name, record in snapshot.nodes.items():
        down = snapshot.node_state(name) == "down"
        held = allocations(snapshot, name)
        for gpu in record.gpus:
            state = ("down" if down else "unhealthy" if not gpu.healthy
                     else "degraded" if gpu.degraded else "healthy")
            counts[state] += 1
            counts["allocated"] += gpu.index in held
    return {state: counts.get(state, 0) for state in GPU_STATES}


class WorkloadState(NamedTuple):
    """A workload's ``hafo_workload_state`` series: its id, name and state."""

    workload: str
    name: str
    state: str


class WorkloadRestarts(NamedTuple):
    """A workload's ``hafo_workload_restarts_total`` series: its id, name and restarts."""

    workload: str
    name: str
    restarts: int


def node_states(snapshot: ClusterSnapshot) -> dict[str, str]:
    """Node -> its state (``ClusterSnapshot.node_state``), by name."""
    return {name: snapshot.node_state(name) for name in sorted(snapshot.nodes)}


def workload_states(snapshot: ClusterSnapshot) -> list[WorkloadState]:
    """Every workload as ``hafo workloads`` lists it (a service, not its replicas), by id,
    with its state as ``status_view`` counts it."""
    return [WorkloadState(wid, sub.spec.name,
                          service_state(snapshot, wid, None).state if sub.spec.is_service
                          else workload_state(snapshot, wid))
            for wid, sub in sorted(snapshot.workloads.items()) if sub.service is None]


def workload_restarts(snapshot: ClusterSnapshot) -> list[WorkloadRestarts]:
    """Every workload with an assignment (a service's replicas each on their own: a retired
    replica's count goes with it, never down), by id, with the assignment's ``restarts``."""
    return [WorkloadRestarts(wid, snapshot.workloads[wid].spec.name, assignment.restarts)
            for wid, assignment in sorted(snapshot.assignments.items())
            if wid in snapshot.workloads]


@dataclass
class _Pending:
    decided_at: float
    cause: str
    replaces: int


class FailsafeView(Protocol):
    """The controller's failsafe side (``hafo.controller.failsafe.ControllerFailsafe``)."""

    def failover_allowed(self) -> bool:
        """False while a promise to an agent (etcd is unavailable to us too) holds."""
        ...


class ControllerSource(Protocol):
    """What the metrics read from a controller at scrape time."""

    def snapshot(self) -> ClusterSnapshot:
        """The cache's current snapshot."""
        ...

    def leading(self) -> bool:
        """True while this controller leads."""
        ...

    @property
    def failsafe(self) -> FailsafeView:
        """The controller's failsafe side."""
        ...


class _StateCollector(Collector):
    """Gauges computed from the snapshot at scrape time (no stale label sets)."""

    def __init__(self, source: ControllerSource) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        leader = GaugeMetricFamily("hafo_leader", "1 if this controller is the leader, else 0")
        leader.add_metric([], 1.0 if self.source.leading() else 0.0)
        yield leader
        snapshot = self.source.snapshot()
        view = status_view(snapshot)
        nodes = GaugeMetricFamily("hafo_nodes", "Nodes by state, as this controller's cache "
                                  "sees them", labels=["state"])
        for state in NODE_STATES:
            nodes.add_metric([state], view["nodes"][state])
        yield nodes
        workloads = GaugeMetricFamily("hafo_workloads", "Workloads by state, as this "
                                      "controller's cache sees them", labels=["state"])
        for state in WORKLOAD_STATES:
            workloads.add_metric([state], view["workloads"][state])
        yield workloads
        gpus = GaugeMetricFamily("hafo_gpus", "GPUs (whole or MIG devices) by state: healthy, "
                                 "degraded, unhealthy and down (on a down node) partition "
                                 "them; allocated counts those held by a workload",
                                 labels=["state"])
        for state, count in gpu_counts(snapshot).items():
            gpus.add_metric([state], count)
        yield gpus
        per_node = GaugeMetricFamily("hafo_node_state", "1 for each node, labelled with its "
                                     "state (one series per node)", labels=["node", "state"])
        for node, state in node_states(snapshot).items():
            per_node.add_metric([node, state], 1.0)
        yield per_node
        per_workload = GaugeMetricFamily(
            "hafo_workload_state", "1 for each workload (not a service's replica), labelled "
            "with its state", labels=["workload", "name", "state"])
        for wid, name, state in workload_states(snapshot):
            per_workload.add_metric([wid, name, state], 1.0)
        restarts = CounterMetricFamily(
            "hafo_workload_restarts", "The workload's counted restarts and failovers (its "
            "assignment's restarts; each replica of a service on its own)",
            labels=["workload", "name"])
        for wid, name, count in workload_restarts(snapshot):
            restarts.add_metric([wid, name], count)
        yield from (per_workload, restarts)
        failsafe = GaugeMetricFamily(
            "hafo_failsafe_active", "1 while this controller holds failovers back because it "
            "told an agent that etcd is unavailable to it too (failsafe mode), else 0")
        failsafe.add_metric([], 0.0 if self.source.failsafe.failover_allowed() else 1.0)
        yield failsafe


class ControllerMetrics:
    """The controller's metrics on ``registry``; the leader's reconcile loop feeds ``cycle``
    (and ``new_term`` when its term begins), the store feeds ``observe_etcd``."""

    def __init__(self, source: ControllerSource, registry: CollectorRegistry, *,
                 lease_ttl: float, clock: Callable[[], float],
                 api_auth_mismatch: Callable[[], bool] = lambda: False) -> None:
        """``api_auth_mismatch``: whether this controller's API auth differs from the
        cluster's (``hafo.store.api_auth.ApiAuthAgreement.mismatch``), read at scrape time."""
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.pending: dict[str, _Pending] = {}
        self.down_since: dict[str, float] = {}
        self._alive: Mapping[str, Liveness] | None = None
        registry.register(_StateCollector(source))
        self.failovers = Counter(
            "hafo_failovers", "Workloads moved off their node, counted by the leader once per "
            "applied decision, by cause: " + ", ".join(FAILOVER_CAUSES),
            ["cause"], registry=registry)
        self.restarts = Counter(
            "hafo_restarts", "Workloads restarted in place, counted by the leader once per "
            "applied decision, by cause: exited (non-zero exit), failing (a check past its "
            "threshold or an application Xid), hung (no progress for hang_timeout), "
            "straggler (a gang member slower than straggler_lag), "
            "infrastructure (fenced, guard lost or node claimed anew; counted toward no "
            "restart limit)", ["cause"], registry=registry)
        for cause in FAILOVER_CAUSES:
            self.failovers.labels(cause)
        for cause in RESTART_CAUSES:
            self.restarts.labels(cause)
        self.detection = Histogram(
            "hafo_detection_seconds", "Seconds from a failure to the leader's decision, by "
            "cause. node-down: from the node's last lease renewal (the cycle that saw its "
            "liveness key expire minus the lease TTL); exited: from the exit time the agent "
            "reported, plus any restart backoff; node-unhealthy, gpu-fault, gpu-degraded, "
            "failing, hung, straggler: from the cycle that first saw the agent's report (the "
            "agent's own detection time is not included). Not observed for planned moves, "
            "preemptions, or (except exits) failures older than this leader's term",
            ["cause"], buckets=LATENCY_BUCKETS, registry=registry)
        self.recovery = Histogram(
            "hafo_recovery_seconds", "Seconds from a failover or restart decision (its write "
            "acknowledged) to the first reconcile cycle that sees the replacement instance "
            "running, by cause; a workload that fails again before it runs keeps its first "
            "decision time", ["cause"], buckets=LATENCY_BUCKETS, registry=registry)
        self.cycle_seconds = Histogram(
            "hafo_controller_reconcile_duration_seconds", "Seconds one reconcile cycle of the "
            "leader took: snapshot, decisions and applying the plan",
            buckets=CYCLE_BUCKETS, registry=registry)
        Gauge("hafo_api_auth_mismatch", "1 while this controller refuses writes because its "
              "API auth (token, TLS) differs from the cluster's record, else 0",
              registry=registry).set_function(lambda: 1.0 if api_auth_mismatch() else 0.0)
        self.etcd = EtcdMetrics(registry)
        self.observe_etcd = self.etcd.observe  # the store's observer
        # -- per-queue metrics (hafo.controller.queue_metrics): at scrape time; the waits of
        # pending work from this controller's first sightings, on its clock (each leader
        # cycle sights them too)
        self.pending_since = PendingSince()
        registry.register(QueueCollector(source, clock, self.pending_since))

    def new_term(self) -> None:
        """Leadership (re)gained: what the last term tracked is not this term's to measure."""
        self.pending.clear()
        self.down_since.clear()
        self._alive = None

    def cycle(self, snapshot: ClusterSnapshot, now: float, applied: Plan | None,
              seconds: float) -> None:
        """One leader reconcile cycle: decided on ``snapshot`` at ``now``; ``applied``: the
        plan if it was written, else None; ``seconds``: how long the cycle took. Never
        raises (a metrics bug must not stop the leader)."""
        try:
            self.cycle_seconds.observe(seconds)
            first = self._alive is None
            self._track_down(snapshot, now)
            self._finish_recoveries(snapshot, now)
            self.pending_since.observe(snapshot, now)  # per-queue metrics
            if applied:
                self._count(snapshot, applied, now, reported_since=None if first else now)
        except Exception:  # pragma: no cover - defensive
            log.exception("controller metrics update failed")

    def _track_down(self, snapshot: ClusterSnapshot, now: float) -> None:
        alive = snapshot.alive
        if self._alive is not None:
            for node in self._alive.keys() - alive.keys():
                self.down_since.setdefault(node, now)
        for node in [n for n in self.down_since if n in alive or n not in snapshot.nodes]:
            del self.down_since[node]
        self._alive = alive

    def _finish_recoveries(self, snapshot: ClusterSnapshot, now: float) -> None:
        for wid, pending in list(self.pending.items()):
            assignment = snapshot.assignments.get(wid)
            if wid not in snapshot.workloads or assignment is None \
                    or assignment.phase in ("completed", "failed"):
                del self.pending[wid]
                continue
            status = snapshot.current_status(wid)
            if status is not None and status.state == "running" \
                    and status.epoch > pending.replaces:
                self.recovery.labels(pending.cause).observe(max(0.0, now - pending.decided_at))
                del self.pending[wid]

    def _count(self, snapshot: ClusterSnapshot, plan: Plan, now: float,
               reported_since: float | None) -> None:
        found = decisions(snapshot, plan, down_since=self.down_since,
                          reported_since=reported_since, lease_ttl=self.lease_ttl)
        if not found:
            return
        decided_at = self.clock()
        for decision in found:
            counter = self.failovers if decision.kind == "failover" else self.restarts
            counter.labels(decision.cause).inc()
            if decision.since is not None:
                self.detection.labels(decision.cause).observe(
                    max(0.0, decided_at - decision.since))
            if decision.workload not in self.pending:
                while len(self.pending) >= MAX_PENDING:
                    del self.pending[next(iter(self.pending))]
                self.pending[decision.workload] = _Pending(decided_at, decision.cause,
                                                           decision.replaces)

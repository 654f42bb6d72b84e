"""The leader's cluster conditions: faults shared by most nodes (``hafo.decisions.shared_faults``).

Each reconcile cycle ``decide`` classifies the nodes' resource faults, returns the snapshot the
decisions see (a node with a fault of its own unhealthy, the nodes of a cluster condition
not); ``say`` then records a ``cluster-condition`` event when a condition is set or cleared. The
``hafo_cluster_condition`` gauge shows the conditions in force (from the leader's last cycle;
a standby shows none). Reads (``hafo nodes``, the metrics) see the same node states through
``view``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hafo.decisions.shared_faults import (
    Change,
    SharedOutcome,
    SharedState,
    assess_shared,
    with_node_faults,
)
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.store import TRANSIENT, EventLog, StoreError

log = structlog.get_logger("hafo.controller")
_UNWRITTEN: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError)


class ClusterConditions:
    """The leader's memory of resource faults between cycles (see the module docstring)."""

    def __init__(self, events: EventLog, leading: Callable[[], bool],
                 registry: CollectorRegistry | None = None) -> None:
        self.events = events
        self.leading = leading
        self.state = SharedState()
        self.outcome: SharedOutcome | None = None
        self.unsaid: list[Change] = []  # changes whose event is not written yet
        if registry is not None:
            registry.register(_ConditionCollector(self))

    def new_term(self) -> None:
        """Leadership (re)gained: start afresh (a fault waits its settle time again)."""
        self.state, self.outcome, self.unsaid = SharedState(), None, []

    def decide(self, snapshot: ClusterSnapshot, now: float) -> ClusterSnapshot:
        """Classify this cycle's resource faults; the snapshot for the decisions."""
        outcome = assess_shared(self.state, snapshot, now)
        self.state, self.outcome = outcome.state, outcome
        for change in outcome.changes:
            fields = {"kind": change.condition.kind, "resource": change.condition.resource,
                      "nodes": len(change.condition.nodes), "message": change.message}
            if change.set:
                log.warning("cluster condition set", **fields)
            else:
                log.warning("cluster condition cleared", **fields)
        self.unsaid.extend(outcome.changes)
        return with_node_faults(snapshot, outcome.node_faults)

    async def say(self) -> None:
        """Write the events of the changes decided (those etcd does not take now are kept
        for the next cycle). Called after the plan: an event never delays a decision."""
        while self.unsaid:
            change = self.unsaid[0]
            try:
                await self.events.append(Event(ts=time.time(), kind="cluster-condition",
                                               message=change.message))
            except _UNWRITTEN as exc:
                log.warning("cluster-condition event not written yet", error=repr(exc))
                break
            self.unsaid.pop(0)

    def current(self) -> SharedOutcome | None:
        """The last cycle's outcome while this controller leads, else None."""
        return self.outcome if self.leading() else None

    def view(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """``snapshot`` with the last cycle's node faults applied (for reads)."""
        outcome = self.current()
        return snapshot if outcome is None else with_node_faults(snapshot,
                                                                 outcome.node_faults)


class _ConditionCollector(Collector):
    def __init__(self, conditions: ClusterConditions) -> None:
        self.conditions = conditions

    def collect(self) -> list[Metric]:
        gauge = GaugeMetricFamily(
            "hafo_cluster_condition", "1 for each cluster condition in force: a fault of a "
            "resource (kind, resource) reported by most live nodes at once, e.g. a shared "
            "checkpoint filesystem full; no node is marked unhealthy for it (set by the "
            "leader; a standby exports none)", labels=["kind", "resource"])
        nodes = GaugeMetricFamily(
            "hafo_cluster_condition_nodes", "How many nodes report each cluster condition",
            labels=["kind", "resource"])
        outcome = self.conditions.current()
        for condition in outcome.conditions if outcome is not None else ():
            gauge.add_metric([condition.kind, condition.resource], 1.0)
            nodes.add_metric([condition.kind, condition.resource], len(condition.nodes))
        return [gauge, nodes]

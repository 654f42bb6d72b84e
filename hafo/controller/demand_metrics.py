"""The demand's metrics (``hafo_pending_demand``, ``hafo_removable_nodes``), computed at
scrape time from the demand the controller knows (``hafo.decisions.demand``; the leader's
of its last cycle, a standby's from its cache with no idle sightings: none removable), so
no label set of a shape that is gone stays behind."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hafo.decisions.demand import Demand

__all__ = ["DemandCollector", "register_demand_metrics"]


class DemandCollector(Collector):
    """``hafo_pending_demand{queue,gpu_model,nodes,gpus_per_node}`` (workloads of that shape
    waiting for room; ``gpu_model`` "" for any, a MIG profile appended as ``model/profile``)
    and ``hafo_removable_nodes``."""

    def __init__(self, demand: Callable[[], Demand]) -> None:
        self.demand = demand

    def collect(self) -> Iterable[Metric]:
        demand = self.demand()
        pending = GaugeMetricFamily(
            "hafo_pending_demand", "Pending workloads that more nodes would let run, by "
            "shape: queue, GPU model glob (\"\": any; a MIG profile as model/profile), nodes "
            "and GPUs per node (a gang of 4 x 8 is nodes=4, gpus_per_node=8)",
            labels=["queue", "gpu_model", "nodes", "gpus_per_node"])
        counts: dict[tuple[str, str, str, str], int] = {}
        for shape in demand.pending:
            model = shape.gpu_model or ""
            if shape.gpu_profile is not None:
                model = f"{model}/{shape.gpu_profile}"
            key = (shape.queue, model, str(shape.nodes), str(shape.gpus_per_node))
            counts[key] = counts.get(key, 0) + shape.count
        for labels, count in sorted(counts.items()):
            pending.add_metric(list(labels), float(count))
        yield pending
        removable = GaugeMetricFamily(
            "hafo_removable_nodes", "Ready nodes with no work for longer than "
            "autoscale.idle_after (spares kept), as the leader observed them")
        removable.add_metric([], float(len(demand.removable)))
        yield removable


def register_demand_metrics(registry: CollectorRegistry, demand: Callable[[], Demand]) -> None:
    """Serve the demand's metrics on ``registry`` (``demand``: read at each scrape; it must
    not raise)."""
    registry.register(DemandCollector(demand))

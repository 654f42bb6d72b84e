"""The agent's Prometheus metrics (served at ``/metrics``, on the agent's registry).

Per GPU, named as NVIDIA's dcgm-exporter names the same readings (labels ``gpu``, ``UUID``,
``modelName``, ``Hostname``): ``DCGM_FI_DEV_GPU_TEMP``, ``DCGM_FI_DEV_POWER_USAGE``,
``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED``, ``DCGM_FI_DEV_FB_FREE``,
``DCGM_FI_DEV_XID_ERRORS`` (physical GPUs, from the backend's telemetry, sampled in a thread
every health cycle and never written to etcd), ``hafo_gpu_xid_errors_total``, and
``hafo_gpu_healthy`` / ``hafo_gpu_degraded`` / ``hafo_gpu_allocated`` (each schedulable GPU:
whole, or MIG device, as in the node record). Per node: ``hafo_agent_node_healthy``,
``hafo_agent_lease_valid``, ``hafo_agent_fencing_deadline_seconds``,
``hafo_agent_instances{state}``, ``hafo_agent_loop_lag_seconds``, and the etcd request
metrics. Per workload with an instance here: ``hafo_workload_checkpoint_age_seconds`` (from
the ``created`` time in its newest checkpoint's manifest, read once per checkpoint).
Everything but the etcd metrics is read from the agent's state at scrape time, so a GPU or
instance that is gone leaves no stale series.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, get_args

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hafo.gpu import GpuSample
from hafo.model.cluster import Assignment, Gpu, InstanceState, InstanceStatus
from hafo.store.metrics import EtcdMetrics

log = structlog.get_logger("hafo.agent")

GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]
INSTANCE_STATES: tuple[str, ...] = get_args(InstanceState)
SAMPLE_TIMEOUT = 10.0  # a telemetry read stuck longer (a hung driver) is given up this cycle

#: (name, help, GpuSample field): dcgm-exporter's names, units and help texts
TELEMETRY = (
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_pct"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mib"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "memory_free_mib"),
)


class LeaseView(Protocol):
    """The agent's lease keeper, as the metrics read it."""

    @property
    def deadline(self) -> float:
        """The fencing deadline (on ``clock``)."""
        ...

    def valid(self) -> bool:
        """True while the deadline has not passed."""
        ...

    def clock(self) -> float:
        """The keeper's monotonic clock."""
        ...


class PlacedView(Protocol):
    """The agent's assignments, as the metrics read them."""

    @property
    def placed(self) -> Mapping[str, Assignment]:
        """Workload -> its assignment to this node."""
        ...


class AgentSource(Protocol):
    """What the metrics read from an agent at scrape time."""

    @property
    def name(self) -> str:
        """The node's name."""
        ...

    @property
    def inventory(self) -> Sequence[Gpu]:
        """The GPUs with their health, as last reported."""
        ...

    @property
    def healthy(self) -> bool:
        """The node's health, as last reported."""
        ...

    @property
    def reported(self) -> Mapping[str, InstanceStatus]:
        """Workload -> the status last reported for its newest instance here."""
        ...

    @property
    def keeper(self) -> LeaseView:
        """The lease keeper."""
        ...

    @property
    def assignments(self) -> PlacedView:
        """The assignments to this node."""
        ...

    def memory_held(self) -> Mapping[str, int]:
        """Workload -> bytes of its RAM-tier snapshots on this node."""
        ...


def _gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


class _AgentCollector(Collector):
    """Everything read from the agent at scrape time."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self.metrics
        agent = metrics.agent
        host = agent.name
        yield from _telemetry(metrics.samples, host)
        allocated = {i for a in agent.assignments.placed.values() for i in a.gpus}
        healthy = _gauge("hafo_gpu_healthy", "1 if the GPU (whole, or MIG device) is healthy, "
                         "else 0", GPU_LABELS)
        degraded = _gauge("hafo_gpu_degraded", "1 if the GPU is degrading (still usable, no new "
                          "work placed), else 0", GPU_LABELS)
        held = _gauge("hafo_gpu_allocated", "1 if a workload assigned to this node holds the "
                      "GPU, else 0", GPU_LABELS)
        for gpu in agent.inventory:
            labels = [str(gpu.index), gpu.uuid, gpu.model, host]
            healthy.add_metric(labels, 1.0 if gpu.healthy else 0.0)
            degraded.add_metric(labels, 1.0 if gpu.degraded else 0.0)
            held.add_metric(labels, 1.0 if gpu.index in allocated else 0.0)
        yield from (healthy, degraded, held)
        node = _gauge("hafo_agent_node_healthy", "1 if the agent reports its node healthy, "
                      "else 0")
        node.add_metric([], 1.0 if agent.healthy else 0.0)
        keeper = agent.keeper
        lease = _gauge("hafo_agent_lease_valid", "1 while the agent's etcd lease is valid "
                       "(its fencing deadline has not passed), else 0")
        lease.add_metric([], 1.0 if keeper.valid() else 0.0)
        fence = _gauge("hafo_agent_fencing_deadline_seconds", "Seconds until the fencing "
                       "deadline (negative once passed: the node's work is fenced)")
        fence.add_metric([], keeper.deadline - keeper.clock())
        states = {state: 0 for state in INSTANCE_STATES}
        for status in agent.reported.values():
            states[status.state] = states.get(status.state, 0) + 1
        instances = _gauge("hafo_agent_instances", "Workload instances on this node by the "
                           "state last reported", ["state"])
        for state, count in states.items():
            instances.add_metric([state], count)
        lag = _gauge("hafo_agent_loop_lag_seconds", "The agent's event loop lag: the largest "
                     "delay of a periodic wake-up over the last 10 s")
        lag.add_metric([], metrics.loop_lag)
        yield from (node, lease, fence, instances, lag)
        yield _checkpoint_ages(metrics, host)
        memory = _gauge("hafo_node_memory_snapshot_bytes", "Bytes of RAM held on this node "
                        "by each workload's in-memory checkpoints (its own and its peers' "
                        "snapshots, node.memory_dir)", ["workload", "node"])
        for workload, size in sorted(agent.memory_held().items()):
            memory.add_metric([workload, host], float(size))
        yield memory


def checkpoint_created(path: str) -> float | None:
    """The ``created`` time (wall clock) in a committed checkpoint's manifest; None when it
    cannot be read."""
    try:
        data = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    created = data.get("created") if isinstance(data, dict) else None
    return float(created) if isinstance(created, int | float) else None


def _checkpoint_ages(metrics: AgentMetrics, host: str) -> Metric:
    """Seconds since each workload's newest checkpoint was written, for the workloads with an
    instance here that has not exited; a manifest is read once (the cache keeps only the
    checkpoints reported now)."""
    family = _gauge("hafo_workload_checkpoint_age_seconds", "Seconds since the newest "
                    "committed checkpoint of the workload was written (its manifest's time)",
                    ["workload", "node"])
    now = metrics.wall_clock()
    seen: dict[str, float] = {}
    for workload, status in sorted(dict(metrics.agent.reported).items()):
        checkpoint = status.checkpoint
        if checkpoint is None or status.state == "exited":
            continue
        created = metrics.checkpoint_times.get(checkpoint.path)
        if created is None:
            created = checkpoint_created(checkpoint.path)
        if created is None:
            continue
        seen[checkpoint.path] = created
        family.add_metric([workload, host], max(0.0, now - created))
    metrics.checkpoint_times = seen
    return family


def _telemetry(samples: Sequence[GpuSample], host: str) -> Iterable[Metric]:
    """The dcgm-exporter-named gauges, and the Xid counter, of the last samples."""
    def labels(sample: GpuSample) -> list[str]:
        return [str(sample.index), sample.uuid, sample.model, host]

    for name, documentation, field in TELEMETRY:
        family = _gauge(name, documentation, GPU_LABELS)
        for sample in samples:
            value = getattr(sample, field)
            if value is not None:
                family.add_metric(labels(sample), float(value))
        yield family
    last = _gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
                  GPU_LABELS)
    count = CounterMetricFamily("hafo_gpu_xid_errors", "Xid errors of the GPU seen by the "
                                "agent since it started (a burst of one Xid counts once)",
                                labels=GPU_LABELS)
    for sample in samples:
        last.add_metric(labels(sample), float(sample.last_xid or 0))
        count.add_metric(labels(sample), float(sample.xid_count))
    yield from (last, count)


class AgentMetrics:
    """The agent's metrics on ``registry``: the health loop feeds ``sample_gpus``, the loop-lag
    monitor ``loop_lag``, the store ``observe_etcd``; the rest is read from ``agent``."""

    def __init__(self, agent: AgentSource, registry: CollectorRegistry,
                 sample_timeout: float = SAMPLE_TIMEOUT,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.sample_timeout = sample_timeout
        self.wall_clock = wall_clock
        self.checkpoint_times: dict[str, float] = {}  # checkpoint path -> created
        self.samples: list[GpuSample] = []
        self.loop_lag = 0.0
        self._pending: asyncio.Future[list[GpuSample]] | None = None
        self._warned = False
        registry.register(_AgentCollector(self))
        self.etcd = EtcdMetrics(registry)
        self.observe_etcd = self.etcd.observe  # the store's observer

    async def sample_gpus(self, telemetry: Callable[[], list[GpuSample]]) -> None:
        """Read the GPUs' telemetry in a thread (at most one read at a time, waited for at most
        ``sample_timeout``). A read that fails or hangs leaves no samples (no stale values)."""
        if self._pending is None or self._pending.done():
            if self._pending is not None and not self._pending.cancelled():
                self._pending.exception()  # a hung read that failed later: seen, not raised
            self._pending = asyncio.ensure_future(asyncio.to_thread(telemetry))
        try:
            self.samples = list(await asyncio.wait_for(asyncio.shield(self._pending),
                                                       self.sample_timeout))
            self._warned = False
        except Exception as exc:  # a hung or broken read must not stop the health loop
            self.samples = []
            if not self._warned:
                self._warned = True
                log.warning("GPU telemetry unreadable", node=self.agent.name,
                            error=str(exc) or type(exc).__name__)

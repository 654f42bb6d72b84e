"""The controller's per-queue Prometheus metrics (issue 30: team queues with GPU quotas),
computed from the cache's snapshot at scrape time, like the other gauges of
``hafo.controller.metrics``: one label set per declared queue, none while no queue is
declared (the families are still exported, without samples).

- ``hafo_queue_gpus{queue, kind}``: the queue's GPUs as ``hafo queues`` counts them
  (``hafo.decisions.queue_standings.standings``): ``nominal`` (its quota; no series for a queue
  without one), ``used`` (by its workloads holding GPUs), ``borrowed`` (above its quota),
  ``lent`` (of its idle quota, what its cohort's borrowers use) and ``pending`` (asked for by
  its waiting workloads); a MIG device counts by its fraction of a GPU, a gang every member.
- ``hafo_queue_share{queue}``: its weighted share of borrowed capacity (0 while it borrows
  nothing; as ``GET /v1/queues`` shows it).
- ``hafo_queue_workloads{queue, state}``: its workloads by state, as ``hafo_workloads``
  counts them (a service once, not its replicas), every state present.
- ``hafo_queue_pending_seconds{queue}``: how long its oldest pending workload has waited (a
  service's replicas each on their own), 0 while none waits.

**One clock** (docs/safety.md, "One clock per decision"): the wait is timed on this
controller's clock from when this controller first saw the workload pending (a reconcile
cycle while it leads, or a scrape), never from a submit time another machine wrote.
``PendingSince`` keeps those first sightings in memory, by workload and its submission (a
workload deleted and submitted again under the same id is seen anew), and forgets a
workload as soon as it is seen not pending. So a controller that (re)starts counts from its
first sighting: a wait it did not see is not counted (at most one scrape interval is missed
otherwise); every controller exports the series from its own cache and clock, so aggregate
with ``max by (queue)``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hafo.decisions.queue_standings import standings
from hafo.decisions.quota import QueueStanding
from hafo.model.cluster import ClusterSnapshot
from hafo.model.service_state import service_state
from hafo.model.views import WORKLOAD_STATES, workload_state

__all__ = ["GPU_KINDS", "PendingSince", "QueueCollector", "QueueSource", "gpu_kinds",
           "pending_workloads", "queue_workload_states", "share"]

log = structlog.get_logger("hafo.controller")

#: The ``kind`` label of ``hafo_queue_gpus``.
GPU_KINDS = ("nominal", "used", "borrowed", "lent", "pending")

#: A pending workload as ``PendingSince`` tells it apart: (id, its submission's time, used
#: as an identity only, never compared with this controller's clock).
PendingKey = tuple[str, float]


def gpu_kinds(standing: QueueStanding) -> dict[str, float]:
    """``hafo_queue_gpus`` of one queue: kind -> GPUs (no ``nominal`` without a quota)."""
    out = {} if standing.spec.gpus is None else {"nominal": float(standing.spec.gpus)}
    out.update(used=standing.used, borrowed=standing.borrowed, lent=standing.lent,
               pending=standing.pending)
    return out


def share(standing: QueueStanding) -> float:
    """``hafo_queue_share`` of one queue: its weighted share, 0 where its cohort lends
    nothing (as the queues' JSON view shows it: ``hafo.decisions.queue_standings.usage_views``)."""
    return 0.0 if standing.share == float("inf") else standing.share


def pending_workloads(snapshot: ClusterSnapshot) -> dict[str, list[PendingKey]]:
    """queue name -> its pending workloads (an assignment in phase ``pending``, or none yet;
    a service's replicas each on their own, not the service), for every queue named by one
    (declared or not), as ``hafo.decisions.queue_standings.standings`` counts the pending charge."""
    out: dict[str, list[PendingKey]] = {}
    for wid, submission in snapshot.workloads.items():
        assignment = snapshot.assignments.get(wid)
        if assignment is None:
            if submission.spec.is_service:
                continue
        elif assignment.phase != "pending":
            continue
        out.setdefault(submission.spec.queue, []).append((wid, submission.submitted_at))
    return out


def queue_workload_states(snapshot: ClusterSnapshot) -> dict[str, dict[str, int]]:
    """Every declared queue -> its workloads (not a service's replicas) by state, every
    state of ``WORKLOAD_STATES`` present (as ``hafo_workloads`` counts them)."""
    out = {name: dict.fromkeys(WORKLOAD_STATES, 0) for name in sorted(snapshot.queues)}
    for wid, submission in snapshot.workloads.items():
        counts = out.get(submission.spec.queue)
        if submission.service is not None or counts is None:
            continue
        state = service_state(snapshot, wid, None).state if submission.spec.is_service \
            else workload_state(snapshot, wid)
        counts[state] = counts.get(state, 0) + 1
    return out


class PendingSince:
    """When this controller first saw each pending workload, on its own clock (see the
    module docstring). Safe to call from the scrape's thread and the reconcile loop at
    once."""

    def __init__(self) -> None:
        self._first: dict[PendingKey, float] = {}
        self._lock = threading.Lock()

    def observe(self, snapshot: ClusterSnapshot, now: float) -> dict[str, float]:
        """Record this snapshot's pending workloads seen at ``now`` (keeping earlier
        sightings, forgetting those no longer pending); queue -> seconds its oldest pending
        workload has waited, for every queue with one."""
        pending = pending_workloads(snapshot)
        waited: dict[str, float] = {}
        with self._lock:
            first: dict[PendingKey, float] = {}
            for queue, keys in pending.items():
                for key in keys:
                    seen = first[key] = self._first.get(key, now)
                    waited[queue] = max(waited.get(queue, 0.0), max(0.0, now - seen))
            self._first = first
        return waited

    def __len__(self) -> int:
        """How many pending workloads are tracked."""
        return len(self._first)


class QueueSource(Protocol):
    """What the queue metrics read at scrape time: the cache's snapshot."""

    def snapshot(self) -> ClusterSnapshot:
        """The cache's current snapshot."""
        ...


class QueueCollector(Collector):
    """The ``hafo_queue_*`` families, from the snapshot at scrape time; ``clock``: this
    controller's clock (the one its decisions use); ``since``: the first sightings of
    pending workloads (shared with the leader's reconcile loop, which observes each cycle's
    snapshot too)."""

    def __init__(self, source: QueueSource, clock: Callable[[], float],
                 since: PendingSince) -> None:
        self.source = source
        self.clock = clock
        self.since = since

    def collect(self) -> Iterable[Metric]:
        """The four families (without samples while no queue is declared, or, logged, when
        computing them fails: a bug here must not take the other metrics' scrape down)."""
        snapshot = self.source.snapshot()
        try:
            waited = self.since.observe(snapshot, self.clock())
            table: Mapping[str, QueueStanding] = standings(snapshot)
            states = queue_workload_states(snapshot)
        except Exception:
            log.exception("queue metrics failed")
            waited, table, states = {}, {}, {}
        gpus = GaugeMetricFamily(
            "hafo_queue_gpus", "GPUs of each declared queue, by kind: nominal (its quota; "
            "none without one), used (by its workloads holding GPUs), borrowed (above its "
            "quota), lent (of its idle quota, what its cohort's borrowers use), pending "
            "(asked for by its waiting workloads)", labels=["queue", "kind"])
        shares = GaugeMetricFamily(
            "hafo_queue_share", "Each declared queue's weighted share of borrowed capacity "
            "(what it uses above its quota over its cohort's pool, over its weight; 0 while "
            "it borrows nothing)", labels=["queue"])
        for name, standing in table.items():
            for kind, value in gpu_kinds(standing).items():
                gpus.add_metric([name, kind], value)
            shares.add_metric([name], share(standing))
        workloads = GaugeMetricFamily(
            "hafo_queue_workloads", "Workloads of each declared queue (not a service's "
            "replicas) by state", labels=["queue", "state"])
        for name, counts in states.items():
            for state, count in counts.items():
                workloads.add_metric([name, state], count)
        oldest = GaugeMetricFamily(
            "hafo_queue_pending_seconds", "Seconds the oldest pending workload of each "
            "declared queue has waited, from when this controller first saw it pending, on "
            "its own clock (0 while none waits)", labels=["queue"])
        for name in table:
            oldest.add_metric([name], waited.get(name, 0.0))
        yield from (gpus, shares, workloads, oldest)

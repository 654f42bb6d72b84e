"""Shared checks for cluster tests."""

from __future__ import annotations

import itertools
from typing import Any

from hafo.local.cluster import LocalCluster
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view


def view(snapshot: ClusterSnapshot, wid: str) -> dict[str, Any]:
    """The workload's contract view."""
    return workload_view(snapshot, wid)


def running(wid: str, not_on: str | None = None) -> Any:
    """Predicate: the workload runs (on another node than ``not_on``)."""
    def check(snapshot: ClusterSnapshot) -> bool:
        v = workload_view(snapshot, wid)
        return bool(v["state"] == "running" and v["node"] is not None and v["node"] != not_on)
    return check


def lifetimes(cluster: LocalCluster, wid: str) -> dict[int, tuple[float, float]]:
    """First and last logged time of each epoch of the workload."""
    spans: dict[int, tuple[float, float]] = {}
    for line in cluster.progress_log(wid):
        first, last = spans.get(line["epoch"], (line["t"], line["t"]))
        spans[line["epoch"]] = (min(first, line["t"]), max(last, line["t"]))
    return spans


def assert_never_two_copies(cluster: LocalCluster, wid: str) -> None:
    """Logged lifetimes of the workload's epochs never overlap."""
    ordered = sorted(lifetimes(cluster, wid).items(), key=lambda item: item[1][0])
    for (epoch_a, (_, end_a)), (epoch_b, (start_b, _)) in itertools.pairwise(ordered):
        assert start_b > end_a, f"epochs {epoch_a} and {epoch_b} were alive at the same time"

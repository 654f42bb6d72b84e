"""``GET /metrics`` of live controllers and agents (real etcd and processes): leadership,
counts by state, GPU telemetry, and the failover counters and latency histograms after a GPU
fault and a power loss."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hafo.local.cluster import LocalCluster
from hafo.model.views import workload_view

from .conftest import ClusterFactory
from .helpers import running, start_with_workload, view

pytestmark = pytest.mark.timeout(120)

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    """Sample name -> [(labels, value)] of a daemon's ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def one(samples: Samples, name: str, **labels: str) -> float:
    """The value of the sample with these labels (0 when absent, as Prometheus would sum)."""
    return sum(v for found, v in samples.get(name, []) if labels.items() <= found.items())


async def until(port: int, check: Callable[[Samples], bool], what: str,
                timeout: float = 15.0) -> Samples:
    """Scrape until ``check`` holds (a cache or a health cycle follows a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, f"metrics never showed {what}"
        await asyncio.sleep(0.1)


def agent_port(cluster: LocalCluster, node: str) -> int:
    return cluster.node_handles[node].api_port


async def test_metrics_of_controllers_and_agents_through_failovers(
        local_cluster: ClusterFactory) -> None:
    started = time.monotonic()
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=3, controllers=2)
    leader = snapshot.leader
    assert leader is not None
    standby = next(n for n in cluster.controller_handles if n != leader)
    lead_port = cluster.controller_handles[leader].api_port
    standby_port = cluster.controller_handles[standby].api_port
    first_node = view(snapshot, wid)["node"]

    # leadership, and the same counts on both controllers (each from its own cache)
    for port, leading in ((lead_port, 1.0), (standby_port, 0.0)):
        found = await until(port, lambda s: one(s, "hafo_workloads", state="running") == 1,
                            "the running workload")
        assert one(found, "hafo_leader") == leading
        assert {lab["state"]: v for lab, v in found["hafo_nodes"]} == {
            "ready": 3, "cordoned": 0, "unhealthy": 0, "down": 0}
        assert {lab["state"] for lab, _ in found["hafo_workloads"]} == {
            "pending", "starting", "running", "stopping", "completed", "failed", "degraded",
            "updating"}
        assert one(found, "hafo_gpus", state="healthy") == 12
        assert one(found, "hafo_gpus", state="allocated") == 1
        assert one(found, "hafo_etcd_request_duration_seconds_count") > 0
    assert one(scrape(lead_port), "hafo_controller_reconcile_duration_seconds_count") > 0

    # the agent: a telemetry series per simulated GPU, allocation, instances, lease, etcd
    port = agent_port(cluster, first_node)
    found = await until(port, lambda s: len(s.get("DCGM_FI_DEV_GPU_TEMP", [])) == 4,
                        "4 GPU temperatures")
    assert sorted(lab["gpu"] for lab, _ in found["DCGM_FI_DEV_GPU_TEMP"]) == ["0", "1", "2", "3"]
    assert {lab["Hostname"] for lab, _ in found["DCGM_FI_DEV_GPU_TEMP"]} == {first_node}
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                 "DCGM_FI_DEV_FB_FREE", "hafo_gpu_healthy"):
        assert len(found[name]) == 4, name
    assert one(found, "hafo_gpu_allocated") == 1
    assert one(found, "hafo_agent_instances", state="running") == 1
    assert one(found, "hafo_agent_lease_valid") == 1
    assert one(found, "hafo_etcd_request_duration_seconds_count") > 0

    # a GPU fault under the workload (Xid 48): a failover with cause gpu-fault, and a
    # temperature reading from the faults file on another GPU of that node
    gpu = snapshot.assignments[wid].gpus[0]
    cluster.inject_fault(first_node, gpu, xid=48)
    cluster.inject_fault(first_node, (gpu + 1) % 4, temperature=91)
    snapshot = await cluster.wait_for(running(wid, not_on=first_node), 30,
                                      what="moved off the faulty GPU")
    second_node = workload_view(snapshot, wid)["node"]
    found = await until(lead_port, lambda s: one(
        s, "hafo_recovery_seconds_count", cause="gpu-fault") == 1, "the gpu-fault recovery")
    assert one(found, "hafo_failovers_total", cause="gpu-fault") == 1
    assert one(found, "hafo_failovers_total") == 1
    assert one(found, "hafo_detection_seconds_count", cause="gpu-fault") == 1
    found = await until(port, lambda s: one(s, "DCGM_FI_DEV_GPU_TEMP",
                                            gpu=str((gpu + 1) % 4)) == 91, "91 C")
    assert one(found, "DCGM_FI_DEV_XID_ERRORS", gpu=str(gpu)) == 48
    assert one(found, "hafo_gpu_xid_errors_total", gpu=str(gpu)) == 1
    assert one(found, "hafo_gpu_healthy", gpu=str(gpu)) == 0

    # a power loss of the node it moved to: cause node-down, detected about a lease TTL after
    # the last renewal
    cluster.power_off(second_node)
    await cluster.wait_for(running(wid, not_on=second_node), 15, what="failover")
    found = await until(lead_port, lambda s: one(
        s, "hafo_recovery_seconds_count", cause="node-down") == 1, "the node-down recovery")
    assert one(found, "hafo_failovers_total", cause="node-down") == 1
    assert one(found, "hafo_detection_seconds_count", cause="node-down") == 1
    detection = one(found, "hafo_detection_seconds_sum", cause="node-down")
    assert cluster.lease_ttl - 0.5 < detection < cluster.lease_ttl + 3, detection
    recovery = one(found, "hafo_recovery_seconds_sum", cause="node-down")
    assert 0 < recovery < 10, recovery
    assert one(found, "hafo_nodes", state="down") == 1
    standby_found = await until(standby_port, lambda s: one(s, "hafo_nodes", state="down") == 1,
                                "the down node on the standby")
    assert one(standby_found, "hafo_failovers_total") == 0  # only the leader counts
    assert time.monotonic() - started < 90

"""The agent's metrics: scrape-time families from a fake agent, telemetry sampling contained,
etcd request metrics, and a real ``Agent``'s registry (no etcd needed to build one)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hafo.agent.daemon import Agent
from hafo.agent.metrics import AgentMetrics, checkpoint_created
from hafo.checkpoint.format import write_checkpoint
from hafo.gpu import GpuSample
from hafo.model.cluster import Assignment, CheckpointInfo, Gpu, InstanceStatus
from hafo.model.config import parse_config

H100 = "NVIDIA H100 80GB HBM3"


def scrape(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of the registry's text exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def fake_agent(**overrides: Any) -> Any:
    keeper = SimpleNamespace(deadline=12.5, valid=lambda: True, clock=lambda: 10.0)
    agent = SimpleNamespace(
        name="node-a",
        inventory=[Gpu(0, "GPU-0", H100, 81559),
                   Gpu(1, "GPU-1", H100, 81559, healthy=False, reason="xid 79"),
                   Gpu(2, "GPU-2", H100, 81559, degraded=True)],
        healthy=True,
        reported={"w1": InstanceStatus("w1", "node-a", 7, "running"),
                  "w2": InstanceStatus("w2", "node-a", 8, "exited", exit_code=1)},
        keeper=keeper,
        assignments=SimpleNamespace(placed={
            "w1": Assignment("w1", "placed", "node-a", gpus=(0, 2), epoch=7)}),
        memory_held=lambda: {"w1": 4096})
    for key, value in overrides.items():
        setattr(agent, key, value)
    return agent


def gpu_labels(index: int, uuid: str) -> dict[str, str]:
    return {"gpu": str(index), "UUID": uuid, "modelName": H100, "Hostname": "node-a"}


def test_node_and_gpu_families_from_the_agent_state() -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(fake_agent(), registry)
    metrics.loop_lag = 0.25
    found = scrape(registry)
    assert found["hafo_gpu_healthy"] == [(gpu_labels(0, "GPU-0"), 1.0),
                                         (gpu_labels(1, "GPU-1"), 0.0),
                                         (gpu_labels(2, "GPU-2"), 1.0)]
    assert [v for _, v in found["hafo_gpu_degraded"]] == [0.0, 0.0, 1.0]
    assert [v for _, v in found["hafo_gpu_allocated"]] == [1.0, 0.0, 1.0]
    assert found["hafo_agent_node_healthy"] == [({}, 1.0)]
    assert found["hafo_agent_lease_valid"] == [({}, 1.0)]
    assert found["hafo_agent_fencing_deadline_seconds"] == [({}, 2.5)]
    assert found["hafo_agent_loop_lag_seconds"] == [({}, 0.25)]
    assert {labels["state"]: v for labels, v in found["hafo_agent_instances"]} == {
        "starting": 0.0, "running": 1.0, "stopping": 0.0, "parked": 0.0, "exited": 1.0}
    assert "DCGM_FI_DEV_GPU_TEMP" not in found  # nothing sampled yet
    assert found["hafo_node_memory_snapshot_bytes"] == [
        ({"workload": "w1", "node": "node-a"}, 4096.0)]


def test_telemetry_families_follow_the_last_sample() -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(fake_agent(), registry)
    metrics.samples = [
        GpuSample(0, "GPU-0", H100, temperature_c=61.0, power_w=301.5, utilization_pct=88.0,
                  memory_used_mib=40000.0, memory_free_mib=41559.0, xid_count=2, last_xid=48),
        GpuSample(1, "GPU-1", H100)]  # nothing readable: only the Xid families
    found = scrape(registry)
    zero, one = gpu_labels(0, "GPU-0"), gpu_labels(1, "GPU-1")
    assert found["DCGM_FI_DEV_GPU_TEMP"] == [(zero, 61.0)]
    assert found["DCGM_FI_DEV_POWER_USAGE"] == [(zero, 301.5)]
    assert found["DCGM_FI_DEV_GPU_UTIL"] == [(zero, 88.0)]
    assert found["DCGM_FI_DEV_FB_USED"] == [(zero, 40000.0)]
    assert found["DCGM_FI_DEV_FB_FREE"] == [(zero, 41559.0)]
    assert found["DCGM_FI_DEV_XID_ERRORS"] == [(zero, 48.0), (one, 0.0)]
    assert found["hafo_gpu_xid_errors_total"] == [(zero, 2.0), (one, 0.0)]
    metrics.samples = [GpuSample(1, "GPU-1", H100, temperature_c=40.0)]
    assert scrape(registry)["DCGM_FI_DEV_GPU_TEMP"] == [(one, 40.0)]  # GPU 0 gone: no series


async def test_sampling_in_a_thread_contained() -> None:
    metrics = AgentMetrics(fake_agent(), CollectorRegistry(), sample_timeout=0.2)
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def telemetry() -> list[GpuSample]:
        threads.append(threading.get_ident())
        return [GpuSample(0, "GPU-0", H100, temperature_c=50.0)]

    await metrics.sample_gpus(telemetry)
    assert [s.temperature_c for s in metrics.samples] == [50.0]
    assert threads and threads[0] != loop_thread

    def broken() -> list[GpuSample]:
        raise RuntimeError("NVML exploded")

    await metrics.sample_gpus(broken)
    assert metrics.samples == []  # no stale readings
    release = threading.Event()

    def hung() -> list[GpuSample]:
        release.wait(5)
        return [GpuSample(0, "GPU-0", H100, temperature_c=70.0)]

    await metrics.sample_gpus(hung)
    assert metrics.samples == []
    await metrics.sample_gpus(telemetry)  # the hung read is still the one waited for
    assert metrics.samples == [] and len(threads) == 1
    release.set()
    hung_read = metrics._pending
    assert hung_read is not None
    await asyncio.wait({hung_read}, timeout=5)  # the late read has come back
    assert hung_read.done()
    await metrics.sample_gpus(telemetry)  # the late read is dropped: a fresh one is taken
    assert [s.temperature_c for s in metrics.samples] == [50.0] and len(threads) == 2


def test_etcd_request_metrics() -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(fake_agent(), registry)
    metrics.observe_etcd(0.002, None)
    metrics.observe_etcd(0.5, TimeoutError())
    metrics.observe_etcd(0.1, TimeoutError())
    found = scrape(registry)
    assert found["hafo_etcd_request_duration_seconds_count"] == [({}, 3.0)]
    assert found["hafo_etcd_request_errors_total"] == [({"error": "TimeoutError"}, 2.0)]


async def test_a_real_agent_registry_exposes_its_simulated_gpus(tmp_path: Path) -> None:
    config = parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                           "checkpoint": {"root": str(tmp_path / "ck")},
                           "node": {"name": "node-a", "state_dir": str(tmp_path / "state"),
                                    "gpus": {"simulate": {"count": 2}}}}, "agent")
    agent = Agent(config)
    try:
        assert agent.store.observer == agent.metrics.observe_etcd
        agent.inventory = agent.gpus.inventory()
        await agent.metrics.sample_gpus(agent.gpus.telemetry)
        found = scrape(agent.registry)
        temps = found["DCGM_FI_DEV_GPU_TEMP"]
        assert [(labels["gpu"], labels["Hostname"], value) for labels, value in temps] == [
            ("0", "node-a", 35.0), ("1", "node-a", 35.0)]
        assert [v for _, v in found["hafo_gpu_healthy"]] == [1.0, 1.0]
        assert found["hafo_agent_lease_valid"] == [({}, 0.0)]  # no lease yet
        assert "hafo_etcd_request_duration_seconds_count" in found
        other = Agent(config)  # a second agent in this process: no duplicate-series error
        try:
            assert other.registry is not agent.registry and scrape(other.registry) != {}
        finally:
            await other.close()
    finally:
        await agent.close()


def test_checkpoint_age_from_the_manifest_read_once(tmp_path: Path) -> None:
    ref = write_checkpoint(tmp_path / "w1", 7, 30, {"step": 30}, [b"weights"])
    created = checkpoint_created(str(ref.path))
    assert created is not None
    info = CheckpointInfo(30, 7, str(ref.path))
    agent = fake_agent(reported={
        "w1": InstanceStatus("w1", "node-a", 7, "running", checkpoint=info),
        "w2": InstanceStatus("w2", "node-a", 8, "exited", exit_code=1, checkpoint=info),
        "w3": InstanceStatus("w3", "node-a", 9, "running",
                             checkpoint=CheckpointInfo(1, 9, str(tmp_path / "gone"))),
        "w4": InstanceStatus("w4", "node-a", 9, "running")})
    now = [created + 42.5]
    registry = CollectorRegistry()
    metrics = AgentMetrics(agent, registry, wall_clock=lambda: now[0])
    # w2 exited, w3's manifest is unreadable, w4 has no checkpoint: no series
    assert scrape(registry)["hafo_workload_checkpoint_age_seconds"] == [
        ({"workload": "w1", "node": "node-a"}, 42.5)]
    (ref.path / "manifest.json").unlink()  # read once: the cached time serves
    now[0] += 10
    assert scrape(registry)["hafo_workload_checkpoint_age_seconds"] == [
        ({"workload": "w1", "node": "node-a"}, 52.5)]
    agent.reported = {}
    assert "hafo_workload_checkpoint_age_seconds" not in scrape(registry)
    assert metrics.checkpoint_times == {}
    assert checkpoint_created(str(tmp_path / "gone")) is None

"""The agent's health cycle: probes in threads, contained, classified, with hysteresis."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hafo.agent.health import NodeHealth
from hafo.checks.os_probes import OsProbe
from hafo.model import health as h
from hafo.model.cluster import Gpu
from hafo.model.health import Finding
from hafo.model.health_config import HealthConfig

CONFIG = HealthConfig(min_free_mib=0, hold_down=10)


class FakeGpus:
    """Two GPUs whose findings the test sets; optionally raising or hanging."""

    description = "2 fake GPUs"

    def __init__(self) -> None:
        self.now: list[Finding] = []
        self.raise_error = False
        self.release = threading.Event()
        self.hang = False

    def inventory(self) -> list[Gpu]:
        return [Gpu(0, "u0", "H100", 80000), Gpu(1, "u1", "H100", 80000)]

    def findings(self) -> list[Finding]:
        if self.raise_error:
            raise RuntimeError("NVML exploded")
        if self.hang:
            self.release.wait(5)
        return list(self.now)

    def close(self) -> None:
        self.release.set()


def make(tmp_path: Path, gpus: FakeGpus, clock: list[float]) -> NodeHealth:
    probe = OsProbe(tmp_path / "ck", CONFIG)
    return NodeHealth("n1", gpus, probe, CONFIG, clock=lambda: clock[0], probe_timeout=0.3)


async def test_cycle_marks_gpus_and_node_and_recovers_after_the_hold_down(
        tmp_path: Path) -> None:
    gpus, clock = FakeGpus(), [0.0]
    health = make(tmp_path, gpus, clock)
    report = await health.cycle()
    assert report.healthy and all(g.healthy for g in report.inventory)
    gpus.now = [Finding(h.XID, 1, code=48), Finding(h.XID, 0, code=13)]
    report = await health.cycle()
    assert [g.healthy for g in report.inventory] == [True, False]
    assert report.restart_apps == {0: "GPU 0: xid 13: graphics engine exception (usually an "
                                      "application fault)"}
    assert report.changes and report.healthy
    gpus.now = [Finding(h.LOST, 0)]
    report = await health.cycle()
    assert not report.healthy and "lost" in report.reason and report.inventory[0].lost
    gpus.now = []
    clock[0] = 5.0
    assert not (await health.cycle()).healthy
    clock[0] = 11.0
    report = await health.cycle()
    assert report.healthy and all(g.healthy for g in report.inventory)


async def test_a_broken_or_hanging_probe_is_contained(tmp_path: Path) -> None:
    gpus, clock = FakeGpus(), [0.0]
    health = make(tmp_path, gpus, clock)
    gpus.now = [Finding(h.LOST, 0)]  # what the GPU probe says once it answers
    gpus.raise_error = True
    report = await health.cycle()
    assert report.healthy and len(report.inventory) == 2
    gpus.raise_error, gpus.hang = False, True
    started = time.monotonic()
    report = await health.cycle()  # skipped after the probe timeout (0.3 s), not stuck
    assert time.monotonic() - started < 2.0, "the cycle waited for the hung probe (5 s)"
    assert report.healthy
    gpus.release.set()
    report = await health.cycle()  # the probe answers again: its finding counts
    assert not report.healthy and report.inventory[0].lost


async def test_a_full_checkpoint_disk_is_a_resource_fault_not_an_unhealthy_node(
        tmp_path: Path) -> None:
    """Issue 28, finding 3: the agent reports it; the leader decides whether it is the node's
    own (hafo.decisions.shared_faults). Held like the node's health; other OS findings still
    make the node unhealthy."""
    config = HealthConfig(min_free_mib=1e15, hold_down=10)
    clock = [0.0]
    probe = OsProbe(tmp_path / "ck", config)
    health = NodeHealth("n1", FakeGpus(), probe, config, clock=lambda: clock[0])
    report = await health.cycle()
    assert report.healthy and report.reason == ""
    [fault] = report.resource_faults
    assert fault.kind == h.DISK_FULL and fault.resource == f"checkpoint root {tmp_path / 'ck'}"
    assert "MiB free of 1e+15 MiB required" in fault.message
    assert any("reported to the controller" in line for line in report.changes)
    probe.config = health.config = HealthConfig(min_free_mib=0, hold_down=10)
    clock[0] = 5.0
    assert (await health.cycle()).resource_faults == (fault,)  # held
    clock[0] = 11.0
    report = await health.cycle()
    assert report.resource_faults == () and any("cleared" in c for c in report.changes)

"""GPU and node health with hysteresis: worse at once, better only after the hold-down."""

from __future__ import annotations

import pytest

from hafo.decisions.classify import classify
from hafo.decisions.health import (
    Assessment,
    HealthState,
    apply_to_inventory,
    assess,
    physical_index,
)
from hafo.model import health as h
from hafo.model.cluster import Gpu, mig_index, physical_of
from hafo.model.health import Finding
from hafo.model.health_config import HealthConfig

CONFIG = HealthConfig()
HOLD = 60.0
GPUS = [0, 1]


def cycle(state: HealthState, now: float, *findings: Finding) -> Assessment:
    return assess(state, [classify(f, CONFIG) for f in findings], GPUS, now, HOLD)


def test_healthy_cycle_changes_nothing() -> None:
    out = cycle(HealthState(), 0.0)
    assert out.changes == () and all(c.level == "ok" for c in out.state.gpus.values())


def test_dbe_marks_only_that_gpu_unhealthy_and_it_returns_after_the_hold_down() -> None:
    out = cycle(HealthState(), 0.0, Finding(h.XID, 1, code=48))
    assert out.state.gpus[1].level == "unhealthy" and out.state.gpus[0].level == "ok"
    assert out.state.node.level == "ok"
    assert out.changes == ("GPU 1: ok -> unhealthy (GPU 1: xid 48: double-bit "
                           "(uncorrectable) ECC error)",)
    assert cycle(out.state, HOLD - 1).state.gpus[1].level == "unhealthy"
    back = cycle(out.state, HOLD + 1)
    assert back.state.gpus[1].level == "ok" and back.changes == ("GPU 1: unhealthy -> ok",)


def test_a_persistent_fault_keeps_the_gpu_down() -> None:
    state, changes = HealthState(), []
    for t in range(0, 300, 2):  # five hold-downs long, the fault seen at every cycle
        out = cycle(state, float(t), Finding(h.ECC_DBE, 0, value=1))
        state = out.state
        assert state.gpus[0].level == "unhealthy", t
        changes += out.changes
    assert len(changes) == 1, changes  # down once, never back up in between


def test_a_flapping_fault_restarts_the_hold_down() -> None:
    state = cycle(HealthState(), 0.0, Finding(h.XID, 0, code=48)).state
    state = cycle(state, 50.0, Finding(h.XID, 0, code=48)).state
    assert cycle(state, 100.0).state.gpus[0].level == "unhealthy"
    assert cycle(state, 111.0).state.gpus[0].level == "ok"


def test_lost_gpu_marks_node_and_gpu() -> None:
    out = cycle(HealthState(), 0.0, Finding(h.XID, 0, code=79))
    assert out.state.node.level == "unhealthy" and "xid 79" in out.state.node.reason
    assert out.state.gpus[0].level == "unhealthy" and out.state.gpus[0].lost


def test_degraded_then_unhealthy_escalates_at_once_and_steps_down_through_degraded() -> None:
    state = cycle(HealthState(), 0.0, Finding(h.REMAP_PENDING, 0)).state
    assert state.gpus[0].level == "degraded"
    state = cycle(state, 1.0, Finding(h.REMAP_PENDING, 0), Finding(h.ECC_DBE, 0, value=1)).state
    assert state.gpus[0].level == "unhealthy"
    state = cycle(state, 70.0, Finding(h.REMAP_PENDING, 0)).state
    assert state.gpus[0].level == "degraded"


def test_restart_app_leaves_health_alone_and_names_the_gpu() -> None:
    out = cycle(HealthState(), 0.0, Finding(h.XID, 1, code=13))
    assert dict(out.restart_apps) == {1: "GPU 1: xid 13: graphics engine exception "
                                         "(usually an application fault)"}
    assert all(c.level == "ok" for c in out.state.gpus.values())


def test_os_finding_marks_the_node() -> None:
    out = cycle(HealthState(), 0.0, Finding(h.DISK_READONLY, detail="EROFS"))
    assert out.state.node.level == "unhealthy"
    assert out.state.node.reason.startswith("disk readonly (EROFS)")


def test_inventory_gets_the_flags() -> None:
    state = cycle(HealthState(), 0.0, Finding(h.LOST, 0), Finding(h.THERMAL, 1, value=95)).state
    inventory = [Gpu(0, "u0", "m", 1), Gpu(1, "u1", "m", 1)]
    lost, hot = apply_to_inventory(inventory, state)
    assert (lost.healthy, lost.lost, lost.usable) == (False, True, False)
    assert (hot.healthy, hot.degraded, hot.usable) == (True, True, False)


# GPU 0 whole; GPU 1 in MIG mode, listed as MIG devices 200 and 201
MIG_INVENTORY = [Gpu(0, "u0", "m", 1, utilization=50.0),
                 Gpu(mig_index(1, 0), "MIG-a", "m", 1, profile="1g.10gb", parent=1),
                 Gpu(mig_index(1, 1), "MIG-b", "m", 1, profile="1g.10gb", parent=1)]


@pytest.mark.parametrize(("gpu", "physical"), [
    (MIG_INVENTORY[0], 0), (MIG_INVENTORY[1], 1), (MIG_INVENTORY[2], 1),
    (Gpu(mig_index(3, 6), "MIG-c", "m", 1), 3),  # parent unset: from the index scheme
])
def test_physical_index(gpu: Gpu, physical: int) -> None:
    assert physical_index(gpu) == physical and physical_of(gpu.index) == physical


@pytest.mark.parametrize(("finding", "flags"), [
    pytest.param(Finding(h.XID, 1, code=48), [(True, False), (False, False), (False, False)],
                 id="unhealthy-gpu-marks-its-mig-devices"),
    pytest.param(Finding(h.REMAP_PENDING, 1), [(True, False), (True, True), (True, True)],
                 id="degraded-gpu-marks-its-mig-devices"),
    pytest.param(Finding(h.XID, 0, code=48), [(False, False), (True, False), (True, False)],
                 id="whole-gpu-alone"),
])
def test_mig_devices_take_their_physical_gpus_condition(
        finding: Finding, flags: list[tuple[bool, bool]]) -> None:
    indices = [g.index for g in MIG_INVENTORY]
    out = assess(HealthState(), [classify(finding, CONFIG)], indices, 0.0, HOLD)
    assert sorted(out.state.gpus) == [0, 1]
    inventory = apply_to_inventory(MIG_INVENTORY, out.state)
    assert [(g.healthy, g.degraded) for g in inventory] == flags
    assert inventory[0].utilization == 50.0 and inventory[1].profile == "1g.10gb"
    assert inventory[2].parent == 1 and inventory[2].uuid == "MIG-b"


def test_restart_app_on_a_mig_gpu_names_its_devices() -> None:
    indices = [g.index for g in MIG_INVENTORY]
    out = assess(HealthState(), [classify(Finding(h.XID, 1, code=13), CONFIG)], indices, 0.0,
                 HOLD)
    assert sorted(out.restart_apps) == [1, 200, 201]

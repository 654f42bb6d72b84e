"""GPU and node health with hysteresis: worse at once, better only after the hold-down."""

from __future__ import annotations

from hafo.decisions.classify import classify
from hafo.decisions.health import Assessment, HealthState, apply_to_inventory, assess
from hafo.model import health as h
from hafo.model.cluster import Gpu
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
    state = HealthState()
    for t in range(0, 300, 2):
        state = cycle(state, float(t), Finding(h.ECC_DBE, 0, value=1)).state
    assert state.gpus[0].level == "unhealthy"


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

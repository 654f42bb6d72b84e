"""The fault classification table: each finding -> one action, overridable in config."""

from __future__ import annotations

import pytest

from hafo.decisions.classify import XID_TABLE, classify
from hafo.model import health as h
from hafo.model.errors import ValidationError
from hafo.model.health import Finding
from hafo.model.health_config import HealthConfig, parse_health

DEFAULT = HealthConfig()


@pytest.mark.parametrize(("finding", "action"), [
    (Finding(h.XID, 0, code=13), "restart-app"),
    (Finding(h.XID, 0, code=31), "restart-app"),
    (Finding(h.XID, 0, code=43), "restart-app"),
    (Finding(h.XID, 0, code=45), "ignore"),
    (Finding(h.XID, 0, code=48), "drain-gpu"),
    (Finding(h.XID, 0, code=63), "degraded"),
    (Finding(h.XID, 0, code=64), "drain-gpu"),
    (Finding(h.XID, 0, code=74), "drain-gpu"),
    (Finding(h.XID, 0, code=79), "drain-node"),
    (Finding(h.XID, 0, code=92), "degraded"),
    (Finding(h.XID, 0, code=94), "restart-app"),
    (Finding(h.XID, 0, code=95), "drain-gpu"),
    (Finding(h.XID, 0, code=119), "drain-gpu"),
    (Finding(h.XID, 0, code=9999), "drain-gpu"),  # unknown: no new work until understood
    (Finding(h.ECC_DBE, 1, value=2), "drain-gpu"),
    (Finding(h.ECC_SBE_RATE, 1, value=500), "degraded"),
    (Finding(h.ECC_SBE_RATE, 1, value=5), "ignore"),
    (Finding(h.PCIE_REPLAY, 1, value=1000), "degraded"),
    (Finding(h.PCIE_REPLAY, 1, value=3), "ignore"),
    (Finding(h.RETIRED_PAGES_PENDING, 1), "degraded"),
    (Finding(h.REMAP_PENDING, 1), "degraded"),
    (Finding(h.REMAP_FAILED, 1), "drain-gpu"),
    (Finding(h.LOST, 2), "drain-node"),
    (Finding(h.THERMAL, 2, value=92), "degraded"),
    (Finding(h.HW_SLOWDOWN, 2), "degraded"),
    (Finding(h.HW_THERMAL_SLOWDOWN, 2), "degraded"),
    (Finding(h.HW_POWER_BRAKE, 2), "degraded"),
    (Finding(h.RECOVERY_ACTION, 0, code=0), "ignore"),
    (Finding(h.RECOVERY_ACTION, 0, code=1), "drain-gpu"),
    (Finding(h.RECOVERY_ACTION, 0, code=2), "drain-node"),
    (Finding(h.RECOVERY_ACTION, 0, code=3), "degraded"),
    (Finding(h.DISK_FULL, value=10), "drain-node"),
    (Finding(h.DISK_READONLY), "drain-node"),
    (Finding(h.MEMORY_PRESSURE, value=80), "drain-node"),
    (Finding(h.CLOCK_JUMP, value=-120), "drain-node"),
    (Finding(h.LOOP_LAG, value=3), "drain-node"),
    (Finding("something-new"), "ignore"),
])
def test_default_table(finding: Finding, action: str) -> None:
    assert classify(finding, DEFAULT).action == action


def test_every_xid_row_has_a_reason_and_a_known_action() -> None:
    for xid, (action, why) in XID_TABLE.items():
        assert why and action in ("ignore", "restart-app", "degraded", "drain-gpu",
                                  "drain-node"), xid


@pytest.mark.parametrize(("actions", "finding", "expected"), [
    ({"xid:13": "ignore"}, Finding(h.XID, 0, code=13), "ignore"),
    ({"xid:48": "drain-node"}, Finding(h.XID, 0, code=48), "drain-node"),
    ({"xid:48": "drain-node"}, Finding(h.XID, 0, code=13), "restart-app"),
    ({"clock_jump": "ignore"}, Finding(h.CLOCK_JUMP, value=100), "ignore"),
    ({"ecc_sbe_rate": "drain-gpu"}, Finding(h.ECC_SBE_RATE, 0, value=1), "drain-gpu"),
])
def test_config_overrides(actions: dict[str, str], finding: Finding, expected: str) -> None:
    config = parse_health({"actions": actions})
    assert classify(finding, config).action == expected


def test_thresholds_come_from_config() -> None:
    config = parse_health({"sbe_rate_per_hour": 1000})
    assert classify(Finding(h.ECC_SBE_RATE, 0, value=500), config).action == "ignore"


def test_reason_names_the_gpu_and_the_fault() -> None:
    verdict = classify(Finding(h.XID, 3, code=48), DEFAULT)
    assert verdict.reason == "GPU 3: xid 48: double-bit (uncorrectable) ECC error"


@pytest.mark.parametrize(("raw", "field"), [
    ({"actions": {"xid:abc": "ignore"}}, "health.actions.xid:abc"),
    ({"actions": {"nonsense": "ignore"}}, "health.actions.nonsense"),
    ({"actions": {"xid:13": "reboot"}}, "health.actions.xid:13"),
    ({"hold_down": -1}, "health.hold_down"),
    ({"interval": 0}, "health.interval"),
    ({"colour": 1}, "health.colour"),
])
def test_bad_health_config_names_the_field(raw: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_health(raw)
    assert info.value.field == field

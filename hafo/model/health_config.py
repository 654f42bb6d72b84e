"""The agent's ``health:`` config section: polling, hysteresis, thresholds, action overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hafo.model.errors import ValidationError
from hafo.model.health import GPU_KINDS, HEALTH_ACTIONS, OS_KINDS, HealthAction
from hafo.model.parsing import as_mapping, get_number, reject_unknown

_NUMBERS: dict[str, float] = {
    "interval": 2.0,             # seconds between GPU and OS health polls
    "hold_down": 60.0,           # a GPU or node is healthy again this long after its last fault
    "sbe_rate_per_hour": 100.0,  # corrected ECC errors per hour above which a GPU is degrading
    "pcie_replay_per_min": 100.0,
    "min_free_mib": 1024.0,      # checkpoint filesystem free space
    "memory_psi_avg10": 60.0,    # PSI memory "some" avg10, percent
    "min_mem_available_pct": 2.0,
    "clock_jump": 30.0,          # seconds the wall clock may jump between polls
    "loop_lag": 2.0,             # seconds the agent's event loop may lag
}


@dataclass(frozen=True)
class HealthConfig:
    """Health polling and classification settings (all times in seconds)."""

    interval: float = 2.0
    hold_down: float = 60.0
    sbe_rate_per_hour: float = 100.0
    pcie_replay_per_min: float = 100.0
    min_free_mib: float = 1024.0
    memory_psi_avg10: float = 60.0
    min_mem_available_pct: float = 2.0
    clock_jump: float = 30.0
    loop_lag: float = 2.0
    actions: Mapping[str, HealthAction] = field(default_factory=dict)


def _action_key_ok(key: str) -> bool:
    if key.startswith("xid:"):
        return key[4:].isdigit()
    return key in GPU_KINDS or key in OS_KINDS


def parse_health(raw: Any) -> HealthConfig:
    """Validate the ``health`` section. ``actions`` overrides the classification table: keys
    are a finding kind (``ecc_sbe_rate``, ``disk_full``...) or ``xid:N``; values one of
    ignore, restart-app, degraded, drain-gpu, drain-node."""
    data = as_mapping(raw or {}, "health")
    reject_unknown(data, {*_NUMBERS, "actions"}, "health")
    numbers = {name: get_number(data, name, "health", default, minimum=0,
                                exclusive_minimum=name in ("interval",))
               for name, default in _NUMBERS.items()}
    actions_raw = as_mapping(data.get("actions") or {}, "health.actions")
    actions: dict[str, HealthAction] = {}
    for key, value in actions_raw.items():
        key = str(key)
        if not _action_key_ok(key):
            raise ValidationError(f"health.actions.{key}",
                                  "must be a finding kind (e.g. ecc_dbe, disk_full) or xid:N")
        if value not in HEALTH_ACTIONS:
            raise ValidationError(f"health.actions.{key}",
                                  f"must be one of {', '.join(HEALTH_ACTIONS)}")
        actions[key] = value
    return HealthConfig(actions=actions, **numbers)

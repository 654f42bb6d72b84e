"""The agent's ``health:`` config section: polling, hysteresis, thresholds, action overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Strict

from hafo.model.health import GPU_KINDS, OS_KINDS, HealthAction
from hafo.model.schema import Matches, NonNegative, Positive, Schema, Section

#: A key of ``health.actions``: a finding kind, or ``xid:N`` for one XID.
ActionKey = Annotated[str, Strict(), Matches(
    "|".join(["xid:[0-9]+", *sorted(GPU_KINDS | OS_KINDS)]),
    "must be a finding kind (e.g. ecc_dbe, disk_full) or xid:N")]


@dataclass(frozen=True)
class HealthConfig(Section):
    """Health polling and classification settings (all times in seconds).

    ``actions`` overrides the classification table: keys are a finding kind
    (``ecc_sbe_rate``, ``disk_full``...) or ``xid:N``; values one of ignore, restart-app,
    degraded, drain-gpu, drain-node."""

    interval: Positive = 2.0  # seconds between GPU and OS health polls
    """Seconds between GPU and OS health polls."""
    hold_down: NonNegative = 60.0  # a GPU or node is healthy again this long after its last fault
    """Seconds after its last fault before a GPU or the node is healthy again."""
    sbe_rate_per_hour: NonNegative = 100.0  # corrected ECC errors per hour: degrading above
    """Corrected ECC errors per hour above which a GPU is degrading."""
    pcie_replay_per_min: NonNegative = 100.0
    """PCIe replays per minute above which a GPU is degrading."""
    min_free_mib: NonNegative = 1024.0  # checkpoint filesystem free space
    """Free MiB of the checkpoint filesystem below which the agent reports a `disk_full` resource
    fault: the node's own fault or a cluster condition, as the leader decides."""
    memory_psi_avg10: NonNegative = 60.0  # PSI memory "some" avg10, percent
    """PSI memory "some" avg10 percent above which the node is unhealthy."""
    min_mem_available_pct: NonNegative = 2.0
    """MemAvailable percent below which the node is unhealthy (where PSI is absent)."""
    clock_jump: NonNegative = 30.0  # seconds the wall clock may jump between polls
    """Seconds the wall clock may step between polls, against the monotonic clock: one step is
    finding `clock_step` (a warning); 3 steps within 10 min, or a rate over 1 % off, is
    `clock_jump` (drain-node)."""
    loop_lag: NonNegative = 2.0  # seconds the agent's event loop may lag
    """Seconds the agent's event loop may lag."""
    actions: Mapping[ActionKey, HealthAction] = field(default_factory=dict)
    """Overrides of the classification table: key `xid:N` or a finding kind; value `ignore`,
    `restart-app`, `degraded`, `drain-gpu` or `drain-node`."""


HEALTH: Schema[HealthConfig] = Schema(HealthConfig, "health")


def parse_health(raw: Any) -> HealthConfig:
    """Validate the ``health`` section (None: the defaults)."""
    return HEALTH.validate({} if raw is None else raw)

"""Health findings: what a probe saw (GPU, OS), before classification decides what to do.

A ``Finding`` is one observation at one moment: an XID event, a volatile double-bit ECC count,
a GPU that fell off the bus, a full checkpoint filesystem. Probes (``hafo.gpu``,
``hafo.checks.os_probes``) produce findings; ``hafo.decisions.classify`` maps each to an action
and ``hafo.decisions.health`` turns them, with hysteresis, into GPU and node health.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# GPU findings
XID = "xid"                          # code: the XID number
ECC_DBE = "ecc_dbe"                  # value: volatile uncorrected (double-bit) error count
ECC_SBE_RATE = "ecc_sbe_rate"        # value: corrected (single-bit) errors per hour
RETIRED_PAGES_PENDING = "retired_pages_pending"
REMAP_PENDING = "remap_pending"      # a row remap waits for a GPU reset
REMAP_FAILED = "remap_failed"        # the GPU ran out of spare rows
LOST = "lost"                        # NVML_ERROR_GPU_IS_LOST: fell off the bus
THERMAL = "thermal"                  # value: temperature in C (at/above the slowdown threshold)
HW_SLOWDOWN = "hw_slowdown"          # clock-event reason: HW slowdown
HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
HW_POWER_BRAKE = "hw_power_brake"
PCIE_REPLAY = "pcie_replay"          # value: replays per minute
RECOVERY_ACTION = "recovery_action"  # code: the driver's NVML_GPU_RECOVERY_ACTION_* value
# OS findings (gpu is None)
DISK_FULL = "disk_full"              # value: free MiB of the checkpoint filesystem; detail:
                                     # "PATH: 49.9 MiB free of 50 MiB required"
DISK_READONLY = "disk_readonly"
MEMORY_PRESSURE = "memory_pressure"  # value: PSI some avg10 (%), or MemAvailable %
CLOCK_JUMP = "clock_jump"            # the wall clock is unusable (it keeps stepping, or runs
                                     # off the monotonic clock's rate); value: its last step
CLOCK_STEP = "clock_step"            # value: seconds the wall clock stepped (once: reported)
LOOP_LAG = "loop_lag"                # value: seconds the agent's event loop lagged
STATE_DIR = "state_dir"              # detail: "PATH: OS error" (the agent cannot write there)

GPU_KINDS = frozenset({XID, ECC_DBE, ECC_SBE_RATE, RETIRED_PAGES_PENDING, REMAP_PENDING,
                       REMAP_FAILED, LOST, THERMAL, HW_SLOWDOWN, HW_THERMAL_SLOWDOWN,
                       HW_POWER_BRAKE, PCIE_REPLAY, RECOVERY_ACTION})
OS_KINDS = frozenset({DISK_FULL, DISK_READONLY, MEMORY_PRESSURE, CLOCK_JUMP, CLOCK_STEP,
                      LOOP_LAG, STATE_DIR})

#: The unit of a finding's value, where ``describe`` names one. A detail that already says
#: it ("49.9 MiB free of 50 MiB required") is not repeated.
VALUE_UNITS: Mapping[str, str] = {DISK_FULL: "MiB free"}

HealthAction = Literal["ignore", "restart-app", "degraded", "drain-gpu", "drain-node"]
HEALTH_ACTIONS: tuple[HealthAction, ...] = ("ignore", "restart-app", "degraded", "drain-gpu",
                                            "drain-node")


@dataclass(frozen=True)
class Finding:
    """One observation of a probe. ``gpu`` is the GPU index, None for node-wide findings."""

    kind: str
    gpu: int | None = None
    code: int | None = None
    value: float | None = None
    detail: str = ""

    def describe(self) -> str:
        """A short human description, e.g. ``GPU 0: xid 48 (double-bit ECC)``."""
        what = self.kind.replace("_", " ")
        if self.code is not None:
            what = f"{what} {self.code}"
        elif self.value is not None:
            unit = VALUE_UNITS.get(self.kind, "")
            if not unit:
                what = f"{what} {self.value:g}"
            elif unit not in self.detail:
                what = f"{what} {self.value:g} {unit}"
        if self.detail:
            what = f"{what} ({self.detail})"
        return what if self.gpu is None else f"GPU {self.gpu}: {what}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"kind": self.kind, "gpu": self.gpu, "code": self.code, "value": self.value,
                "detail": self.detail}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Finding:
        """Inverse of ``to_dict``."""
        return Finding(kind=str(d["kind"]), gpu=d.get("gpu"), code=d.get("code"),
                       value=d.get("value"), detail=str(d.get("detail", "")))

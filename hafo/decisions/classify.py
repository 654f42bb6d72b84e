"""GPU and OS fault classification: each finding -> one action. A pure, documented table.

Actions, mildest first:
- ``ignore``: log only.
- ``restart-app``: the application using that GPU hit an error its own process must recover
  from (NVIDIA: "restart the application"); restart the workload in place.
- ``degraded``: the GPU still works but is failing (pending row remap, high single-bit ECC
  rate, hardware slowdown): move its work proactively with a fresh checkpoint, place nothing
  new on it.
- ``drain-gpu``: the GPU needs a reset: mark it unhealthy, move the work using it (checkpoint
  first while it still answers), leave the rest of the node alone.
- ``drain-node``: the node needs a reboot (GPU fell off the bus) or its OS cannot host work:
  mark the node unhealthy, move all its work.

The XID rows follow NVIDIA's Xid catalog, "Xid Errors", section "Xid Messages" and its
"Resolution Bucket" column (https://docs.nvidia.com/deploy/xid-errors/): RESTART_APP ->
restart-app, RESET_GPU -> drain-gpu, RESTART_BM / node reboot -> drain-node, IGNORE -> ignore,
CONTACT_SUPPORT / WORKFLOW_* -> drain-gpu. An XID the table does not list is treated as
``drain-gpu``: an unknown hardware error should not get new work until it is understood (as
the NVIDIA device plugin for Kubernetes does), and config can say otherwise
(``health.actions: {"xid:NN": ...}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hafo.model import health as h
from hafo.model.health import Finding, HealthAction
from hafo.model.health_config import HealthConfig

# XID -> (action, what NVIDIA's catalog says it is)
XID_TABLE: Mapping[int, tuple[HealthAction, str]] = {
    8: ("restart-app", "GPU stopped responding to a channel (timeout)"),
    13: ("restart-app", "graphics engine exception (usually an application fault)"),
    31: ("restart-app", "GPU memory page fault (MMU fault; usually an application fault)"),
    32: ("restart-app", "invalid or corrupted push buffer stream"),
    38: ("drain-gpu", "driver firmware error"),
    43: ("restart-app", "GPU stopped processing (reset channel; the application must restart)"),
    45: ("ignore", "preemptive cleanup after earlier errors (follows another XID)"),
    48: ("drain-gpu", "double-bit (uncorrectable) ECC error"),
    56: ("drain-gpu", "display engine error"),
    57: ("drain-gpu", "error programming video memory interface"),
    61: ("drain-gpu", "internal micro-controller breakpoint/warning"),
    62: ("drain-gpu", "internal micro-controller halt"),
    63: ("degraded", "ECC page retirement or row remap recorded (takes effect at reset)"),
    64: ("drain-gpu", "ECC page retirement or row remap recording failure"),
    68: ("restart-app", "video decoder (NVDEC) exception"),
    69: ("restart-app", "graphics engine class error"),
    74: ("drain-gpu", "NVLink error"),
    79: ("drain-node", "GPU has fallen off the bus"),
    92: ("degraded", "high single-bit ECC error rate"),
    94: ("restart-app", "contained ECC error (only the affected application must restart)"),
    95: ("drain-gpu", "uncontained ECC error"),
    109: ("restart-app", "context switch timeout"),
    110: ("drain-gpu", "security fault error"),
    119: ("drain-gpu", "GSP RPC timeout"),
    120: ("drain-gpu", "GSP error"),
    121: ("drain-gpu", "C2C link error"),
    122: ("drain-gpu", "SPI PMU RPC read failure"),
    123: ("drain-gpu", "SPI PMU RPC write failure"),
    136: ("drain-gpu", "link training failed"),
    137: ("restart-app", "NVLink FLA privilege error (an application fault)"),
    140: ("drain-gpu", "unrecovered ECC error"),
    143: ("drain-gpu", "GPU initialization failure"),
    144: ("drain-gpu", "NVLink SAW error"),
    145: ("drain-gpu", "NVLink RLW error"),
    149: ("drain-gpu", "NVLink NETIR error"),
    154: ("drain-gpu", "GPU recovery action changed (see the recovery action)"),
}
UNKNOWN_XID: HealthAction = "drain-gpu"

# NVML_GPU_RECOVERY_ACTION_* -> action (nvml.h: NONE 0, GPU_RESET 1, NODE_REBOOT 2,
# DRAIN_P2P 3, DRAIN_AND_RESET 4)
RECOVERY_ACTIONS: Mapping[int, tuple[HealthAction, str]] = {
    0: ("ignore", "no recovery needed"),
    1: ("drain-gpu", "the driver asks for a GPU reset"),
    2: ("drain-node", "the driver asks for a node reboot"),
    3: ("degraded", "the driver asks to drain peer-to-peer traffic"),
    4: ("drain-gpu", "the driver asks to drain and reset the GPU"),
}

# Finding kind -> action, for kinds without a threshold
KIND_TABLE: Mapping[str, tuple[HealthAction, str]] = {
    h.ECC_DBE: ("drain-gpu", "volatile double-bit ECC errors: the GPU needs a reset"),
    h.RETIRED_PAGES_PENDING: ("degraded", "retired pages pending a reset"),
    h.REMAP_PENDING: ("degraded", "row remap pending a reset"),
    h.REMAP_FAILED: ("drain-gpu", "row remapping failed: no spare rows"),
    h.LOST: ("drain-node", "GPU is lost (fell off the bus): the node needs a reboot"),
    h.THERMAL: ("degraded", "at or above its slowdown temperature"),
    h.HW_SLOWDOWN: ("degraded", "hardware slowdown"),
    h.HW_THERMAL_SLOWDOWN: ("degraded", "hardware thermal slowdown"),
    h.HW_POWER_BRAKE: ("degraded", "hardware power brake slowdown"),
    h.DISK_FULL: ("drain-node", "checkpoint filesystem nearly full"),
    h.DISK_READONLY: ("drain-node", "checkpoint filesystem not writable"),
    h.MEMORY_PRESSURE: ("drain-node", "memory pressure"),
    h.CLOCK_JUMP: ("drain-node", "wall clock unusable"),
    h.CLOCK_STEP: ("ignore", "wall clock stepped: no decision reads it (log timestamps only)"),
    h.LOOP_LAG: ("drain-node", "agent event loop lagging"),
    h.STATE_DIR: ("drain-node", "the agent cannot write its state directory"),
}
# Kinds with a rate threshold from the config: above -> degraded, below -> ignore
RATE_KINDS: Mapping[str, str] = {h.ECC_SBE_RATE: "sbe_rate_per_hour",
                                 h.PCIE_REPLAY: "pcie_replay_per_min"}


@dataclass(frozen=True)
class Verdict:
    """What to do about one finding, and why (for logs, events and the node's reason)."""

    finding: Finding
    action: HealthAction
    why: str

    @property
    def reason(self) -> str:
        """``<finding>: <why>``, e.g. ``GPU 0: xid 48: double-bit (uncorrectable) ECC error``."""
        return f"{self.finding.describe()}: {self.why}"


def classify(finding: Finding, config: HealthConfig) -> Verdict:
    """The action for one finding: config overrides first (``xid:N``, then the kind), then
    the tables above."""
    overrides = config.actions
    if finding.kind == h.XID and finding.code is not None:
        action, why = XID_TABLE.get(finding.code, (UNKNOWN_XID, "not in the XID table"))
        key = f"xid:{finding.code}"
        if key in overrides:
            return Verdict(finding, overrides[key], f"{why} (action set by health.actions)")
        return Verdict(finding, action, why)
    if finding.kind in overrides:
        return Verdict(finding, overrides[finding.kind], "set by health.actions")
    if finding.kind == h.RECOVERY_ACTION:
        action, why = RECOVERY_ACTIONS.get(finding.code or 0,
                                           ("drain-gpu", "unknown recovery action"))
        return Verdict(finding, action, why)
    if finding.kind in RATE_KINDS:
        limit = float(getattr(config, RATE_KINDS[finding.kind]))
        value = finding.value or 0.0
        if value > limit:
            return Verdict(finding, "degraded", f"above {limit:g}")
        return Verdict(finding, "ignore", f"at or below {limit:g}")
    if finding.kind in KIND_TABLE:
        action, why = KIND_TABLE[finding.kind]
        return Verdict(finding, action, why)
    return Verdict(finding, "ignore", "unknown finding kind")

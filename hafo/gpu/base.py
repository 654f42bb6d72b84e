"""The GPU backend interface: inventory, health findings and telemetry, polled every health
cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hafo.model.cluster import Gpu
from hafo.model.health import Finding


@dataclass(frozen=True)
class GpuSample:
    """One physical GPU's readings at one moment (for metrics only: never written to etcd).

    A GPU in MIG mode is sampled whole (``index`` and ``uuid`` of the physical GPU). Each
    reading is None where the GPU, driver or binding cannot give it (or the GPU is lost).
    ``xid_count``: Xid events seen since the backend started (each burst once);
    ``last_xid``: the most recent one, None if none."""

    index: int
    uuid: str
    model: str
    temperature_c: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_free_mib: float | None = None
    xid_count: int = 0
    last_xid: int | None = None


class GpuBackend(Protocol):
    """What the agent needs from a GPU backend. Calls may block: run them in a thread."""

    description: str

    def inventory(self) -> list[Gpu]:
        """Every GPU of the node (identity; health is decided from ``findings``)."""
        ...

    def findings(self) -> list[Finding]:
        """What is wrong right now, and what happened since the last call (XID events,
        counters that grew). Healthy GPUs yield nothing."""
        ...

    def telemetry(self) -> list[GpuSample]:
        """Each physical GPU's current readings (temperature, power, utilization, memory);
        never raises for one unreadable value."""
        ...

    def close(self) -> None:
        """Release the backend."""
        ...


class NoGpus:
    """A CPU-only node (``gpus: none``, or ``auto`` without NVML)."""

    def __init__(self, description: str = "no GPUs") -> None:
        self.description = description

    def inventory(self) -> list[Gpu]:
        """Always empty."""
        return []

    def findings(self) -> list[Finding]:
        """Nothing to find."""
        return []

    def telemetry(self) -> list[GpuSample]:
        """Nothing to sample."""
        return []

    def close(self) -> None:
        """Nothing to release."""

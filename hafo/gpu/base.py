"""The GPU backend interface: inventory, and health findings polled every health cycle."""

from __future__ import annotations

from typing import Protocol

from hafo.model.cluster import Gpu
from hafo.model.health import Finding


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

    def close(self) -> None:
        """Nothing to release."""

"""The GPU backend interface: inventory with a health flag per GPU."""

from __future__ import annotations

from typing import Protocol

from hafo.model.cluster import Gpu


class GpuBackend(Protocol):
    """What the agent needs from a GPU backend. Calls may block: run them in a thread."""

    description: str

    def inventory(self) -> list[Gpu]:
        """Every GPU of the node with its current health."""
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

    def close(self) -> None:
        """Nothing to release."""

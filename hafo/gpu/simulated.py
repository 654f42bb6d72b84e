"""Simulated GPUs for machines without them: inventory from config, faults from a JSON file.

The faults file (DESIGN.md part B) maps a GPU index to a fault, e.g. ``{"0": {"xid": 79}}``,
``{"1": {"ecc_dbe": 1}}``, ``{"2": {"lost": true}}``. It is re-read on every call; an absent
file or ``{}`` means healthy. Any listed fault marks that GPU unhealthy.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import structlog

from hafo.model.cluster import Gpu

log = structlog.get_logger("hafo.gpu")


class SimulatedGpus:
    """A node's simulated GPUs."""

    def __init__(self, node: str, count: int, model: str, memory_mib: int,
                 faults_file: str | None = None) -> None:
        self.node = node
        self.count = count
        self.model = model
        self.memory_mib = memory_mib
        self.faults_file = Path(faults_file) if faults_file else None
        self.description = f"{count} simulated {model}"

    def uuid(self, index: int) -> str:
        """A stable, node-unique UUID in NVIDIA's textual form."""
        digest = hashlib.sha256(f"{self.node}/{index}".encode()).hexdigest()
        return (f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                f"{digest[20:32]}")

    def faults(self) -> dict[int, dict[str, Any]]:
        """The faults file's content by GPU index (bad content is logged and ignored)."""
        if self.faults_file is None or not self.faults_file.exists():
            return {}
        try:
            raw = json.loads(self.faults_file.read_text() or "{}")
            return {int(k): dict(v) for k, v in raw.items() if v}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("unreadable faults file", path=str(self.faults_file), error=str(exc))
            return {}

    def inventory(self) -> list[Gpu]:
        """Every simulated GPU, unhealthy where the faults file names a fault."""
        faults = self.faults()
        return [Gpu(index=i, uuid=self.uuid(i), model=self.model, memory_mib=self.memory_mib,
                    healthy=i not in faults)
                for i in range(self.count)]

    def close(self) -> None:
        """Nothing to release."""

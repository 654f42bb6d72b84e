"""Plain frozen data: nodes, GPUs, specs, assignments, events, snapshots. Imports nothing else.

The names below load their modules on first use (PEP 562): ``import hafo.model.ends`` (the
guard's only model import) does not pay for the schema library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hafo.model.cluster import (
        Assignment,
        CheckpointInfo,
        ClusterSnapshot,
        Event,
        Gpu,
        InstanceStatus,
        Liveness,
        NodeRecord,
        Submission,
    )
    from hafo.model.config import Config, parse_config
    from hafo.model.errors import ValidationError
    from hafo.model.spec import WorkloadSpec, parse_spec

_HOMES = {
    "Assignment": "cluster", "CheckpointInfo": "cluster", "ClusterSnapshot": "cluster",
    "Event": "cluster", "Gpu": "cluster", "InstanceStatus": "cluster", "Liveness": "cluster",
    "NodeRecord": "cluster", "Submission": "cluster", "Config": "config",
    "parse_config": "config", "ValidationError": "errors", "WorkloadSpec": "spec",
    "parse_spec": "spec",
}

__all__ = [
    "Assignment",
    "CheckpointInfo",
    "ClusterSnapshot",
    "Config",
    "Event",
    "Gpu",
    "InstanceStatus",
    "Liveness",
    "NodeRecord",
    "Submission",
    "ValidationError",
    "WorkloadSpec",
    "parse_config",
    "parse_spec",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'hafo.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hafo.model.{home}"), name)

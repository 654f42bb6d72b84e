"""Plain frozen data: nodes, GPUs, specs, assignments, events, snapshots. Imports nothing else."""

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

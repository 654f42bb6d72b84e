"""Whether an instance must leave its node because of the hardware: the node is unhealthy,
or one of the instance's GPUs is unhealthy or degrading. Pure; used for single-node
workloads (``reconcile``) and for each member of a gang (``gangs``)."""

from __future__ import annotations

from dataclasses import dataclass

from hafo.decisions.plan import Cause
from hafo.model.cluster import ClusterSnapshot


@dataclass(frozen=True)
class HardwareFault:
    """Why the instance on a node must stop (``subject``: "node N is unhealthy (...)", "GPU 2
    on N is degrading (...)"), the cause,
    and ``lost``: one of its GPUs does not answer (no checkpoint can be taken)."""

    subject: str
    cause: Cause
    lost: bool


def hardware_fault(snapshot: ClusterSnapshot, node: str,
                   gpus: tuple[int, ...]) -> HardwareFault | None:
    """The fault that moves an instance using ``gpus`` on ``node`` off it, None if none (or
    if the node's record is missing: its agent writes it again)."""
    record = snapshot.nodes.get(node)
    if record is None:
        return None
    by_index = {g.index: g for g in record.gpus}
    used = [by_index[i] for i in gpus if i in by_index]
    lost = any(g.lost for g in used)
    if snapshot.node_state(node) == "unhealthy":
        return HardwareFault(f"node {node} is unhealthy ({record.reason or 'no reason given'})",
                             Cause.NODE_UNHEALTHY, lost)
    bad = [g for g in used if not g.usable]
    if not bad:
        return None
    gpu = bad[0]
    level = "degrading" if gpu.healthy else "unhealthy"
    return HardwareFault(f"GPU {gpu.index} on {node} is {level} "
                         f"({gpu.reason or 'no reason given'})",
                         Cause.GPU_DEGRADED if gpu.healthy else Cause.GPU_FAULT, lost)

"""The environment of a gang member (docs/reference/workloads.md, "Environment of a
workload"): who its peers are and where they meet, in hafo's names, torch.distributed's and
torchrun's, so that ``command: ["torchrun", "train.py"]`` runs unchanged."""

from __future__ import annotations

from pathlib import Path

from hafo.model.cluster import Assignment
from hafo.model.preflight import PREFLIGHT_FILE
from hafo.model.spec import PreflightPolicy

#: Set before the spec's ``env`` (which may override it): hafo restarts a gang, torchrun
#: should not restart its workers on its own.
GANG_DEFAULTS = {"PET_MAX_RESTARTS": "0"}


def gang_env(assignment: Assignment, node: str) -> dict[str, str]:
    """The rendezvous variables of the member of ``assignment`` on ``node`` (none for a
    single-node workload): ``MASTER_ADDR`` is rank 0's node address, ``MASTER_PORT`` the
    gang epoch's own port; one process per node (``WORLD_SIZE`` = nodes, ``RANK`` = node
    rank) unless torchrun starts ``PET_NPROC_PER_NODE`` workers (one per GPU, at least 1)."""
    member = assignment.member_on(node)
    if member is None:
        return {}
    size = str(len(assignment.members))
    rank = str(member.rank)
    master = assignment.members[0]
    address = master.address or master.node
    port = str(assignment.master_port)
    nproc = str(max(len(member.gpus), 1))
    return {"HAFO_GANG_SIZE": size, "HAFO_GANG_RANK": rank,
            "MASTER_ADDR": address, "MASTER_PORT": port,
            "NNODES": size, "NODE_RANK": rank, "WORLD_SIZE": size, "RANK": rank,
            "PET_NNODES": size, "PET_NODE_RANK": rank, "PET_MASTER_ADDR": address,
            "PET_MASTER_PORT": port, "PET_NPROC_PER_NODE": nproc}


def preflight_options(policy: PreflightPolicy, progress: Path) -> dict[str, object]:
    """The launch's ``preflight`` (``hafo.agent.guard.preflight_argv``): the spec's options,
    and where the member's report goes (its progress directory's ``preflight.json``, which
    its agent reports as ``InstanceStatus.preflight``)."""
    return {"out": str(progress / PREFLIGHT_FILE), "timeout": policy.timeout,
            "slowdown": policy.slowdown, "min_excess": policy.min_excess,
            "large_mib": policy.large_mib}

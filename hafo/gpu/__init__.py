"""GPU inventory and health: the NVML backend and the simulated backend."""

from __future__ import annotations

import structlog

from hafo.gpu.base import GpuBackend, GpuSample, NoGpus
from hafo.gpu.nvml import NvmlGpus, NvmlUnavailable
from hafo.gpu.simulated import SimulatedGpus
from hafo.model.config import GpuSource, NodeConfig

log = structlog.get_logger("hafo.gpu")


def backend_for(node: NodeConfig) -> GpuBackend:
    """The backend ``node.gpu_source`` (config ``node.gpus``) asks for. ``auto`` without NVML
    means no GPUs, said clearly."""
    if node.gpu_source is GpuSource.NONE:
        return NoGpus("no GPUs (gpus: none)")
    sim = node.simulate
    if sim is not None:
        return SimulatedGpus(node.name, sim.count, sim.model, sim.memory_mib, sim.faults_file,
                             utilization=sim.utilization, mig=sim.mig)
    try:
        return NvmlGpus()
    except NvmlUnavailable as exc:
        log.warning("no GPUs found", reason=str(exc), node=node.name)
        return NoGpus(f"no GPUs ({exc})")


__all__ = ["GpuBackend", "GpuSample", "NoGpus", "NvmlGpus", "NvmlUnavailable", "SimulatedGpus",
           "backend_for"]

"""Telemetry for metrics only: each physical GPU's temperature, power, utilization and
framebuffer memory, with its Xid count and last Xid.

Each reading is taken on its own (``Binding.read``): temperature
(``nvmlDeviceGetTemperature``), power (``nvmlDeviceGetPowerUsage``, mW), utilization
(``nvmlDeviceGetUtilizationRates``) and framebuffer memory (``nvmlDeviceGetMemoryInfo``); one
that fails is None, one that is not supported is not asked again. The Xid count and last Xid
come from the findings (once per burst). A GPU in MIG mode is sampled whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from hafo.gpu.base import GpuSample
from hafo.gpu.nvml.binding import Binding, function, text
from hafo.gpu.nvml.inventory import Inventory

_MIB = 1024 * 1024


class Telemetry:
    """Samples of the GPUs of ``inventory``; ``xids`` gives a GPU's Xid count and last Xid."""

    def __init__(self, binding: Binding, inventory: Inventory,
                 xids: Callable[[int], tuple[int, int | None]]) -> None:
        self._binding = binding
        self._nvml = binding.nvml
        self._inventory = inventory
        self._xids = xids
        self._models: dict[int, str] = {}

    def samples(self) -> list[GpuSample]:
        """Each physical GPU's readings. Never raises."""
        inventory = self._inventory
        return [self._sample(index, inventory.identify(index))
                for index in range(inventory.count)]

    def _sample(self, index: int, handle: Any) -> GpuSample:
        nvml = self._nvml
        read = self._binding.read
        uuid = self._inventory.uuids.get(index, f"unknown-{index}")
        xids = self._xids(index)
        if handle is None:
            return GpuSample(index, uuid, "unknown", xid_count=xids[0], last_xid=xids[1])
        if index not in self._models:
            with contextlib.suppress(self._binding.error, AttributeError, UnicodeDecodeError):
                self._models[index] = text(nvml.nvmlDeviceGetName(handle))
        memory = read(index, "memory", lambda: _used_free_mib(
            nvml.nvmlDeviceGetMemoryInfo(handle)))
        return GpuSample(
            index, uuid, self._models.get(index, "unknown"),
            temperature_c=read(index, "temperature", lambda: float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_w=read(index, "power", lambda: int(
                function(nvml, "nvmlDeviceGetPowerUsage")(handle)) / 1000),
            utilization_pct=read(index, "utilization", lambda: float(
                function(nvml, "nvmlDeviceGetUtilizationRates")(handle).gpu)),
            memory_used_mib=None if memory is None else memory[0],
            memory_free_mib=None if memory is None else memory[1],
            xid_count=xids[0], last_xid=xids[1])


def _used_free_mib(info: Any) -> tuple[float, float]:
    """Framebuffer memory used and free, in whole MiB, from ``nvmlDeviceGetMemoryInfo``."""
    return float(int(info.used) // _MIB), float(int(info.free) // _MIB)

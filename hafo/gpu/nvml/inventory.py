"""The node's GPUs as NVML lists them: each GPU's handle and identity (UUID, PCI bus id), and
the inventory of GPUs with their utilization, a GPU in MIG mode as its MIG devices.

Utilization (``nvmlDeviceGetUtilizationRates``) is rounded to the nearest 10 % so node records
are not rewritten for noise; None where unsupported. A GPU in MIG mode
(``nvmlDeviceGetMigMode``) is listed as its MIG devices
(``nvmlDeviceGetMigDeviceHandleByIndex``; index ``mig_index(gpu, slot)``, the profile from the
device's name, e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb", or its attributes); a GPU that cannot
say (NotSupported, an old binding) is listed whole.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from hafo.gpu.kernel_log import normalise_bus_id
from hafo.gpu.nvml.binding import Binding, Unsupported, function, handle_key, text
from hafo.model.cluster import Gpu, mig_index

_PROFILE_RE = re.compile(r"(\d+g\.\d+gb(?:\+[a-z]+)?)")


class Inventory:
    """The ``count`` GPUs NVML reports: their handles, looked up by index, UUID, handle and PCI
    bus id, for every concern; and ``gpus()``, the inventory itself."""

    def __init__(self, binding: Binding, count: int) -> None:
        self._binding = binding
        self._nvml = binding.nvml
        self.count = count
        self.handles: dict[int, Any] = {}
        self.handle_errors: dict[int, BaseException] = {}
        self.uuids: dict[int, str] = {}
        self.by_uuid: dict[str, int] = {}
        self.by_handle: dict[Any, int] = {}
        self.by_bus: dict[str, int] = {}

    def identify(self, index: int) -> Any:
        """The GPU's handle, remembered with its UUID and PCI bus id; None if unreadable."""
        if index in self.handles:
            return self.handles[index]
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            self.handle_errors[index] = exc
            self._binding.warn_once(("handle", index), "GPU unreadable through NVML", index, exc)
            return None
        self.handle_errors.pop(index, None)
        self.handles[index] = handle
        self.uuids[index] = uuid
        self.by_uuid[uuid] = index
        self.by_handle[handle_key(handle)] = index
        try:
            bus = normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except (nvml.NVMLError, AttributeError) as exc:
            self._binding.warn_once(("pci", index), "GPU PCI bus id unreadable", index, exc)
            bus = None
        if bus is not None:
            self.by_bus[bus] = index
        return handle

    def gpus(self) -> list[Gpu]:
        """Every GPU's identity and utilization, or its MIG devices if it is in MIG mode."""
        nvml = self._nvml
        gpus: list[Gpu] = []
        for index in range(self.count):
            handle = self.identify(index)
            try:
                if handle is None:
                    raise Unsupported("no handle")
                name = text(nvml.nvmlDeviceGetName(handle))
                uuid = text(nvml.nvmlDeviceGetUUID(handle))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
            except (nvml.NVMLError, Unsupported) as exc:
                self._binding.warn_once(("inventory", index), "GPU identity unreadable", index,
                                        exc)
                gpus.append(Gpu(index=index, uuid=f"unknown-{index}", model="unknown",
                                memory_mib=0))
                continue
            mig = self._mig_devices(index, handle, name)
            if mig is not None:
                gpus.extend(mig)
                continue
            gpus.append(Gpu(index=index, uuid=uuid, model=name, memory_mib=memory,
                            utilization=self._utilization(index, handle)))
        return gpus

    def _utilization(self, index: int, handle: Any) -> float | None:
        """Percent busy, rounded to the nearest 10; None where NVML cannot say."""
        binding = self._binding
        if "utilization" in binding.skip[index]:
            return None
        try:
            busy = int(function(self._nvml, "nvmlDeviceGetUtilizationRates")(handle).gpu)
        except binding.unsupported:
            binding.skip[index].add("utilization")
            return None
        except binding.error as exc:
            binding.warn_once(("utilization", index), "GPU utilization unreadable", index, exc)
            return None
        return float(min(100, max(0, (busy + 5) // 10 * 10)))

    def _mig_devices(self, index: int, handle: Any, model: str) -> list[Gpu] | None:
        """The MIG devices of a GPU in MIG mode, None if it is not in MIG mode (or NVML or
        the binding cannot tell: then it is used whole)."""
        nvml = self._nvml
        binding = self._binding
        if "mig" in binding.skip[index]:
            return None
        try:
            current = function(nvml, "nvmlDeviceGetMigMode")(handle)[0]
            if int(current) != int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)):
                return None
            slots = int(function(nvml, "nvmlDeviceGetMaxMigDeviceCount")(handle))
        except binding.unsupported:
            binding.skip[index].add("mig")
            return None
        except binding.error as exc:
            binding.warn_once(("mig", index), "GPU MIG mode unreadable", index, exc)
            return None
        devices: list[Gpu] = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except (binding.error, AttributeError):
                continue  # an empty slot (NVML_ERROR_NOT_FOUND)
            try:
                uuid = text(nvml.nvmlDeviceGetUUID(mig))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // (1024 * 1024)
                profile = self._mig_profile(mig)
            except (binding.error, AttributeError, Unsupported) as exc:
                binding.warn_once(("mig-device", index, slot), "MIG device unreadable", index,
                                  exc, slot=slot)
                continue
            devices.append(Gpu(index=mig_index(index, slot), uuid=uuid, model=model,
                               memory_mib=memory, profile=profile, parent=index))
        return devices

    def _mig_profile(self, mig: Any) -> str:
        """The MIG device's profile (e.g. 1g.10gb) from its name, else from its slice count
        and memory."""
        nvml = self._nvml
        with contextlib.suppress(self._binding.error, AttributeError):
            match = _PROFILE_RE.search(text(nvml.nvmlDeviceGetName(mig)))
            if match:
                return match.group(1)
        attributes = nvml.nvmlDeviceGetAttributes(mig)
        slices = int(attributes.gpuInstanceSliceCount)
        gigabytes = round(int(attributes.memorySizeMB) / 1024)
        if slices <= 0 or gigabytes <= 0:
            raise Unsupported("no MIG profile")
        return f"{slices}g.{gigabytes}gb"

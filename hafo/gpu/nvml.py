"""Real GPUs through NVIDIA's NVML (package nvidia-ml-py, module ``pynvml``)."""

from __future__ import annotations

import contextlib

import structlog

from hafo.model.cluster import Gpu

log = structlog.get_logger("hafo.gpu")


class NvmlUnavailable(Exception):
    """NVML could not be initialised (no driver, no library, or no GPU)."""


class NvmlGpus:
    """Inventory and basic health of the node's GPUs from NVML."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
        self.count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        self.description = f"{self.count} GPU(s) via NVML, driver {driver}"

    def inventory(self) -> list[Gpu]:
        """Every GPU; one NVML reports as lost (fell off the bus) is unhealthy."""
        nvml = self._nvml
        gpus: list[Gpu] = []
        for index in range(self.count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
                healthy = True
                try:
                    nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                except nvml.NVMLError_GpuIsLost:
                    healthy = False
                gpus.append(Gpu(index=index, uuid=_text(uuid), model=_text(name),
                                memory_mib=int(memory), healthy=healthy))
            except nvml.NVMLError as exc:
                log.warning("GPU unreadable through NVML", index=index, error=str(exc))
                gpus.append(Gpu(index=index, uuid=f"unknown-{index}", model="unknown",
                                memory_mib=0, healthy=False))
        return gpus

    def close(self) -> None:
        """Shut NVML down."""
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

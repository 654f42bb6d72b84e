"""Real GPUs through NVIDIA's NVML (package nvidia-ml-py, module ``pynvml``).

``NvmlGpus`` is the GPU backend; it owns one object per concern, all sharing one ``Binding``:

- ``binding``: the NVML library, its errors, contained reads, warnings given once;
- ``inventory``: each GPU's handle and identity, the inventory (utilization, MIG devices);
- ``polling``: health findings, from three sources (see ``hafo.model.health``): polling on
  every ``findings()`` call (volatile ECC counts, pending page retirement, row remapping, GPU
  lost, HW slowdown clock-event reasons, temperature against the slowdown threshold, the PCIe
  replay counter, and the driver's recovery action), the Xid event thread (``events``), and
  the kernel log's ``NVRM: Xid`` lines (``hafo.gpu.kernel_log``);
- ``events``: the thread waiting on NVML's Xid (and ECC) events;
- ``telemetry``: each physical GPU's readings, for metrics only.

Findings always name physical GPUs. Xid meanings: NVIDIA's catalog,
https://docs.nvidia.com/deploy/xid-errors/. The same Xid from the event thread and the kernel
log counts once per burst (``XidBursts``). Any query a GPU or binding does not support is
remembered per GPU and not asked again; nothing here raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hafo.gpu.base import GpuSample
from hafo.gpu.kernel_log import KernelLogReader
from hafo.gpu.nvml.binding import Binding, NvmlUnavailable
from hafo.gpu.nvml.events import XidEvents
from hafo.gpu.nvml.inventory import Inventory
from hafo.gpu.nvml.polling import Health
from hafo.gpu.nvml.telemetry import Telemetry
from hafo.model.cluster import Gpu
from hafo.model.health import Finding


class NvmlGpus:
    """Inventory and health findings of the node's GPUs from NVML, XID events and the kernel log.

    ``nvml`` is the ``pynvml`` module (or a stand-in for tests); ``kernel_log`` a reader of Xid
    lines, ``/dev/kmsg`` by default; ``clock`` gives the seconds rates are computed from.
    Raises ``NvmlUnavailable`` when the binding or the driver is missing or there is no GPU.
    """

    def __init__(self, nvml: Any = None, kernel_log: KernelLogReader | None = None,
                 clock: Callable[[], float] = time.monotonic, *, events: bool = True,
                 event_timeout_ms: int = 1000, burst_window: float = 10.0,
                 rate_span: float = 60.0) -> None:
        self._binding = Binding(nvml)
        self.count, driver = self._binding.start()
        self.clock = clock
        self._inventory = Inventory(self._binding, self.count)
        for index in range(self.count):
            self._inventory.identify(index)
        self.kernel_log = kernel_log if kernel_log is not None else KernelLogReader()
        self._events = XidEvents(self._binding, self._inventory, clock, event_timeout_ms)
        self._health = Health(self._binding, self._inventory, self.kernel_log,
                              self._events.drain, clock, burst_window=burst_window,
                              rate_span=rate_span)
        self._telemetry = Telemetry(self._binding, self._inventory, self._health.xids)
        self._closed = False
        if events:
            self._events.start()
        sources = ["XID events" if self._events.running else "no XID events",
                   "kernel log" if self.kernel_log.available else "no kernel log"]
        self.description = f"{self.count} GPU(s) via NVML, driver {driver} ({', '.join(sources)})"

    @property
    def rate_span(self) -> float:
        """The seconds of samples counter rates are computed over."""
        return self._health.rate_span

    @property
    def event_timeout_ms(self) -> int:
        """The longest one wait for NVML events lasts (and so ``close``)."""
        return self._events.timeout_ms

    def inventory(self) -> list[Gpu]:
        """Every GPU's identity and utilization, or its MIG devices if it is in MIG mode;
        health comes from ``findings``."""
        return self._inventory.gpus()

    def findings(self) -> list[Finding]:
        """Xids since the last call (events and kernel log, once per burst), then each GPU's
        current faults and counter rates."""
        return self._health.findings()

    def telemetry(self) -> list[GpuSample]:
        """Each physical GPU's readings (also a GPU in MIG mode, as a whole); see
        ``hafo.gpu.nvml.telemetry``. Never raises."""
        return self._telemetry.samples()

    def close(self) -> None:
        """Stop the event thread (within one event wait), close the kernel log, shut NVML down.
        A second call does nothing."""
        if self._closed:
            return
        if not self._events.stop():  # pragma: no cover - a wait NVML did not end
            return
        self._closed = True
        self._events.free()
        self.kernel_log.close()
        self._binding.shutdown()


__all__ = ["NvmlGpus", "NvmlUnavailable"]

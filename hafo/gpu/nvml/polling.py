"""Health findings: the Xids since the last call (NVML events and the kernel log, once per
burst), then each GPU's polled faults and counter rates.

Polled on every call: volatile ECC counts (corrected ones as a rate), pending page retirement,
row remapping, GPU lost, HW slowdown clock-event reasons, temperature against the slowdown
threshold, the PCIe replay counter (as a rate), and the driver's recovery action. A query a
GPU or binding does not support is not asked again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import structlog

from hafo.gpu.kernel_log import KernelLogReader, XidBursts
from hafo.gpu.nvml.binding import Binding, Unsupported, err
from hafo.gpu.nvml.events import XidReport
from hafo.gpu.nvml.inventory import Inventory
from hafo.model import health as h
from hafo.model.health import Finding

log = structlog.get_logger("hafo.gpu")

# (finding, pynvml name suffix of the clock-event reason bit, its value in NVML's header)
_HW_REASONS = ((h.HW_SLOWDOWN, "HwSlowdown", 0x08),
               (h.HW_THERMAL_SLOWDOWN, "HwThermalSlowdown", 0x40),
               (h.HW_POWER_BRAKE, "HwPowerBrakeSlowdown", 0x80))
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class Rate:
    """A counter's growth rate, per second, over the last ``span`` seconds of samples (at least
    ``span``: one corrected error between two polls 2 s apart is 1/60 per s, not 1/2)."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def update(self, now: float, count: int) -> float | None:
        """Add a sample; the rate, or None on the first sample (or after a counter reset)."""
        if self.samples and (count < self.samples[-1][1] or now < self.samples[-1][0]):
            self.samples.clear()
        self.samples.append((now, count))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.span:
            self.samples.popleft()
        if len(self.samples) < 2:
            return None
        then, base = self.samples[0]
        return (count - base) / max(now - then, self.span)


class Health:
    """The findings of the GPUs of ``inventory``: Xids from ``events`` (a drain of queued
    reports) and ``kernel_log``, debounced over ``burst_window`` seconds, and polled faults,
    with rates over ``rate_span`` seconds of ``clock``. Counts each GPU's Xids (``xids``)."""

    def __init__(self, binding: Binding, inventory: Inventory, kernel_log: KernelLogReader,
                 events: Callable[[], list[XidReport]], clock: Callable[[], float], *,
                 burst_window: float, rate_span: float) -> None:
        self._binding = binding
        self._nvml = binding.nvml
        self._inventory = inventory
        self._kernel_log = kernel_log
        self._events = events
        self._clock = clock
        self.rate_span = rate_span
        self._bursts = XidBursts(burst_window, clock)
        self._rates: dict[tuple[int, str], Rate] = {}
        self._thresholds: dict[int, float] = {}
        self._xid_count: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}

    def xids(self, index: int) -> tuple[int, int | None]:
        """How many Xids (bursts) GPU ``index`` had so far, and the last one (None if none)."""
        return self._xid_count.get(index, 0), self._last_xid.get(index)

    def findings(self) -> list[Finding]:
        """Xids since the last call (events and kernel log, once per burst), then each GPU's
        current faults and counter rates."""
        now = self._clock()
        reports = self._events()
        for record in self._kernel_log.poll():
            index = self._inventory.by_bus.get(record.pci_bus_id)
            if index is None:
                self._binding.warn_once(("bus", record.pci_bus_id),
                                        "Xid on a GPU NVML does not list", None, record.message,
                                        bus=record.pci_bus_id, xid=record.xid)
                continue
            reports.append((now, index, record.xid, record.message[:200] or "kernel log"))
        out: list[Finding] = []
        for seen, index, xid, detail in reports:
            if self._bursts.is_new(index, xid, seen):
                log.warning("GPU Xid", gpu=index, xid=xid, detail=detail)
                out.append(Finding(h.XID, index, code=xid, detail=detail))
                if index is not None:
                    self._xid_count[index] = self._xid_count.get(index, 0) + 1
                    self._last_xid[index] = xid
        for index in range(self._inventory.count):
            out.extend(self._poll(index, now))
        return out

    def _poll(self, index: int, now: float) -> list[Finding]:
        """GPU ``index``'s current faults; a lost GPU ends its queries."""
        binding = self._binding
        out: list[Finding] = []
        handle = self._inventory.identify(index)
        if handle is None:
            if isinstance(self._inventory.handle_errors.get(index), binding.lost):
                return [Finding(h.LOST, index, detail="NVML: GPU is lost")]
            return []
        queries = (self._ecc, self._retired, self._remap, self._reasons, self._thermal,
                   self._pcie, self._recovery)
        for query in queries:
            name = query.__name__
            if name in binding.skip[index]:
                continue
            try:
                out.extend(query(index, handle, now))
            except binding.lost:
                return [*out, Finding(h.LOST, index, detail="NVML: GPU is lost")]
            except binding.unsupported as exc:
                binding.skip[index].add(name)
                log.info("NVML query not available", gpu=index, query=name.lstrip("_"),
                         error=str(exc) or type(exc).__name__)
            except binding.error as exc:
                binding.warn_once(("query", index, name, str(exc)), "NVML query failed", index,
                                  exc)
        return out

    def _ecc(self, index: int, handle: Any, now: float) -> list[Finding]:
        nvml = self._nvml
        out: list[Finding] = []
        dbe = int(nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                   nvml.NVML_VOLATILE_ECC))
        if dbe > 0:
            out.append(Finding(h.ECC_DBE, index, value=float(dbe), detail="volatile"))
        sbe = int(nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                   nvml.NVML_VOLATILE_ECC))
        rate = self._rate(index, "sbe", now, sbe)
        if rate:
            out.append(Finding(h.ECC_SBE_RATE, index, value=round(rate * 3600, 3),
                               detail=f"{sbe} corrected since driver load"))
        return out

    def _retired(self, index: int, handle: Any, now: float) -> list[Finding]:
        if int(self._nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)):
            return [Finding(h.RETIRED_PAGES_PENDING, index, detail="reset to retire pages")]
        return []

    def _remap(self, index: int, handle: Any, now: float) -> list[Finding]:
        corr, unc, pending, failed = self._nvml.nvmlDeviceGetRemappedRows(handle)
        rows = f"{corr} correctable, {unc} uncorrectable rows remapped"
        out = [Finding(h.REMAP_PENDING, index, detail=rows)] if pending else []
        if failed:
            out.append(Finding(h.REMAP_FAILED, index, detail=rows))
        return out

    def _reasons(self, index: int, handle: Any, now: float) -> list[Finding]:
        nvml = self._nvml
        get = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        try:
            if get is None:
                raise AttributeError("nvmlDeviceGetCurrentClocksEventReasons")
            reasons = int(get(handle))
        except (AttributeError, err(nvml, "NVMLError_FunctionNotFound")):
            reasons = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        out: list[Finding] = []
        for kind, name, default in _HW_REASONS:
            bit = getattr(nvml, f"nvmlClocksEventReason{name}",
                          getattr(nvml, f"nvmlClocksThrottleReason{name}", default))
            if reasons & bit:
                out.append(Finding(kind, index, detail="clock event reason"))
        return out

    def _thermal(self, index: int, handle: Any, now: float) -> list[Finding]:
        nvml = self._nvml
        if index not in self._thresholds:
            self._thresholds[index] = float(nvml.nvmlDeviceGetTemperatureThreshold(
                handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
        limit = self._thresholds[index]
        temp = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        if limit > 0 and temp >= limit:
            return [Finding(h.THERMAL, index, value=temp, detail=f"slowdown at {limit:g} C")]
        return []

    def _pcie(self, index: int, handle: Any, now: float) -> list[Finding]:
        count = int(self._nvml.nvmlDeviceGetPcieReplayCounter(handle))
        rate = self._rate(index, "pcie", now, count)
        if rate:
            return [Finding(h.PCIE_REPLAY, index, value=round(rate * 60, 3),
                            detail=f"{count} replays since driver load")]
        return []

    def _recovery(self, index: int, handle: Any, now: float) -> list[Finding]:
        nvml = self._nvml
        field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            raise AttributeError("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
        value = nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
        status = int(getattr(value, "nvmlReturn", 0))
        if status == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
            raise self._binding.lost()
        if status in (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                      getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)):
            raise Unsupported(f"field status {status}")
        if status != getattr(nvml, "NVML_SUCCESS", 0):
            self._binding.warn_once(("recovery", index, status), "NVML field query failed",
                                    index, status)
            return []
        kind = int(getattr(value, "valueType", 1))
        action = int(getattr(value.value, _VALUE_FIELDS[kind] if kind < 7 else "uiVal"))
        if action != getattr(nvml, "NVML_GPU_RECOVERY_ACTION_NONE", 0):
            return [Finding(h.RECOVERY_ACTION, index, code=action, detail="driver asks")]
        return []

    def _rate(self, index: int, counter: str, now: float, count: int) -> float | None:
        rate = self._rates.setdefault((index, counter), Rate(self.rate_span))
        return rate.update(now, count)

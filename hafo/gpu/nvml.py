"""Real GPUs through NVIDIA's NVML (package nvidia-ml-py, module ``pynvml``).

Three sources of findings (see ``hafo.model.health``):

- polling, on every ``findings()`` call: volatile ECC counts, pending page retirement, row
  remapping, GPU lost, HW slowdown clock-event reasons, temperature against the slowdown
  threshold, the PCIe replay counter, and the driver's recovery action;
- an event thread waiting on NVML's Xid (and ECC) events;
- the kernel log's ``NVRM: Xid`` lines (``hafo.gpu.kernel_log``).

Inventory: each GPU with its utilization (``nvmlDeviceGetUtilizationRates``, rounded to the
nearest 10 % so node records are not rewritten for noise; None where unsupported). A GPU in
MIG mode (``nvmlDeviceGetMigMode``) is listed as its MIG devices instead
(``nvmlDeviceGetMigDeviceHandleByIndex``; index ``mig_index(gpu, slot)``, the profile from the
device's name, e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb", or its attributes); a GPU that cannot
say (NotSupported, an old binding) is listed whole. Findings always name physical GPUs.

Telemetry (``telemetry()``, for metrics only): each physical GPU's temperature
(``nvmlDeviceGetTemperature``), power (``nvmlDeviceGetPowerUsage``, mW), utilization
(``nvmlDeviceGetUtilizationRates``) and framebuffer memory (``nvmlDeviceGetMemoryInfo``), each
read on its own: one that fails is None, one that is not supported is not asked again. The
Xid count and last Xid come from the findings (once per burst).

Xid meanings: NVIDIA's catalog, https://docs.nvidia.com/deploy/xid-errors/. The same Xid from
the event thread and the kernel log counts once per burst (``XidBursts``). Any query a GPU or
binding does not support is remembered per GPU and not asked again; nothing here raises.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import importlib
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from hafo.gpu.base import GpuSample
from hafo.gpu.kernel_log import KernelLogReader, XidBursts, normalise_bus_id
from hafo.model import health as h
from hafo.model.cluster import Gpu, mig_index
from hafo.model.health import Finding

log = structlog.get_logger("hafo.gpu")

# (finding, pynvml name suffix of the clock-event reason bit, its value in NVML's header)
_HW_REASONS = ((h.HW_SLOWDOWN, "HwSlowdown", 0x08),
               (h.HW_THERMAL_SLOWDOWN, "HwThermalSlowdown", 0x40),
               (h.HW_POWER_BRAKE, "HwPowerBrakeSlowdown", 0x80))
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_MIB = 1024 * 1024
T = TypeVar("T")
_PROFILE_RE = re.compile(r"(\d+g\.\d+gb(?:\+[a-z]+)?)")


class NvmlUnavailable(Exception):
    """NVML could not be initialised (no binding, no driver, or no GPU)."""


class _Missing(Exception):
    """Stands in for an NVMLError subclass an old binding lacks: never raised."""


class _Unsupported(Exception):
    """A query this GPU, driver or binding does not have."""


class _Rate:
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
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
        self._nvml = nvml
        self._error: type[BaseException] = nvml.NVMLError
        self._lost = _err(nvml, "NVMLError_GpuIsLost")
        self._timeout = _err(nvml, "NVMLError_Timeout")
        self._unsupported = (_err(nvml, "NVMLError_NotSupported"),
                             _err(nvml, "NVMLError_FunctionNotFound"),
                             _err(nvml, "NVMLError_NoPermission"), AttributeError, _Unsupported)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
        try:
            self.count = int(nvml.nvmlDeviceGetCount())
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
        if self.count == 0:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML (driver {driver}) found no GPU")
        self.clock = clock
        self.rate_span = rate_span
        self._handles: dict[int, Any] = {}
        self._handle_errors: dict[int, BaseException] = {}
        self._by_uuid: dict[str, int] = {}
        self._by_handle: dict[Any, int] = {}
        self._by_bus: dict[str, int] = {}
        self._skip: dict[int, set[str]] = collections.defaultdict(set)
        self._warned: set[tuple[Any, ...]] = set()
        self._rates: dict[tuple[int, str], _Rate] = {}
        self._thresholds: dict[int, float] = {}
        self._uuids: dict[int, str] = {}
        self._models: dict[int, str] = {}
        self._xid_count: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}
        for index in range(self.count):
            self._identify(index)
        self.kernel_log = kernel_log if kernel_log is not None else KernelLogReader()
        self._bursts = XidBursts(burst_window, clock)
        self._queue: collections.deque[tuple[float, int | None, int, str]] = collections.deque()
        self._stop = threading.Event()
        self._closed = False
        self._event_set: Any = None
        self._thread: threading.Thread | None = None
        self.event_timeout_ms = event_timeout_ms
        if events:
            self._start_events()
        sources = ["XID events" if self._thread else "no XID events",
                   "kernel log" if self.kernel_log.available else "no kernel log"]
        self.description = f"{self.count} GPU(s) via NVML, driver {driver} ({', '.join(sources)})"

    # identity ---------------------------------------------------------------------------------

    def _identify(self, index: int) -> Any:
        """The GPU's handle, remembered with its UUID and PCI bus id; None if unreadable."""
        if index in self._handles:
            return self._handles[index]
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            self._handle_errors[index] = exc
            self._warn_once(("handle", index), "GPU unreadable through NVML", index, exc)
            return None
        self._handle_errors.pop(index, None)
        self._handles[index] = handle
        self._uuids[index] = uuid
        self._by_uuid[uuid] = index
        self._by_handle[_handle_key(handle)] = index
        try:
            bus = normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except (nvml.NVMLError, AttributeError) as exc:
            self._warn_once(("pci", index), "GPU PCI bus id unreadable", index, exc)
            bus = None
        if bus is not None:
            self._by_bus[bus] = index
        return handle

    def inventory(self) -> list[Gpu]:
        """Every GPU's identity and utilization, or its MIG devices if it is in MIG mode;
        health comes from ``findings``."""
        nvml = self._nvml
        gpus: list[Gpu] = []
        for index in range(self.count):
            handle = self._identify(index)
            try:
                if handle is None:
                    raise _Unsupported("no handle")
                name = _text(nvml.nvmlDeviceGetName(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
            except (nvml.NVMLError, _Unsupported) as exc:
                self._warn_once(("inventory", index), "GPU identity unreadable", index, exc)
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
        if "utilization" in self._skip[index]:
            return None
        try:
            busy = int(_function(self._nvml, "nvmlDeviceGetUtilizationRates")(handle).gpu)
        except self._unsupported:
            self._skip[index].add("utilization")
            return None
        except self._error as exc:
            self._warn_once(("utilization", index), "GPU utilization unreadable", index, exc)
            return None
        return float(min(100, max(0, (busy + 5) // 10 * 10)))

    def _mig_devices(self, index: int, handle: Any, model: str) -> list[Gpu] | None:
        """The MIG devices of a GPU in MIG mode, None if it is not in MIG mode (or NVML or
        the binding cannot tell: then it is used whole)."""
        nvml = self._nvml
        if "mig" in self._skip[index]:
            return None
        try:
            current = _function(nvml, "nvmlDeviceGetMigMode")(handle)[0]
            if int(current) != int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)):
                return None
            slots = int(_function(nvml, "nvmlDeviceGetMaxMigDeviceCount")(handle))
        except self._unsupported:
            self._skip[index].add("mig")
            return None
        except self._error as exc:
            self._warn_once(("mig", index), "GPU MIG mode unreadable", index, exc)
            return None
        devices: list[Gpu] = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except (self._error, AttributeError):
                continue  # an empty slot (NVML_ERROR_NOT_FOUND)
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(mig))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // (1024 * 1024)
                profile = self._mig_profile(mig)
            except (self._error, AttributeError, _Unsupported) as exc:
                self._warn_once(("mig-device", index, slot), "MIG device unreadable", index,
                                exc, slot=slot)
                continue
            devices.append(Gpu(index=mig_index(index, slot), uuid=uuid, model=model,
                               memory_mib=memory, profile=profile, parent=index))
        return devices

    def _mig_profile(self, mig: Any) -> str:
        """The MIG device's profile (e.g. 1g.10gb) from its name, else from its slice count
        and memory."""
        nvml = self._nvml
        with contextlib.suppress(self._error, AttributeError):
            match = _PROFILE_RE.search(_text(nvml.nvmlDeviceGetName(mig)))
            if match:
                return match.group(1)
        attributes = nvml.nvmlDeviceGetAttributes(mig)
        slices = int(attributes.gpuInstanceSliceCount)
        gigabytes = round(int(attributes.memorySizeMB) / 1024)
        if slices <= 0 or gigabytes <= 0:
            raise _Unsupported("no MIG profile")
        return f"{slices}g.{gigabytes}gb"

    # findings ---------------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        """Xids since the last call (events and kernel log, once per burst), then each GPU's
        current faults and counter rates."""
        now = self.clock()
        reports: list[tuple[float, int | None, int, str]] = []
        while self._queue:
            reports.append(self._queue.popleft())
        for record in self.kernel_log.poll():
            index = self._by_bus.get(record.pci_bus_id)
            if index is None:
                self._warn_once(("bus", record.pci_bus_id), "Xid on a GPU NVML does not list",
                                None, record.message, bus=record.pci_bus_id, xid=record.xid)
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
        for index in range(self.count):
            out.extend(self._poll(index, now))
        return out

    def _poll(self, index: int, now: float) -> list[Finding]:
        out: list[Finding] = []
        handle = self._identify(index)
        if handle is None:
            if isinstance(self._handle_errors.get(index), self._lost):
                return [Finding(h.LOST, index, detail="NVML: GPU is lost")]
            return []
        queries = (self._ecc, self._retired, self._remap, self._reasons, self._thermal,
                   self._pcie, self._recovery)
        for query in queries:
            name = query.__name__
            if name in self._skip[index]:
                continue
            try:
                out.extend(query(index, handle, now))
            except self._lost:
                return [*out, Finding(h.LOST, index, detail="NVML: GPU is lost")]
            except self._unsupported as exc:
                self._skip[index].add(name)
                log.info("NVML query not available", gpu=index, query=name.lstrip("_"),
                         error=str(exc) or type(exc).__name__)
            except self._error as exc:
                self._warn_once(("query", index, name, str(exc)), "NVML query failed", index, exc)
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
        except (AttributeError, _err(nvml, "NVMLError_FunctionNotFound")):
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
            raise self._lost()
        if status in (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                      getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)):
            raise _Unsupported(f"field status {status}")
        if status != getattr(nvml, "NVML_SUCCESS", 0):
            self._warn_once(("recovery", index, status), "NVML field query failed", index, status)
            return []
        kind = int(getattr(value, "valueType", 1))
        action = int(getattr(value.value, _VALUE_FIELDS[kind] if kind < 7 else "uiVal"))
        if action != getattr(nvml, "NVML_GPU_RECOVERY_ACTION_NONE", 0):
            return [Finding(h.RECOVERY_ACTION, index, code=action, detail="driver asks")]
        return []

    def _rate(self, index: int, counter: str, now: float, count: int) -> float | None:
        rate = self._rates.setdefault((index, counter), _Rate(self.rate_span))
        return rate.update(now, count)

    # telemetry --------------------------------------------------------------------------------

    def telemetry(self) -> list[GpuSample]:
        """Each physical GPU's readings (also a GPU in MIG mode, as a whole); see the module
        docstring. Never raises."""
        return [self._sample(index, self._identify(index)) for index in range(self.count)]

    def _sample(self, index: int, handle: Any) -> GpuSample:
        nvml = self._nvml
        uuid = self._uuids.get(index, f"unknown-{index}")
        xids = self._xid_count.get(index, 0), self._last_xid.get(index)
        if handle is None:
            return GpuSample(index, uuid, "unknown", xid_count=xids[0], last_xid=xids[1])
        if index not in self._models:
            with contextlib.suppress(self._error, AttributeError, UnicodeDecodeError):
                self._models[index] = _text(nvml.nvmlDeviceGetName(handle))
        memory = self._read(index, "memory", lambda: _used_free_mib(
            nvml.nvmlDeviceGetMemoryInfo(handle)))
        return GpuSample(
            index, uuid, self._models.get(index, "unknown"),
            temperature_c=self._read(index, "temperature", lambda: float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_w=self._read(index, "power", lambda: int(
                _function(nvml, "nvmlDeviceGetPowerUsage")(handle)) / 1000),
            utilization_pct=self._read(index, "utilization", lambda: float(
                _function(nvml, "nvmlDeviceGetUtilizationRates")(handle).gpu)),
            memory_used_mib=None if memory is None else memory[0],
            memory_free_mib=None if memory is None else memory[1],
            xid_count=xids[0], last_xid=xids[1])

    def _read(self, index: int, name: str, query: Callable[[], T]) -> T | None:
        """One telemetry reading, contained: None if it fails (a lost GPU, any NVML error);
        a reading the GPU or binding does not support is not asked again."""
        key = f"telemetry:{name}"
        if key in self._skip[index]:
            return None
        try:
            return query()
        except self._lost:
            return None
        except self._unsupported as exc:
            self._skip[index].add(key)
            log.info("GPU reading not available", gpu=index, reading=name,
                     error=str(exc) or type(exc).__name__)
        except (self._error, TypeError, ValueError) as exc:
            self._warn_once(("telemetry", index, name), "GPU reading failed", index, exc)
        return None

    # events -----------------------------------------------------------------------------------

    def _start_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError) as exc:
            log.info("NVML events unavailable, Xids from the kernel log", error=str(exc))
            return
        wanted = nvml.nvmlEventTypeXidCriticalError
        for name in ("nvmlEventTypeDoubleBitEccError", "nvmlEventTypeSingleBitEccError"):
            wanted |= getattr(nvml, name, 0)
        registered = 0
        for index, handle in self._handles.items():
            types = wanted
            with contextlib.suppress(nvml.NVMLError, AttributeError):
                types &= int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            if not types & nvml.nvmlEventTypeXidCriticalError:
                log.info("GPU has no Xid events, Xids from the kernel log", gpu=index)
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, types, self._event_set)
                registered += 1
            except nvml.NVMLError as exc:
                log.info("NVML event registration failed", gpu=index, error=str(exc))
        if not registered:
            self._free_event_set()
            return
        self._thread = threading.Thread(target=self._event_loop, name="hafo-nvml-events",
                                        daemon=True)
        self._thread.start()

    def _event_loop(self) -> None:
        nvml = self._nvml
        xid_type = nvml.nvmlEventTypeXidCriticalError
        dbe_type = getattr(nvml, "nvmlEventTypeDoubleBitEccError", 0)
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, self.event_timeout_ms)
            except self._timeout:
                continue
            except nvml.NVMLError as exc:
                self._warn_once(("event-wait", str(exc)), "NVML event wait failed", None, exc)
                self._stop.wait(self.event_timeout_ms / 1000)
                continue
            index = self._event_gpu(data.device)
            if data.eventType & xid_type:
                self._queue.append((self.clock(), index, int(data.eventData), "NVML event"))
            elif data.eventType & dbe_type:
                log.warning("NVML double-bit ECC event", gpu=index)
            else:
                log.debug("NVML event", gpu=index, type=int(data.eventType))

    def _event_gpu(self, device: Any) -> int | None:
        with contextlib.suppress(self._nvml.NVMLError, AttributeError, TypeError):
            index = self._by_uuid.get(_text(self._nvml.nvmlDeviceGetUUID(device)))
            if index is not None:
                return index
        return self._by_handle.get(_handle_key(device))

    def _free_event_set(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError, AttributeError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None

    # --------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the event thread (within one event wait), close the kernel log, shut NVML down.
        A second call does nothing."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.event_timeout_ms / 1000 + 2)
            if self._thread.is_alive():  # pragma: no cover - a wait NVML did not end
                log.warning("NVML event thread did not stop")
                return
            self._thread = None
        self._closed = True
        self._free_event_set()
        self.kernel_log.close()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def _warn_once(self, key: tuple[Any, ...], message: str, index: int | None,
                   error: object, **fields: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, gpu=index, error=str(error), **fields)


def _err(nvml: Any, name: str) -> type[BaseException]:
    """An NVMLError subclass of the binding, or one never raised if the binding lacks it."""
    cls = getattr(nvml, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else _Missing


def _function(nvml: Any, name: str) -> Any:
    """A function of the binding; ``_Unsupported`` if this binding lacks it."""
    fn = getattr(nvml, name, None)
    if fn is None:
        raise _Unsupported(f"{name} not in this binding")
    return fn


def _used_free_mib(info: Any) -> tuple[float, float]:
    """Framebuffer memory used and free, in whole MiB, from ``nvmlDeviceGetMemoryInfo``."""
    return float(int(info.used) // _MIB), float(int(info.free) // _MIB)


def _handle_key(handle: Any) -> Any:
    """A hashable key for an NVML device handle (a ctypes pointer: its address)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

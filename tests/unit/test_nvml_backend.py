"""The NVML backend against a small fake ``pynvml``: polling, rates, events, debounce, close."""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hafo.gpu.kernel_log import KernelLogReader
from hafo.gpu.nvml import NvmlGpus, NvmlUnavailable
from hafo.model import health as h
from hafo.model.cluster import Gpu
from hafo.model.health import Finding

pytestmark = pytest.mark.usefixtures("no_thread_leak")


class NVMLError(Exception):
    """pynvml's base error; subclasses below as pynvml generates them."""

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


@dataclass(eq=False)
class FakeMig:
    """One MIG device; also its handle."""

    uuid: str
    name: str
    memory_mib: int


@dataclass(eq=False)
class FakeGpu:
    """One GPU's state; also its handle."""

    uuid: str
    bus: str
    dbe: int = 0
    sbe: int = 0
    retired: int = 0
    remap: tuple[int, int, int, int] = (0, 0, 0, 0)
    reasons: int = 0
    temp: int = 50
    slowdown: int = 90
    replays: int = 0
    recovery: int = 0
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    util: int | None = None           # None: utilization not supported
    mig: dict[int, FakeMig] | None = None  # slot -> device; None: MIG mode off
    mig_slots: int = 7


class FakeNvml:
    """The part of pynvml that ``NvmlGpus`` uses."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Timeout = NVMLError_Timeout
    NVML_SUCCESS = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: int | None = 230
    NVML_GPU_RECOVERY_ACTION_NONE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlClocksEventReasonHwSlowdown = 0x08
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[FakeGpu], *, init_error: Exception | None = None,
                 events: bool = True) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.events_supported = events
        self.calls: collections.Counter[str] = collections.Counter()
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: dict[str, int] = {}
        self.freed = False
        self.shut_down = False

    def _use(self, handle: FakeGpu, fn: str) -> FakeGpu:
        self.calls[fn] += 1
        if handle.lost:
            raise NVMLError_GpuIsLost(15)
        if fn in handle.unsupported:
            raise NVMLError_NotSupported(3)
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMig) -> bytes:
        return handle.uuid.encode()

    def nvmlDeviceGetName(self, handle: FakeGpu | FakeMig) -> str:
        return handle.name if isinstance(handle, FakeMig) else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        mib = handle.memory_mib if isinstance(handle, FakeMig) else 81559
        return SimpleNamespace(total=mib * 1024 * 1024)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        gpu = self._use(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.util is None:
            raise NVMLError_NotSupported(3)
        return SimpleNamespace(gpu=gpu.util, memory=0)

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        gpu = self._use(handle, "nvmlDeviceGetMigMode")
        return [0, 0] if gpu.mig is None else [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        return self._use(handle, "nvmlDeviceGetMaxMigDeviceCount").mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeMig:
        gpu = self._use(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if gpu.mig is None or index not in gpu.mig:
            raise NVMLError_NotFound(6)
        return gpu.mig[index]

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=handle.bus.encode())

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, kind: int, counter: int) -> int:
        gpu = self._use(handle, "nvmlDeviceGetTotalEccErrors")
        assert counter == self.NVML_VOLATILE_ECC
        return gpu.dbe if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else gpu.sbe

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeGpu) -> int:
        return self._use(handle, "nvmlDeviceGetRetiredPagesPendingStatus").retired

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        return self._use(handle, "nvmlDeviceGetRemappedRows").remap

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return self._use(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeGpu, kind: int) -> int:
        assert kind == self.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return self._use(handle, "nvmlDeviceGetTemperatureThreshold").slowdown

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return self._use(handle, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeGpu) -> int:
        return self._use(handle, "nvmlDeviceGetPcieReplayCounter").replays

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, ids: list[int]) -> list[SimpleNamespace]:
        gpu = self._use(handle, "nvmlDeviceGetFieldValues")
        assert ids == [230]
        return [SimpleNamespace(fieldId=230, nvmlReturn=0, valueType=1,
                                value=SimpleNamespace(uiVal=gpu.recovery))]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeGpu) -> int:
        return 0x8 | 0x2  # no single-bit ECC events

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, types: int, event_set: str) -> None:
        if not self.events_supported:
            raise NVMLError_NotSupported(3)
        self.registered[handle.uuid] = types

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        try:
            event: SimpleNamespace = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout(10) from None
        return event

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def xid(self, index: int, xid: int) -> None:
        """Deliver an Xid event for GPU ``index``."""
        self.events.put(SimpleNamespace(device=self.gpus[index], eventType=0x8, eventData=xid,
                                        gpuInstanceId=0, computeInstanceId=0))


class OldNvml(FakeNvml):
    """An old binding: throttle reasons only, no recovery-action field, no MIG, no
    utilization."""

    nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = None
    nvmlDeviceGetMigMode = None  # type: ignore[assignment]
    nvmlDeviceGetUtilizationRates = None  # type: ignore[assignment]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return self._use(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons


def two_gpus() -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa", "00000000:3B:00.0"), FakeGpu("GPU-bbbb", "00000000:B1:00.0")]


class Clock:
    """An injected monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Make = Callable[..., tuple[NvmlGpus, FakeNvml, Clock]]


@pytest.fixture
def make(kmsg: Path) -> Iterator[Make]:
    made: list[NvmlGpus] = []

    def build(fake: FakeNvml | None = None, *, events: bool = True) -> tuple[NvmlGpus, FakeNvml,
                                                                            Clock]:
        fake = fake or FakeNvml(two_gpus())
        clock = Clock()
        gpus = NvmlGpus(fake, KernelLogReader(kmsg), clock, events=events, event_timeout_ms=20)
        made.append(gpus)
        return gpus, fake, clock

    yield build
    for gpus in made:
        gpus.close()


def kinds(findings: list[Finding]) -> list[tuple[str, int | None]]:
    return [(f.kind, f.gpu) for f in findings]


def test_unavailable_when_nvml_cannot_start() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML unavailable"):
        NvmlGpus(FakeNvml([], init_error=NVMLError_LibraryNotFound(12)))
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        NvmlGpus(FakeNvml([]))


def test_unavailable_without_the_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py is not installed"):
        NvmlGpus()


def test_inventory_and_description(make: Make) -> None:
    gpus, _, _ = make()
    assert gpus.inventory() == [
        Gpu(index=0, uuid="GPU-aaaa", model="NVIDIA H100 80GB HBM3", memory_mib=81559),
        Gpu(index=1, uuid="GPU-bbbb", model="NVIDIA H100 80GB HBM3", memory_mib=81559)]
    assert gpus.description == "2 GPU(s) via NVML, driver 550.54.15 (XID events, kernel log)"
    assert gpus.findings() == []  # healthy GPUs yield nothing


@pytest.mark.parametrize(("util", "unsupported", "expected"), [
    pytest.param(None, set(), None, id="not-supported"),
    pytest.param(0, set(), 0.0, id="idle"),
    pytest.param(44, set(), 40.0, id="rounded-down"),
    pytest.param(45, set(), 50.0, id="rounded-half-up"),
    pytest.param(97, set(), 100.0, id="rounded-to-100"),
    pytest.param(70, {"nvmlDeviceGetUtilizationRates"}, None, id="unsupported-query"),
])
def test_inventory_reports_rounded_utilization(make: Make, util: int | None,
                                               unsupported: set[str],
                                               expected: float | None) -> None:
    fake = FakeNvml(two_gpus())
    fake.gpus[0].util, fake.gpus[0].unsupported = util, unsupported
    gpus, _, _ = make(fake)
    assert [g.utilization for g in gpus.inventory()] == [expected, None]
    gpus.inventory()
    if util is None or unsupported:  # not asked again: once per GPU (GPU 1 never has it)
        assert fake.calls["nvmlDeviceGetUtilizationRates"] == 2


def test_mig_gpu_is_listed_as_its_mig_devices(make: Make) -> None:
    fake = FakeNvml(two_gpus())
    fake.gpus[1].mig = {
        0: FakeMig("MIG-1111", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40192),
        2: FakeMig("MIG-2222", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856)}
    fake.gpus[1].util = 30  # the physical GPU's utilization is not used for MIG devices
    gpus, _, _ = make(fake)
    assert gpus.inventory() == [
        Gpu(index=0, uuid="GPU-aaaa", model="NVIDIA H100 80GB HBM3", memory_mib=81559),
        Gpu(index=200, uuid="MIG-1111", model="NVIDIA H100 80GB HBM3", memory_mib=40192,
            profile="3g.40gb", parent=1),
        Gpu(index=202, uuid="MIG-2222", model="NVIDIA H100 80GB HBM3", memory_mib=9856,
            profile="1g.10gb", parent=1)]
    fake.gpus[1].dbe = 1
    assert kinds(gpus.findings()) == [(h.ECC_DBE, 1)]  # findings name the physical GPU


@pytest.mark.parametrize("unsupported", ["nvmlDeviceGetMigMode",
                                         "nvmlDeviceGetMaxMigDeviceCount"])
def test_mig_queries_not_supported_mean_a_whole_gpu(make: Make, unsupported: str) -> None:
    fake = FakeNvml(two_gpus())
    fake.gpus[0].mig = {0: FakeMig("MIG-1111", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856)}
    fake.gpus[0].unsupported = {unsupported}
    gpus, _, _ = make(fake)
    for _ in range(2):
        inventory = gpus.inventory()
        assert [(g.index, g.profile) for g in inventory] == [(0, None), (1, None)]
    assert fake.calls["nvmlDeviceGetMigMode"] == 3  # GPU 0 asked once, GPU 1 each time


def test_old_binding_without_mig_or_utilization(make: Make) -> None:
    fake = OldNvml(two_gpus())
    gpus, _, _ = make(fake)
    assert [(g.index, g.profile, g.utilization) for g in gpus.inventory()] == [
        (0, None, None), (1, None, None)]


@pytest.mark.parametrize(("fault", "expected"), [
    ({"dbe": 2}, Finding(h.ECC_DBE, 1, value=2.0, detail="volatile")),
    ({"retired": 1}, Finding(h.RETIRED_PAGES_PENDING, 1, detail="reset to retire pages")),
    ({"remap": (3, 1, 1, 0)},
     Finding(h.REMAP_PENDING, 1, detail="3 correctable, 1 uncorrectable rows remapped")),
    ({"remap": (0, 9, 0, 1)},
     Finding(h.REMAP_FAILED, 1, detail="0 correctable, 9 uncorrectable rows remapped")),
    ({"reasons": 0x08 | 0x01}, Finding(h.HW_SLOWDOWN, 1, detail="clock event reason")),
    ({"reasons": 0x40}, Finding(h.HW_THERMAL_SLOWDOWN, 1, detail="clock event reason")),
    ({"reasons": 0x80}, Finding(h.HW_POWER_BRAKE, 1, detail="clock event reason")),
    ({"temp": 90}, Finding(h.THERMAL, 1, value=90.0, detail="slowdown at 90 C")),
    ({"recovery": 2}, Finding(h.RECOVERY_ACTION, 1, code=2, detail="driver asks")),
])
def test_polled_findings(make: Make, fault: dict[str, Any], expected: Finding) -> None:
    gpus, fake, _ = make()
    for name, value in fault.items():
        setattr(fake.gpus[1], name, value)
    assert gpus.findings() == [expected]


def test_old_binding_falls_back(make: Make) -> None:
    fake = OldNvml(two_gpus())
    fake.gpus[0].reasons = 0x40
    gpus, _, _ = make(fake)
    assert kinds(gpus.findings()) == [(h.HW_THERMAL_SLOWDOWN, 0)]
    assert fake.calls["nvmlDeviceGetFieldValues"] == 0


def test_rates_from_counter_growth(make: Make) -> None:
    gpus, fake, clock = make()
    gpu = fake.gpus[0]
    gpu.sbe, gpu.replays = 100, 50
    assert gpus.findings() == []                    # the first sample is the baseline
    clock.now += 60
    gpu.sbe, gpu.replays = 110, 170
    found = {f.kind: f.value for f in gpus.findings()}
    assert found == {h.ECC_SBE_RATE: 600.0, h.PCIE_REPLAY: 120.0}   # per hour, per minute
    clock.now += 60
    assert gpus.findings() == []                    # no growth: no finding
    clock.now += 2
    gpu.sbe = 111                                   # one error 2 s after the last poll:
    found = {f.kind: f.value for f in gpus.findings()}  # over the 62 s since a sample >= 60 s old
    assert found == {h.ECC_SBE_RATE: pytest.approx(3600 / 62, abs=0.001)}
    clock.now += 60
    gpu.sbe = 0                                     # driver reloaded: counter reset
    assert gpus.findings() == []


def test_lost_gpu(make: Make) -> None:
    gpus, fake, _ = make()
    fake.gpus[0].lost = True
    fake.gpus[1].dbe = 1
    assert kinds(gpus.findings()) == [(h.LOST, 0), (h.ECC_DBE, 1)]
    # lost mid-poll: the queries after it are not asked this call
    fake.gpus[0].lost = False
    fake.gpus[0].dbe = 4
    fake.gpus[0].unsupported = set()
    before = fake.calls["nvmlDeviceGetRemappedRows"]

    def lose(handle: FakeGpu) -> int:
        if handle is fake.gpus[1]:
            return 0
        handle.lost = True
        raise NVMLError_GpuIsLost(15)

    fake.nvmlDeviceGetRetiredPagesPendingStatus = lose  # type: ignore[method-assign]
    assert kinds(gpus.findings()) == [(h.ECC_DBE, 0), (h.LOST, 0), (h.ECC_DBE, 1)]
    assert fake.calls["nvmlDeviceGetRemappedRows"] == before + 1  # GPU 1 only


def test_not_supported_queries_are_not_retried(make: Make) -> None:
    fake = FakeNvml(two_gpus())
    fake.gpus[0].unsupported = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors",
                                "nvmlDeviceGetFieldValues"}
    fake.gpus[0].dbe = 5
    gpus, _, _ = make(fake)
    for _ in range(3):
        assert gpus.findings() == []
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 1 + 3   # GPU 0 once, GPU 1 every time
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1 + 3 * 2
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 3 * 2


def wait_for_findings(gpus: NvmlGpus) -> list[Finding]:
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        found = gpus.findings()
        if found:
            return found
        time.sleep(0.005)
    return []


def test_event_thread_xids_are_drained(make: Make) -> None:
    gpus, fake, _ = make()
    assert fake.registered == {"GPU-aaaa": 0xA, "GPU-bbbb": 0xA}
    fake.xid(1, 79)
    assert wait_for_findings(gpus) == [Finding(h.XID, 1, code=79, detail="NVML event")]
    assert gpus.findings() == []  # drained


def test_event_and_kernel_log_count_once_per_burst(make: Make, kmsg: Path) -> None:
    gpus, fake, clock = make()
    fake.xid(0, 48)
    assert kinds(wait_for_findings(gpus)) == [(h.XID, 0)]
    with kmsg.open("a") as f:
        f.write("4,7,1,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE detected\n")
        f.write("4,8,2,-;NVRM: Xid (PCI:0000:5e:00): 79, a GPU NVML does not list\n")
    assert gpus.findings() == []  # the same fault, from the kernel log
    clock.now += 10
    with kmsg.open("a") as f:
        f.write("4,9,3,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE detected\n")
    assert gpus.findings() == [Finding(h.XID, 0, code=48, detail="DBE detected")]


def test_without_event_registration_the_kernel_log_still_works(make: Make, kmsg: Path) -> None:
    gpus, _, _ = make(FakeNvml(two_gpus(), events=False))
    assert "no XID events" in gpus.description
    assert not any(t.name == "hafo-nvml-events" for t in threading.enumerate())
    with kmsg.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:b1:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
    assert gpus.findings() == [Finding(h.XID, 1, code=79, detail="GPU has fallen off the bus.")]


def test_close_stops_the_event_thread_promptly(make: Make) -> None:
    gpus, fake, _ = make()
    thread = next(t for t in threading.enumerate() if t.name == "hafo-nvml-events")
    started = time.monotonic()
    gpus.close()
    assert time.monotonic() - started < 0.5
    assert not thread.is_alive()
    assert fake.freed and fake.shut_down
    gpus.close()  # idempotent


def test_fake_matches_the_real_binding() -> None:
    pynvml = pytest.importorskip("pynvml")
    used = [n for n in vars(FakeNvml) if n.startswith(("nvml", "NVML"))]
    used += [n for n in vars(OldNvml) if n.startswith("nvml")]
    assert [n for n in used if not hasattr(pynvml, n)] == []
    assert "gpu" in {name for name, *_ in pynvml.c_nvmlUtilization_t._fields_}
    assert hasattr(pynvml, "NVMLError_NotFound")
    fields = {name for name, *_ in pynvml.c_nvmlEventData_t._fields_}
    assert {"device", "eventType", "eventData"} <= fields
    fields = {name for name, *_ in pynvml.c_nvmlFieldValue_t._fields_}
    assert {"nvmlReturn", "valueType", "value"} <= fields
    assert "busId" in {name for name, *_ in pynvml.nvmlPciInfo_t._fields_}

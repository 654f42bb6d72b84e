"""GPU telemetry for metrics: the NVML backend (against the fake ``pynvml`` of
``test_nvml_backend``, extended with power and memory use) and the simulated backend."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hafo.gpu import GpuSample, NoGpus
from hafo.gpu.kernel_log import KernelLogReader
from hafo.gpu.nvml import NvmlGpus
from hafo.gpu.simulated import SimulatedGpus
from hafo.model import health as h
from tests.unit.test_nvml_backend import (
    FakeGpu,
    FakeMig,
    FakeNvml,
    NVMLError,
    NVMLError_NotSupported,
    OldNvml,
    two_gpus,
)

pytestmark = pytest.mark.usefixtures("no_thread_leak")

H100 = "NVIDIA H100 80GB HBM3"
MIB = 1024 * 1024


class TelemetryNvml(FakeNvml):
    """The fake binding with power draw and framebuffer use; ``failing`` maps a function name
    to the error it raises for GPU 0."""

    def __init__(self, gpus: list[FakeGpu], **kwargs: object) -> None:
        super().__init__(gpus, **kwargs)  # type: ignore[arg-type]
        self.power_mw = [312_456, 95_000]
        self.used_mib = [40_000, 0]
        self.failing: dict[str, Exception] = {}

    def _fail(self, handle: FakeGpu, fn: str) -> None:
        if handle is self.gpus[0] and fn in self.failing:
            raise self.failing[fn]

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        gpu = self._use(handle, "nvmlDeviceGetPowerUsage")
        self._fail(gpu, "nvmlDeviceGetPowerUsage")
        return self.power_mw[self.gpus.index(gpu)]

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        if isinstance(handle, FakeMig):
            return super().nvmlDeviceGetMemoryInfo(handle)
        gpu = self._use(handle, "nvmlDeviceGetMemoryInfo")
        self._fail(gpu, "nvmlDeviceGetMemoryInfo")
        used = self.used_mib[self.gpus.index(gpu)] * MIB
        return SimpleNamespace(total=81559 * MIB, used=used, free=81559 * MIB - used)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._fail(handle, "nvmlDeviceGetTemperature")
        return super().nvmlDeviceGetTemperature(handle, sensor)


def nvml_gpus(fake: FakeNvml, kmsg: Path) -> NvmlGpus:
    return NvmlGpus(fake, KernelLogReader(kmsg), events=False)


def test_nvml_telemetry_reads_every_gpu(kmsg: Path) -> None:
    fake = TelemetryNvml(two_gpus())
    fake.gpus[0].util, fake.gpus[0].temp = 87, 71
    gpus = nvml_gpus(fake, kmsg)
    try:
        assert gpus.telemetry() == [
            GpuSample(0, "GPU-aaaa", H100, temperature_c=71.0, power_w=312.456,
                      utilization_pct=87.0, memory_used_mib=40000.0, memory_free_mib=41559.0),
            GpuSample(1, "GPU-bbbb", H100, temperature_c=50.0, power_w=95.0,
                      utilization_pct=None, memory_used_mib=0.0, memory_free_mib=81559.0)]
    finally:
        gpus.close()


@pytest.mark.parametrize("error", [NVMLError(999), NVMLError_NotSupported(3)],
                         ids=["error", "not-supported"])
def test_nvml_one_failing_reading_leaves_only_that_one_out(kmsg: Path,
                                                           error: Exception) -> None:
    fake = TelemetryNvml(two_gpus())
    fake.failing = {"nvmlDeviceGetPowerUsage": error, "nvmlDeviceGetMemoryInfo": error}
    gpus = nvml_gpus(fake, kmsg)
    try:
        for _ in range(3):
            first, second = gpus.telemetry()
            assert (first.power_w, first.memory_used_mib, first.memory_free_mib) == (
                None, None, None)
            assert first.temperature_c == 50.0
            assert second.power_w == 95.0 and second.memory_used_mib == 0.0
        calls = fake.calls["nvmlDeviceGetPowerUsage"]
        # not supported: GPU 0 asked once, GPU 1 each time; other errors: asked each time
        assert calls == (1 + 3 if isinstance(error, NVMLError_NotSupported) else 3 * 2)
    finally:
        gpus.close()


def test_nvml_lost_gpu_and_old_binding_give_no_readings(kmsg: Path) -> None:
    fake = OldNvml(two_gpus())  # no utilization, no power usage in this "binding"
    fake.gpus[1].lost = True
    gpus = nvml_gpus(fake, kmsg)
    try:
        first, second = gpus.telemetry()
        assert first.temperature_c == 50.0 and first.utilization_pct is None
        assert first.power_w is None
        assert second == GpuSample(1, "GPU-bbbb", H100)
    finally:
        gpus.close()


def test_nvml_counts_xids_once_per_burst(kmsg: Path) -> None:
    gpus = nvml_gpus(TelemetryNvml(two_gpus()), kmsg)
    try:
        with kmsg.open("a") as f:
            f.write("NVRM: Xid (PCI:0000:b1:00): 79, pid=1, GPU has fallen off the bus.\n")
            f.write("NVRM: Xid (PCI:0000:b1:00): 79, pid=1, GPU has fallen off the bus.\n")
        gpus.findings()
        first, second = gpus.telemetry()
        assert (first.xid_count, first.last_xid) == (0, None)
        assert (second.xid_count, second.last_xid) == (1, 79)
    finally:
        gpus.close()


def test_fake_power_usage_matches_the_real_binding() -> None:
    pynvml = pytest.importorskip("pynvml")
    used = [n for n in vars(TelemetryNvml) if n.startswith(("nvml", "NVML"))]
    assert [n for n in used if not hasattr(pynvml, n)] == []
    assert {"used", "free"} <= {name for name, *_ in pynvml.c_nvmlMemory_t._fields_}


def test_simulated_telemetry_is_deterministic_from_utilization() -> None:
    sim = SimulatedGpus("node-a", 2, H100, 81559, utilization={1: 50.0})
    assert sim.telemetry() == [
        GpuSample(0, sim.uuid(0), H100, temperature_c=35.0, power_w=70.0,
                  utilization_pct=0.0, memory_used_mib=0.0, memory_free_mib=81559.0),
        GpuSample(1, sim.uuid(1), H100, temperature_c=55.0, power_w=385.0,
                  utilization_pct=50.0, memory_used_mib=0.0, memory_free_mib=81559.0)]


def test_simulated_mig_gpu_is_sampled_whole() -> None:
    sim = SimulatedGpus("node-a", 1, H100, 81559, mig={0: ("1g.10gb", "1g.10gb")})
    assert [(s.index, s.uuid) for s in sim.telemetry()] == [(0, sim.uuid(0))]


def test_simulated_readings_from_the_faults_file(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    sim = SimulatedGpus("node-a", 4, H100, 81559, str(faults))
    faults.write_text(json.dumps({
        "0": {"temperature": 91, "power": 650.5, "utilization": 100, "memory_used": 80000},
        "1": {"thermal": 88}, "2": {"lost": True}, "3": {"temperature": "hot"}}))
    # thermal and lost are faults; the readings (temperature, power...) are not
    assert sorted((f.kind, f.gpu) for f in sim.findings()) == sorted([(h.THERMAL, 1),
                                                                      (h.LOST, 2)])
    zero, one, two, three = sim.telemetry()
    assert (zero.temperature_c, zero.power_w, zero.utilization_pct, zero.memory_used_mib,
            zero.memory_free_mib) == (91.0, 650.5, 100.0, 80000.0, 1559.0)
    assert one.temperature_c == 88.0  # a thermal fault shows in the temperature
    assert two == GpuSample(2, sim.uuid(2), H100)
    assert three.temperature_c == 35.0  # a bad value is ignored


def test_simulated_readings_are_not_faults(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"0": {"temperature": 91, "utilization": 80}}))
    sim = SimulatedGpus("node-a", 1, H100, 81559, str(faults))
    assert sim.findings() == []
    assert "unknown simulated fault" not in capsys.readouterr().out


def test_simulated_xids_count_each_new_fault(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    sim = SimulatedGpus("node-a", 1, H100, 81559, str(faults))
    for content, count, last in [({"0": {"xid": 79}}, 1, 79), ({"0": {"xid": 79}}, 1, 79),
                                 ({"0": {"xid": 48}}, 2, 48), ({}, 2, 48),
                                 ({"0": {"xid": 48}}, 3, 48)]:
        faults.write_text(json.dumps(content))
        sim.findings()
        (sample,) = sim.telemetry()
        assert (sample.xid_count, sample.last_xid) == (count, last)


def test_no_gpus_have_no_telemetry() -> None:
    assert NoGpus().telemetry() == []

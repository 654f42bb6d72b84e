"""The simulated GPU backend: inventory with utilization and MIG devices, faults by GPU."""

from __future__ import annotations

import json
from pathlib import Path

from hafo.gpu import backend_for
from hafo.gpu.simulated import SimulatedGpus
from hafo.model import health as h
from hafo.model.cluster import Gpu, mig_index
from hafo.model.config import parse_config

H100 = "NVIDIA H100 80GB HBM3"


def test_whole_gpus_with_utilization() -> None:
    sim = SimulatedGpus("node-a", 2, H100, 81559, utilization={1: 50.0})
    assert sim.inventory() == [Gpu(0, sim.uuid(0), H100, 81559),
                               Gpu(1, sim.uuid(1), H100, 81559, utilization=50.0)]


def test_mig_gpu_is_listed_as_its_devices() -> None:
    sim = SimulatedGpus("node-a", 2, H100, 81559, mig={0: ("1g.10gb", "1g.10gb", "3g.40gb")})
    inventory = sim.inventory()
    assert [(g.index, g.profile, g.parent, g.memory_mib) for g in inventory] == [
        (mig_index(0, 0), "1g.10gb", 0, 10240), (mig_index(0, 1), "1g.10gb", 0, 10240),
        (mig_index(0, 2), "3g.40gb", 0, 40960), (1, None, None, 81559)]
    assert [g.index for g in inventory[:3]] == [100, 101, 102]
    uuids = [g.uuid for g in inventory]
    assert all(u.startswith("MIG-") for u in uuids[:3]) and uuids[3].startswith("GPU-")
    assert len(set(uuids)) == 4
    again = SimulatedGpus("node-a", 2, H100, 81559, mig={0: ("1g.10gb", "1g.10gb", "3g.40gb")})
    assert [g.uuid for g in again.inventory()] == uuids  # stable
    other = SimulatedGpus("node-b", 2, H100, 81559, mig={0: ("1g.10gb",)})
    assert other.inventory()[0].uuid not in uuids
    assert "1 in MIG mode" in sim.description


def test_faults_still_name_the_physical_gpu(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"0": {"xid": 48}}))
    sim = SimulatedGpus("node-a", 1, H100, 81559, str(faults), mig={0: ("1g.10gb",)})
    assert [(f.kind, f.gpu) for f in sim.findings()] == [(h.XID, 0)]


def test_backend_for_passes_utilization_and_mig() -> None:
    config = parse_config({"node": {"name": "n", "gpus": {"simulate": {
        "count": 2, "utilization": {"1": 70}, "mig": {"0": ["3g.40gb"]}}}}}, "agent")
    assert config.node is not None
    backend = backend_for(config.node)
    assert [(g.index, g.profile, g.utilization) for g in backend.inventory()] == [
        (100, "3g.40gb", None), (1, None, 70.0)]


def test_gpu_record_round_trips_with_utilization_and_mig() -> None:
    gpus = [Gpu(0, "GPU-0", H100, 81559, utilization=40.0),
            Gpu(mig_index(1, 2), "MIG-1", H100, 10240, profile="1g.10gb", parent=1,
                healthy=False, reason="GPU 1: xid 48")]
    for gpu in gpus:
        assert Gpu.from_dict(gpu.to_dict()) == gpu
    old = {"index": 3, "uuid": "GPU-3", "model": H100, "memory_mib": 81559}
    assert Gpu.from_dict(old) == Gpu(3, "GPU-3", H100, 81559)
    assert (gpus[0].physical, gpus[1].physical, mig_index(1, 2)) == (0, 1, 202)


def test_a_faults_file_of_the_wrong_shape_keeps_the_last_state_and_warns_once(
        tmp_path: Path) -> None:
    """Valid JSON of the wrong shape (a list, a number for an entry) or a half-written file
    must not clear a real fault: the last good content stays, warned about once per
    content, not once per call."""
    from structlog.testing import capture_logs

    path = tmp_path / "faults.json"
    sim = SimulatedGpus("node-a", 2, H100, 81559, faults_file=str(path))
    path.write_text(json.dumps({"0": {"xid": 48}}))
    assert [f.code for f in sim.findings()] == [48]
    with capture_logs() as logs:
        for bad in ('[{"xid": 48}]', '{"0": 48}', '{"zero": {"xid": 1}}', '{"0": {"xid"'):
            path.write_text(bad)
            for _ in range(3):  # findings and telemetry each cycle: one warning per content
                assert [f.code for f in sim.findings()] == [48], bad
                sim.telemetry()
    refused = [e for e in logs if e["event"].startswith("faults file refused")]
    assert len(refused) == 4, refused
    assert "list" in refused[0]["error"] and "GPU 0" in refused[1]["error"]
    assert "'zero'" in refused[2]["error"] and "not JSON" in refused[3]["error"]
    path.write_text("{}")  # cleared on purpose
    assert sim.findings() == []
    path.write_text('{"1": {"lost": true}}')
    assert [f.gpu for f in sim.findings()] == [1]
    path.unlink()  # no file: healthy
    assert sim.findings() == []

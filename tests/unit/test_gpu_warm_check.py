"""scripts/gpu_warm_check.py on the CPU (``--device cpu``: gloo, CPU tensors, 2 ranks): every
check runs its real processes (the peer gang, the warm members through a park and a
hand-over, the pre-flight) and passes, and the JSON holds each check's figures; without
CUDA, ``--device cuda`` refuses in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_warm_check.py"
HAS_PREFLIGHT = (ROOT / "hafo" / "agent" / "preflight.py").exists()


def run(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False, cwd=tmp_path)


@pytest.mark.timeout(150)
def test_every_check_passes_on_the_cpu_and_reports_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run(["--device", "cpu", "--mib", "8", "--json", str(out)], tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["passed"] is True
    checks = report["checks"]
    assert list(checks) == ["env", "pcie", "tiers", "warm", "preflight"]
    for name, check in checks.items():
        expected = "PASS" if name != "preflight" or HAS_PREFLIGHT else "SKIP"
        assert check["status"] == expected, (name, check["reason"])
        assert f"{expected} {name} (" in done.stdout

    assert checks["env"]["figures"]["gloo"] is True
    assert checks["pcie"]["figures"]["host_copy_gbps"] > 0
    tiers = checks["tiers"]["figures"]
    assert tiers["bytes"] >= 8 * 2**20
    for key in ("floor_s", "snapshot_s", "snapshot_vs_floor", "background_call_s",
                "restore_s", "peer_restore_s"):
        assert tiers[key] > 0, key
    assert (tiers["restore_tier"], tiers["peer_source"]) == ("own", "node0")
    assert [(r["tier"], r["step"]) for r in tiers["peer"]] == [("own", 2), ("peer", 2)]
    warm = checks["warm"]["figures"]
    assert (warm["world"], warm["backend"]) == (2, "gloo")
    assert 0 < warm["park_s"] < 10 and 0 < warm["rejoin_s"] < 90
    assert len(warm["park_s_per_rank"]) == len(warm["rejoin_s_per_rank"]) == 2
    if HAS_PREFLIGHT:
        preflight = checks["preflight"]["figures"]
        assert (preflight["world"], preflight["backend"]) == (2, "gloo")
        assert preflight["large_bandwidth_gbps"] > 0 and preflight["small_latency_s"] > 0
    # nothing left behind: the temp dirs are removed when every check passed
    assert not list(tmp_path.glob("hafo-gpucheck-*"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_the_cuda_run_says_why_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run(["--json", str(out)], tmp_path, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], done.stderr
    assert json.loads(out.read_text())["exit"] == 2

"""The snapshot-cost benchmark (benchmarks/snapshot_cost.py) in its CI size: it runs a real
gang of two tiered checkpointers (rank 1 in its own process), DCP async_save and the baseline
loop, and reports every mode it could run, with the peer copies made and the disk tier
committed. No timing is asserted beyond a sanity bound: this machine's load decides those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "snapshot_cost.py"
MODES = ("none", "tiers", "dcp-async", "dcp-async-shm")


def test_quick_run_measures_every_mode_and_the_tiers_copy_to_the_peer(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "HAFO_BENCH_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=120, check=False,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    modes, skipped = report["modes"], report["skipped"]
    # every mode ran, or says why it could not (DCP's modes need torch.distributed, the shm
    # one /dev/shm); the baseline and the tiers always run
    assert {"none", "tiers"} <= set(modes), skipped
    for name in MODES:
        assert name in modes or skipped.get(name), f"{name}: neither measured nor skipped"
        if name in modes:
            row = modes[name]
            assert row["checkpoints"] == (0 if name == "none" else 6)
            assert row["steps"] == 8  # two blocks of 3 checkpointed steps and a tail step
            assert all(0 < t < 30 for t in row["step_times_s"]), row["step_times_s"]
    tiers = modes["tiers"]
    assert tiers["stats"]["peer_copies"] > 0
    assert tiers["stats"]["peer_failures"] == 0
    assert tiers["stats"]["memory_failures"] == 0
    assert tiers["rank1_stats"]["peer_copies"] > 0  # and rank 1's copies reached rank 0
    assert tiers["own_newest_step"] == tiers["peer_copy_newest_step"] == tiers["snapshots_taken"]
    assert tiers["durable_steps_kept"], "the disk tier committed no checkpoint"
    assert "goal" in report and "pass" in report["goal"]
    assert "goal: tiers overhead" in done.stdout
    # rank 1 exited by itself once told to, and every temp dir is gone
    assert tiers["rank1_returncode"] == 0
    assert report["config"]["temp_dirs"]
    assert not [d for d in report["config"]["temp_dirs"] if Path(d).exists()]

"""`hafo demo`, as a newcomer runs it: exits 0, shows the failover, and tells the truth.

Run three times; each time the summary's "resumed from" and "lost" must be what the
workload's own progress log says (its ``start`` record in the new epoch, its last step in the
old one), not what a read taken too early would say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)
RUNS = 3
EVERY = 10  # the demo workload's checkpoint interval


def own_log(base: Path, wid: str) -> list[dict[str, Any]]:
    """The workload's progress log, read here without hafo's helpers."""
    path = base / "checkpoints" / wid / "progress.jsonl"
    out = []
    for raw in path.read_text().splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue  # a line cut by the power loss
    return out


def grab(pattern: str, out: str) -> tuple[str, ...]:
    """The groups of ``pattern`` in the demo's output (which must hold it)."""
    found = re.search(pattern, out)
    assert found, f"{pattern!r} not in the demo's output:\n{out}"
    return found.groups()


def check_one_run(out: str) -> None:
    base = Path(grab(r"\(in (\S+)\)", out)[0])
    try:
        wid = grab(r"submitted (\S+):", out)[0]
        was_at = int(grab(r"lost power \(workload was at step (\d+)\)", out)[0])
        _, epoch, step = grab(r"running again on (\S+) \(epoch (\d+)\), resumed from "
                              r"checkpoint step (\d+)", out)
        new_epoch, resumed_from = int(epoch), int(step)
        lost = int(grab(r"; (\d+) step\(s\) lost", out)[0])

        lines = own_log(base, wid)
        starts = [ln for ln in lines if ln["epoch"] == new_epoch and ln["event"] == "start"]
        assert starts, f"the workload never started in epoch {new_epoch}"
        old_epoch = max(ln["epoch"] for ln in lines if ln["epoch"] < new_epoch)
        old_steps = [ln["step"] for ln in lines if ln["epoch"] == old_epoch and "step" in ln]
        assert resumed_from == starts[0]["resumed_from"], (resumed_from, starts[0])
        assert was_at == max(old_steps), (was_at, max(old_steps))
        assert lost == max(old_steps) - starts[0]["resumed_from"]
        # the demo cuts the power after checkpoint 30 and resumes from the last checkpoint
        assert resumed_from >= 30 and resumed_from % EVERY == 0, resumed_from
        assert 0 <= lost < 2 * EVERY, lost
        print(f"demo: at step {was_at}, resumed from {resumed_from}, {lost} lost: as its log says")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("run", range(1, RUNS + 1))
def test_demo_fails_a_workload_over_and_tells_the_truth(run: int) -> None:
    result = subprocess.run([sys.executable, "-m", "hafo", "demo", "--keep"],
                            capture_output=True, text=True, timeout=110)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "power loss" in out and "running again on" in out
    assert "never two copies at once" in out
    assert "unknown" not in out, out
    assert "cleaned up: all processes stopped" in out
    recovered = float(out.split("recovered in ")[1].split("s")[0])
    assert recovered < 3 + 2.0
    check_one_run(out)

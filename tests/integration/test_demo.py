"""`hafo demo`, as a newcomer runs it: exits 0 and shows the failover."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_demo_fails_a_workload_over_and_cleans_up() -> None:
    result = subprocess.run([sys.executable, "-m", "hafo", "demo"], capture_output=True,
                            text=True, timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "power loss" in out and "running again on" in out
    assert "never two copies at once" in out
    assert "cleaned up: all processes stopped" in out
    recovered = float(out.split("recovered in ")[1].split("s")[0])
    assert recovered < 3 + 2.0

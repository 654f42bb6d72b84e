"""``make test`` stopped from outside (SIGTERM from a CI timeout) tears down what it started.

The lanes runner (``scripts/test_lanes.py``) runs one cluster test of the integration lane;
once that test's etcd, controllers and agents run, the runner gets SIGTERM. It must exit
143, and no process it or its tests started may be left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hafo.agent.procid import start_time
from hafo.local.procs import descendants

pytestmark = pytest.mark.timeout(150)
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_stopped_by_sigterm_leaves_no_process(tmp_path: Path) -> None:
    env = {**os.environ, "HAFO_TEST_LANES": "integration", "HAFO_TEST_WORKERS": "1",
           "HAFO_TEST_LANES_DIR": str(tmp_path / "lanes")}
    env.pop("PYTEST_XDIST_WORKER", None)
    runner = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "test_lanes.py"), "-k", "test_placement"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[int, int | None] = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until the test's cluster runs
            pids = descendants(runner.pid)
            seen.update({pid: start_time(pid) for pid in pids if pid not in seen})
            commands = " ".join(Path(f"/proc/{p}/cmdline").read_text(errors="replace")
                                for p in pids if Path(f"/proc/{p}/cmdline").exists())
            if "etcd" in commands and "agent" in commands:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the test's cluster never started")
        time.sleep(2)
        seen.update({pid: start_time(pid) for pid in descendants(runner.pid) if pid not in seen})
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=100)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 128 + signal.SIGTERM, out
    assert "stopping every lane" in out, out
    left = [pid for pid, started in seen.items()
            if started is not None and start_time(pid) == started]
    assert not left, f"left running: {left}\n{out}"

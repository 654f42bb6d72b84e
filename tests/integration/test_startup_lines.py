"""``hafo controller`` run as a process logs one start-up line once it listens, with its API
and dashboard address; the API is on 127.0.0.1 (tests listen on loopback only), so no warning.
The warning for an open API is decided by ``hafo.model.exposure`` (tests/unit/
test_startup_lines.py, which also drives the daemons' logging of it with a non-loopback
address, without opening a socket there)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hafo import __version__
from hafo.local.procs import free_port, pid_alive

pytestmark = pytest.mark.timeout(60)


def read_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        with_brace = raw[raw.find("{"):] if "{" in raw else ""
        try:
            out.append(json.loads(with_brace))
        except ValueError:
            continue
    return out


def test_controller_logs_its_api_and_dashboard_once(tmp_path: Path) -> None:
    port = free_port()
    dead_etcd = free_port()  # nothing listens: the controller serves its API regardless
    config = tmp_path / "controller.yaml"
    config.write_text(f"""cluster: startup-test
etcd:
  endpoints: ["http://127.0.0.1:{dead_etcd}"]
api:
  listen: "127.0.0.1:{port}"
controller:
  name: ctl-start
log:
  format: json
""")
    log = tmp_path / "controller.log"
    env = {**os.environ, "HAFO_LOG_LEVEL": "info"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hafo", "controller", "--config",
                                 str(config)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        serving: list[dict[str, Any]] = []
        while not serving:
            assert proc.poll() is None, f"controller exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no start-up line: {log.read_text()[-2000:]}"
            time.sleep(0.1)
            serving = [e for e in read_lines(log) if "serving API" in str(e.get("event"))]
        time.sleep(1.0)  # it would have said more by now
        lines = read_lines(log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert not pid_alive(proc.pid)
    url = f"http://127.0.0.1:{port}"
    (line,) = [e for e in lines if "serving API" in str(e.get("event"))]
    assert line["event"] == "serving API" and line["role"] == "controller"
    assert line["api"] == url and line["dashboard"] == f"{url}/"
    assert line["version"] == __version__ and line["level"] == "info"
    assert line["controller"] == "ctl-start"
    assert not [e for e in lines if "api.token_file" in str(e.get("event"))]

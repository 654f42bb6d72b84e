"""Machine tests: hafo deployed by Ansible over SSH onto three systemd machines (nspawn).

They need root, ``systemd-nspawn``, ``debootstrap`` (only until the image is cached),
``nsenter``, ``ip``, ``ssh`` and overlayfs; ``make test-deps`` installs the packages. Where
the machine cannot run them they are skipped with one line saying why, unless
``HAFO_REQUIRE_MACHINES=1`` (CI) makes that a failure. ``HAFO_SKIP_MACHINES=1`` skips them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.cluster import DeployedCluster
from tests.hosts.image import image_dir

HERE = Path(__file__).parent


def why_not() -> str | None:
    """Why this machine cannot run the machine tests (None: it can)."""
    if os.environ.get("HAFO_SKIP_MACHINES") == "1":
        return "HAFO_SKIP_MACHINES=1"
    if os.geteuid() != 0:
        return "not root (systemd-nspawn, bridges and overlays need root)"
    tools = ["systemd-nspawn", "nsenter", "ip", "ssh", "ssh-keygen", "mount"]
    if not (image_dir() / ".complete").exists():
        tools.append("debootstrap")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (make test-deps installs them)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = why_not()
    if reason is None:
        return
    mine = [item for item in items if Path(str(item.fspath)).is_relative_to(HERE)]
    if not mine:
        return
    if os.environ.get("HAFO_REQUIRE_MACHINES") == "1":
        raise pytest.UsageError(f"machine tests required (HAFO_REQUIRE_MACHINES=1) but "
                                f"cannot run: {reason}")
    marker = pytest.mark.skip(reason=f"machine tests skipped: {reason}")
    for item in mine:
        item.add_marker(marker)


@pytest.fixture(scope="package")
def cluster() -> Iterator[DeployedCluster]:
    """Three machines with hafo deployed by site.yml (run once here), removed after this
    package's last test (not at the end of the session: the other tests need the CPUs)."""
    run_dir = Path(tempfile.mkdtemp(prefix="hafo-hosts-", dir="/var/tmp"))
    started = time.monotonic()
    deployed = DeployedCluster.create(run_dir, say=lambda line: print(f"[hosts] {line}"))
    deployed.record("set-up (image cached, boot, wheels, site.yml)", time.monotonic() - started)
    try:
        yield deployed
    finally:
        deployed.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        MEASURED.update(deployed.timings)


#: What the machine tests measured, printed at the end of the run (README's figures).
MEASURED: dict[str, list[float]] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not MEASURED:
        return
    terminalreporter.section("measured on three systemd machines (tests/hosts)")
    for what, values in MEASURED.items():
        ordered = sorted(values)
        median = ordered[len(ordered) // 2]
        figures = ", ".join(f"{v:.2f}" for v in values)
        terminalreporter.write_line(f"{what}: p50 {median:.2f} max {ordered[-1]:.2f} "
                                    f"(n={len(values)}: {figures})")


@pytest.fixture
def lab_cluster(cluster: DeployedCluster) -> Iterator[DeployedCluster]:
    """The deployed cluster for one test: afterwards every machine is powered on and ready,
    the test's workloads are deleted and stopped, and no two copies of any workload ever
    ran at once."""
    yield cluster
    try:
        for machine in cluster.lab.machines.values():
            if not machine.running:
                machine.boot()
        status, workloads = cluster.request("GET", "/v1/workloads")
        for workload in workloads if status == 200 else []:
            cluster.delete(str(workload["id"]))
        cluster.watcher.wait(lambda: not any(not i.ended for i in
                                             cluster.watcher.instances.values()),
                             30, "every workload to stop")
        cluster.wait_ready(list(cluster.lab.machines))
    finally:
        assert not cluster.watcher.overlaps, cluster.watcher.overlaps

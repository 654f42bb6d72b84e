"""Fixtures that start real etcd servers and real local clusters, and always clean up by pid."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hafo.local.cluster import LocalCluster
from hafo.local.etcd import EtcdCluster
from hafo.local.procs import pid_alive
from hafo.logs import configure
from hafo.store import EtcdStore, Keys


def _running_etcd(base: Path, size: int) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(base, size=size)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One single-member etcd for the whole session; tests isolate by cluster name."""
    yield from _running_etcd(tmp_path_factory.mktemp("etcd"), 1)


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster of this test alone (members may be killed)."""
    yield from _running_etcd(tmp_path / "etcd3", 3)


@pytest.fixture
def keys() -> Keys:
    """A cluster name no other test uses."""
    return Keys(f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def store(etcd_server: EtcdCluster) -> AsyncIterator[EtcdStore]:
    """A store client on the session etcd."""
    client = EtcdStore(etcd_server.endpoints)
    try:
        yield client
    finally:
        await client.close()


class ClusterFactory:
    """Starts local clusters and guarantees they are stopped, leaving no process behind."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.clusters: list[LocalCluster] = []

    async def start(self, **kwargs: object) -> LocalCluster:
        cluster = LocalCluster(base_dir=self.base / f"c{len(self.clusters)}", **kwargs)  # type: ignore[arg-type]
        self.clusters.append(cluster)
        cluster.start()
        await cluster.wait_ready(45)
        return cluster

    async def close(self) -> None:
        leftovers: list[int] = []
        keep = os.environ.get("HAFO_TEST_KEEP_LOGS")  # a directory: each cluster's logs go there
        for index, cluster in enumerate(self.clusters):
            if keep:
                shutil.copytree(cluster.base / "logs", Path(keep) / f"c{index}",
                                dirs_exist_ok=True)
                for member in cluster.etcd.members:  # etcd's own logs beside the daemons'
                    if member.log_path.exists():
                        shutil.copy(member.log_path, Path(keep) / f"c{index}")
            await cluster.close_store()
            all_pids = [p for n in cluster.node_handles for p in cluster.node_pids(n)]
            cluster.stop()
            leftovers += [p for p in all_pids if pid_alive(p)] + cluster.leftover_pids()
        assert not leftovers, f"processes left running: {leftovers}"


@pytest.fixture
async def local_cluster(tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """Factory for local clusters (etcd, controllers, agents) torn down after the test."""
    factory = ClusterFactory(tmp_path)
    try:
        yield factory
    finally:
        await factory.close()


# The modules whose assertions are about time (failover and detection figures, fencing before
# a lease expires, an agent back within its lease, false positives under stalls and chaos):
# the ``timing`` lane runs them one at a time, with their generous bounds (tests/README.md).
# Every other integration test times nothing and runs on several workers.
TIMING_MODULES = frozenset({
    "test_chaos", "test_clock_step", "test_etcd_restart", "test_etcd_stall", "test_failover",
    "test_gang_hang", "test_guard", "test_metrics", "test_node_identity", "test_services",
    "test_warm_guard", "test_gang_preflight", "test_fast_profile",
})


# The modules that run torch gangs (several torch processes each, CPU-bound): one worker runs
# them one after the other (xdist group ``torch-gangs``), so that on 2 cores two gangs do not
# starve each other (their steps then took seconds; measured: three gang tests timed out).
TORCH_GANG_MODULES = frozenset({"test_ddp_example", "test_gangs", "test_gang_sharded",
                                "test_gang_hang", "test_gang_tiers",
                                "test_snapshot_cost_bench", "test_warm_gang",
                                "test_gang_preflight", "test_preflight_program"})


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of module scope defined in its own module (a cluster
    its module's tests share)."""
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(getattr(item, "module", None), "__name__", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        for definition in definitions:
            if (definition.scope == "module"
                    and getattr(definition.func, "__module__", None) == module):
                return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration tests carry the 'slow' marker, and the timing modules' the 'timing' one.
    The tests of a module that share a module-scoped fixture (a cluster) form one xdist group:
    with ``--dist loadgroup`` they run on one worker, which starts that cluster once."""
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.slow)
            stem = Path(str(item.fspath)).stem
            if stem in TIMING_MODULES:
                item.add_marker(pytest.mark.timing)
            if stem in TORCH_GANG_MODULES:
                item.add_marker(pytest.mark.xdist_group("torch-gangs"))
            elif shares_a_module_fixture(item):
                item.add_marker(pytest.mark.xdist_group(stem))


os.environ.setdefault("PYTHONUNBUFFERED", "1")
configure("console", level="warning")

"""etcd loses its data: stopped, its data directory gone, started again empty (issue 28,
finding 2). Before, running work was killed within half a second, and the controller led on
a frozen view, reporting the old workloads running with ``stale: false``.

Now every daemon finds the store not to be the cluster it knew: the work runs on under the
failsafe rules (its processes untouched), the controllers are not ready, say why, decide
nothing and answer ``stale``; ``hafo status`` says so in one line, exit 3. ``hafo restore``
of a backup taken before is the operator's way back: the workloads run again (new epochs,
never two copies), uncounted.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from hafo.local.cluster import LocalCluster, lose_etcd_data
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, view
from .test_etcd_restart import five_workloads, get_json


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI against the cluster's etcd."""
    return subprocess.run([sys.executable, "-m", "hafo", *args, "--etcd",
                           ",".join(cluster.etcd.endpoints), "--cluster", cluster.cluster],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(240)
async def test_etcd_restarted_empty_keeps_work_then_a_restore_brings_the_cluster_back(
        local_cluster: ClusterFactory, tmp_path: object) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2, etcd_members=1,
                                        failsafe_max=60)
    wids, before = await five_workloads(cluster)
    backup = cluster.base / "backup.json"
    done = hafo(cluster, "backup", str(backup))
    assert done.returncode == 0 and "keys at revision" in done.stdout, done.stderr
    await lose_etcd_data(cluster)
    lost_at = time.monotonic()

    # The work runs on; the controllers say why they decide nothing.
    await asyncio.sleep(8.0)
    dead = [w for w, (_n, _e, process) in before.items() if not process.alive()]
    assert not dead, f"killed after etcd lost its data: {dead}"
    for ctl in cluster.controller_handles.values():
        code, ready, _ = await asyncio.to_thread(
            get_json, f"http://127.0.0.1:{ctl.api_port}/readyz")
        assert code == 503 and "not the cluster" in ready["error"], ready
        _, status, _ = await asyncio.to_thread(
            get_json, f"http://127.0.0.1:{ctl.api_port}/v1/status")
        assert status["stale"] is True, status
    said = hafo(cluster, "status")
    assert said.returncode == 3 and said.stdout == "", said
    assert len(said.stderr.strip().splitlines()) == 1
    assert "not the cluster" in said.stderr
    assert (await cluster.wait_for(lambda s: True, 5)).workloads == {}, "nothing placed"

    # The operator's way back: the backup put into the empty store.
    done = hafo(cluster, "restore", str(backup))
    assert done.returncode == 0 and "keys restored" in done.stdout, done.stderr
    again = hafo(cluster, "restore", str(backup))
    assert again.returncode == 5 and "--replace" in again.stderr, "refused over keys"
    snapshot = await cluster.wait_for(
        # New epochs of another history, past every old one (the generation's epoch base):
        # the old instances were fenced; the ones running now are the restored store's.
        lambda s: all(running(w)(s) and not before[w][2].alive() for w in wids), 60,
        what="every workload running again from the restored store")
    for wid in wids:
        assert view(snapshot, wid)["epoch"] > before[wid][1], \
            f"{wid}: epochs (so checkpoints) never go backwards across a restore"
    print(f"every workload running again {time.monotonic() - lost_at:.1f}s after etcd lost "
          "its data")
    for wid in wids:
        assert view(snapshot, wid)["restarts"] == 0, "infrastructure: not counted"
        assert_never_two_copies(cluster, wid)
    kinds = [e.kind for e in await read_events(cluster.store, cluster.keys, 300)]
    assert "store-untrusted" in kinds and "store-trusted" in kinds, kinds
    assert hafo(cluster, "status").returncode == 0


@pytest.mark.timeout(60)
async def test_a_backup_that_is_not_one_is_one_line(local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=1, controllers=1, etcd_members=1)
    bad = cluster.base / "bad.json"
    bad.write_text('{"format": "hafo-backup/1", "cluster": "x", "revision": -1, "keys": {}}')
    done = hafo(cluster, "restore", str(bad))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "revision" in done.stderr
    assert hafo(cluster, "restore").returncode == 2

"""Queues on one live local cluster (real etcd, a controller, an agent): ``hafo queue set``,
``hafo queues``, the API's PUT/GET/DELETE, a submit to an undeclared queue refused, a queue in
use not deleted, and a queue-only re-submit that restarts nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from tests.integration.conftest import ClusterFactory
from tests.integration.helpers import api_call, api_until

pytestmark = pytest.mark.timeout(90)


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints),
           "HAFO_CLUSTER": cluster.cluster}
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True,
                          text=True, env=env, timeout=30)


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return api_call(port, method, path, body)


until = api_until


async def test_queues_from_the_cli_and_the_api(local_cluster: ClusterFactory,
                                               tmp_path: Path) -> None:
    cluster = await local_cluster.start(nodes=1, controllers=1, gpus_per_node=2)
    await cluster.close_store()
    port = next(iter(cluster.controller_handles.values())).api_port

    # hafo queue set, and its one-line refusal of a bad flag
    done = hafo(cluster, "queue", "set", "team-a", "--gpus", "2")
    assert (done.returncode, done.stdout) == (0, "created queue team-a (2 GPU(s))\n"), done
    bad = hafo(cluster, "queue", "set", "team-a", "--gpus", "2", "--lending-limit", "1")
    assert bad.returncode == 2 and bad.stderr.startswith("hafo queue set: --lending-limit: ")

    # the API: PUT (the path names it), GET one and all
    code, body = call(port, "PUT", "/v1/queues/team-b", {"gpus": 1, "cohort": "research"})
    assert (code, body["change"]) == (201, "created"), body
    code, body = call(port, "PUT", "/v1/queues/team-b", {"name": "other", "gpus": 1})
    assert (code, body["field"]) == (400, "queue.name")
    until(port, "/v1/queues/team-b", lambda q: q["cohort"] == "research")
    listed = hafo(cluster, "queues", "--json")
    assert [q["name"] for q in json.loads(listed.stdout)] == ["team-a", "team-b"], listed

    # a submit naming an undeclared queue (or none: 'default' is not declared) is refused
    for queue in ("nope", None):
        raw = demo_workload_spec(name="queued", interval=0.02, every=5)
        spec_file = tmp_path / f"spec-{queue}.json"  # JSON is YAML
        spec_file.write_text(json.dumps(raw if queue is None else {**raw, "queue": queue}))
        refused = hafo(cluster, "submit", str(spec_file))
        assert refused.returncode == 2 and "spec.queue: no queue" in refused.stderr, refused
        assert "team-a, team-b" in refused.stderr
    code, body = call(port, "POST", "/v1/workloads",
                      {**demo_workload_spec(name="queued", interval=0.02, every=5),
                       "queue": "nope"})
    assert (code, body["field"]) == (409, "spec.queue")

    # a workload in team-a: the queue cannot be deleted while it is there
    spec = {**demo_workload_spec(name="queued", interval=0.02, every=5), "queue": "team-a"}
    code, created = call(port, "POST", "/v1/workloads", spec)
    assert code == 201, created
    wid = created["id"]
    running = until(port, f"/v1/workloads/{wid}", lambda w: w["state"] == "running")
    deleting = hafo(cluster, "queue", "delete", "team-a")
    assert deleting.returncode == 5 and wid in deleting.stderr, deleting
    code, body = call(port, "DELETE", "/v1/queues/team-a")
    assert code == 409 and "1 workload(s)" in body["error"]
    shown = hafo(cluster, "queues", "team-a")
    assert shown.returncode == 0 and wid in shown.stdout, shown
    table = hafo(cluster, "queues").stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "GPUS"] and table[1].split()[-1] == "1", table

    # only its queue changed: it runs on, in the same epoch
    code, body = call(port, "POST", "/v1/workloads", {**spec, "queue": "team-b"})
    assert (code, body["change"]) == (200, "updated") and "nothing restarts" in body["how"]
    until(port, "/v1/queues/team-b", lambda q: q["workloads"] == [wid])
    now = until(port, f"/v1/workloads/{wid}", lambda w: w["state"] == "running")
    assert now["epoch"] == running["epoch"]

    # team-a is free now; deleting it twice: 200, then 404 (and 4 from the CLI)
    assert call(port, "DELETE", "/v1/queues/team-a") == (200, {"name": "team-a",
                                                              "deleted": True})
    assert call(port, "DELETE", "/v1/queues/team-a")[0] == 404
    assert hafo(cluster, "queue", "delete", "team-a").returncode == 4
    until(port, "/v1/queues", lambda qs: [q["name"] for q in qs] == ["team-b"])
    assert call(port, "DELETE", f"/v1/workloads/{wid}")[0] == 200

"""The HTTP API's mutations against a live local cluster whose controllers need a token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from tests.integration.helpers import api_call, api_until, started_cluster

pytestmark = pytest.mark.timeout(150)
TOKEN = "integration-token-0123456789"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from started_cluster(tmp_path_factory.mktemp("apiw"), nodes=2, controllers=2,
                               api_token=TOKEN)


def call(port: int, method: str, path: str, body: Any = None,
         token: str | None = TOKEN) -> tuple[int, Any]:
    return api_call(port, method, path, body, token)


until = api_until


def spec(name: str) -> dict[str, Any]:
    return demo_workload_spec(name=name, gpus=1, interval=0.02, every=5)


def any_port(cluster: LocalCluster) -> int:
    return next(iter(cluster.controller_handles.values())).api_port


def test_submit_needs_the_token_and_a_valid_body(cluster: LocalCluster) -> None:
    port = any_port(cluster)
    assert call(port, "POST", "/v1/workloads", spec("anon"), token=None)[0] == 401
    assert call(port, "POST", "/v1/workloads", spec("anon"), token="x" * 20)[0] == 401
    code, body = call(port, "POST", "/v1/workloads", {"name": "bad", "command": []})
    assert (code, body["field"]) == (400, "spec.command")
    code, body = call(port, "POST", "/v1/workloads", {**spec("bad"), "stop_grace": "soon"})
    assert (code, body["field"]) == (400, "spec.stop_grace")
    names = [w["name"] for w in call(port, "GET", "/v1/workloads")[1]]
    assert "anon" not in names and "bad" not in names  # refused input leaves no trace


def test_submit_migrate_delete_over_http(cluster: LocalCluster) -> None:
    ports = [h.api_port for h in cluster.controller_handles.values()]
    code, created = call(ports[0], "POST", "/v1/workloads", spec("http-job"))
    assert code == 201, created
    wid = created["id"]
    assert created["state"] == "pending" and wid.startswith("http-job-")
    # Every controller (standby included) sees it running.
    running = {p: until(p, f"/v1/workloads/{wid}", lambda w: w["state"] == "running")
               for p in ports}
    first = running[ports[0]]["node"]
    other = next(n for n in cluster.node_handles if n != first)
    code, body = call(ports[1], "POST", f"/v1/workloads/{wid}/migrate", {"to": first})
    assert code == 409 and "already runs" in body["error"]
    code, body = call(ports[1], "POST", f"/v1/workloads/{wid}/migrate", {"to": "no-such"})
    assert code == 404
    code, body = call(ports[1], "POST", f"/v1/workloads/{wid}/migrate", {"to": other})
    assert (code, body) == (202, {"id": wid, "to": other})
    moved = until(ports[0], f"/v1/workloads/{wid}",
                  lambda w: w["state"] == "running" and w["node"] == other, timeout=30)
    assert moved["epoch"] > running[ports[0]]["epoch"]
    code, body = call(ports[0], "DELETE", f"/v1/workloads/{wid}")
    assert (code, body) == (200, {"id": wid, "deleted": True})
    assert call(ports[0], "DELETE", f"/v1/workloads/{wid}")[0] == 404
    until(ports[0], "/v1/workloads", lambda ws: wid not in [w["id"] for w in ws])
    code, body = call(ports[0], "POST", f"/v1/workloads/{wid}/migrate")
    assert code == 404


def test_drain_and_uncordon_over_http(cluster: LocalCluster) -> None:
    port = any_port(cluster)
    code, created = call(port, "POST", "/v1/workloads", spec("drain-job"))
    assert code == 201
    wid = created["id"]
    node = until(port, f"/v1/workloads/{wid}", lambda w: w["state"] == "running")["node"]
    assert call(port, "POST", f"/v1/nodes/{node}/drain", token=None)[0] == 401
    code, body = call(port, "POST", f"/v1/nodes/{node}/drain")
    assert code == 200 and body["cordoned"] and wid in body["moving"]
    until(port, f"/v1/nodes/{node}", lambda n: n["state"] == "cordoned")
    until(port, f"/v1/workloads/{wid}",
          lambda w: w["state"] == "running" and w["node"] != node, timeout=30)
    code, body = call(port, "POST", f"/v1/nodes/{node}/uncordon")
    assert (code, body) == (200, {"node": node, "cordoned": False})
    until(port, f"/v1/nodes/{node}", lambda n: n["state"] == "ready")
    assert call(port, "POST", "/v1/nodes/no-such-node/drain")[0] == 404
    assert call(port, "DELETE", f"/v1/workloads/{wid}")[0] == 200


def test_metrics_and_openapi_are_served(cluster: LocalCluster) -> None:
    port = any_port(cluster)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    code, document = call(port, "GET", "/openapi.json")
    assert code == 200 and document["openapi"].startswith("3.")
    assert "/v1/workloads/{id}/migrate" in document["paths"]
    node = cluster.node_handles["node-1"]
    with urllib.request.urlopen(f"http://127.0.0.1:{node.api_port}/metrics", timeout=5) as r:
        assert r.status == 200


def test_cli_watch_streams_json_until_interrupted(cluster: LocalCluster) -> None:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints)}
    proc = subprocess.Popen([sys.executable, "-m", "hafo", "status", "--json", "--watch", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        # Two documents first: a SIGINT before the watch began is an ordinary Ctrl-C (130),
        # and a Python start-up on a busy machine can take longer than any fixed sleep.
        first = [proc.stdout.readline(), proc.stdout.readline()]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        out = "".join(first) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) >= 2 and all(d["nodes"]["ready"] == 2 for d in docs)

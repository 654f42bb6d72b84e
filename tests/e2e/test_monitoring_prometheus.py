"""A real Prometheus (Debian's ``prometheus`` package) scrapes a local cluster (etcd, a
controller, 3 agents): the controller statically, the agents found through the controller's
``GET /v1/sd/agents``, with the shipped alerting rules. A node loses power and the node-down
alert for that node fires, read from Prometheus' own ``/api/v1/alerts``; it was not firing
before, and it fires for no other node. Every PromQL expression of the Grafana dashboard is
parsed and run by that Prometheus.

The copy of the rules the test loads is the shipped file with ``HafoNodeDown``'s ``for:``
(1m) cut to 5 s, so the test takes seconds; the shipped ``for:`` is what promtool's unit tests
(tests/e2e/test_monitoring_rules.py) check. prometheus missing: skipped with one line, unless
``HAFO_REQUIRE_TOOLS=1``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from hafo.local.cluster import LocalCluster
from hafo.local.procs import free_port, spawn, stop_process

from .test_monitoring_rules import RULES, dashboard_targets, runnable, tool

pytestmark = pytest.mark.timeout(180)

NODE_DOWN_FOR = "5s"


def get(port: int, path: str, **query: str) -> Any:
    """The ``data`` of a Prometheus API answer (asserting its status is success)."""
    url = f"http://127.0.0.1:{port}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400/422: a query Prometheus rejects
        body = json.loads(exc.read())
    assert body["status"] == "success", f"{path} {query}: {body}"
    return body["data"]


async def until(what: str, check: Any, timeout: float) -> Any:
    """Poll ``check`` (a callable returning a truthy result) every 0.25 s until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except OSError:  # Prometheus not listening yet
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.25)


def rules_copy(path: Path) -> Path:
    """The shipped rules with HafoNodeDown's ``for:`` cut to NODE_DOWN_FOR (and nothing else
    changed)."""
    data = yaml.safe_load(RULES.read_text())
    rule = next(r for g in data["groups"] for r in g["rules"] if r.get("alert") == "HafoNodeDown")
    assert rule["for"] == "1m"
    rule["for"] = NODE_DOWN_FOR
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def config(path: Path, rules: Path, controller_port: int) -> Path:
    """A prometheus.yml like the shipped example, for this cluster, every second."""
    path.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "hafo-controller",
             "static_configs": [{"targets": [f"127.0.0.1:{controller_port}"]}]},
            {"job_name": "hafo-agent", "http_sd_configs": [{
                "url": f"http://127.0.0.1:{controller_port}/v1/sd/agents",
                "refresh_interval": "1s"}]}]}))
    return path


def node_down_alerts(port: int) -> list[dict[str, Any]]:
    """The HafoNodeDown alerts, pending or firing."""
    return [a for a in get(port, "/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "HafoNodeDown"]


async def test_node_down_alert_fires_in_a_real_prometheus(
        local_cluster: Any, tmp_path: Path) -> None:
    prometheus = tool("prometheus")  # before a cluster starts: skip or fail at once
    cluster: LocalCluster = await local_cluster.start(nodes=3, controllers=1)
    controller = next(iter(cluster.controller_handles.values()))
    port = free_port()
    conf = config(tmp_path / "prometheus.yml", rules_copy(tmp_path / "hafo-alerts.yml"),
                  controller.api_port)
    proc = spawn([prometheus, f"--config.file={conf}",
                  f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{port}"], tmp_path / "prometheus.log")
    try:
        nodes = sorted(cluster.node_handles)

        def targets_up() -> bool:
            active = get(port, "/api/v1/targets", state="active")["activeTargets"]
            agents = {t["labels"].get("hafo_node") for t in active
                      if t["labels"]["job"] == "hafo-agent" and t["health"] == "up"}
            ctl = [t for t in active if t["labels"]["job"] == "hafo-controller"
                   and t["health"] == "up"]
            return agents == set(nodes) and len(ctl) == 1

        await until("every target up", targets_up, 45)

        def ready_seen() -> bool:
            found = get(port, "/api/v1/query", query='hafo_node_state{state="ready"} == 1')
            return {s["metric"]["node"] for s in found["result"]} == set(nodes)

        await until("the controller's node states in Prometheus", ready_seen, 30)
        leader = get(port, "/api/v1/query", query="sum(hafo_leader)")["result"]
        assert float(leader[0]["value"][1]) == 1

        def evaluated_after(moment: float) -> bool:
            groups = get(port, "/api/v1/rules")["groups"]
            group = next(g for g in groups if g["name"] == "hafo-cluster")
            # RFC 3339 with nanoseconds: cut to microseconds for Python
            stamp = re.sub(r"(\.\d{6})\d*", r"\1", group["lastEvaluation"]).replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp() > moment + 1

        since = time.time()
        await until("a rule evaluation with the data", lambda: evaluated_after(since), 10)
        assert node_down_alerts(port) == [], "node-down alert before any node went down"

        victim = nodes[1]
        cut = time.monotonic()
        cluster.power_off(victim)

        def firing() -> list[dict[str, Any]]:
            return [a for a in node_down_alerts(port) if a["state"] == "firing"]

        fired = await until(f"HafoNodeDown firing for {victim}", firing, 60)
        took = time.monotonic() - cut
        assert [a["labels"]["node"] for a in fired] == [victim]
        alert = fired[0]
        assert alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["summary"] == f"hafo node {victim} is down"
        # lease TTL 3 s + a scrape + the 5 s `for:` + an evaluation, at least 5 s
        print(f"HafoNodeDown firing for {victim} {took:.1f}s after the power cut")
        assert took >= 5
        # the powered-off agent stays a target (its node record outlives it): up == 0
        down = get(port, "/api/v1/query", query=f'up{{job="hafo-agent",hafo_node="{victim}"}}')
        assert [float(s["value"][1]) for s in down["result"]] == [0.0]
        others = get(port, "/api/v1/query",
                     query='max by (node) (hafo_node_state{state="down"}) == 1')["result"]
        assert [s["metric"]["node"] for s in others] == [victim]

        # every dashboard expression parses and runs (a typo fails here)
        for title, expr in dashboard_targets():
            assert get(port, "/api/v1/query", query=runnable(expr))["resultType"], title
        # and the GPU telemetry the dashboard shows is there, under the DCGM names
        temps = get(port, "/api/v1/query", query="DCGM_FI_DEV_GPU_TEMP")["result"]
        assert {s["metric"]["Hostname"] for s in temps} <= set(nodes)
        assert len(temps) >= 4 * (len(nodes) - 1)
    finally:
        stop_process(proc)
        assert proc.poll() is not None
    log = (tmp_path / "prometheus.log").read_text()
    assert not re.search(r"level=error.*(rule|config)", log), log[-3000:]

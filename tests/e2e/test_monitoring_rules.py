"""The shipped monitoring (``monitoring/``) checked with Prometheus' own ``promtool`` (Debian's
``prometheus`` package): the alerting rules and the example config are valid, the rules' unit
tests pass, and they exercise every alert's ``for:`` (with every ``for:`` cut to 0 each alert
fails its test). Every metric name the rules, their tests and the Grafana dashboard use is one
that a real controller or agent exports, so they cannot drift apart; the dashboard JSON has the
structure Grafana needs (monitoring/README.md says what is and is not validated).

The dashboard also type-checks against Grafana's own published dashboard types
(``@grafana/schema`` from npm, compiled by TypeScript; installed once into ~/.cache).

A tool missing (promtool; node and npm for the type check): the test skips with one line,
unless ``HAFO_REQUIRE_TOOLS=1`` (CI), which makes that a failure.
``scripts/install-test-deps.sh`` installs promtool.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client.metrics_core import Metric

from hafo.agent.daemon import Agent
from hafo.controller.daemon import Controller
from hafo.model.config import parse_config

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
RULES = MONITORING / "prometheus" / "hafo-alerts.yml"
RULE_TESTS = sorted((MONITORING / "prometheus" / "tests").glob("*.yml"))
CONFIG = MONITORING / "prometheus" / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "hafo-dashboard.json"

#: Series Prometheus makes itself, not hafo
PROMETHEUS_SERIES = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds"}
#: The dashboard's variables, and what stands for each in a query Prometheus parses
VARIABLES = {"$__rate_interval": "1m", "$node": ".*", "${datasource}": ""}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset",
                "bool", "and", "or", "unless", "inf", "nan", "Inf", "NaN"}


def tool(name: str, package: str = "Debian's prometheus; scripts/install-test-deps.sh") -> str:
    """The path of a tool; skips (or fails under HAFO_REQUIRE_TOOLS=1) when it is missing."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK)
                                   else None)
    if found is None:
        why = f"{name} is not installed ({package})"
        if os.environ.get("HAFO_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{why}, and HAFO_REQUIRE_TOOLS=1")
        pytest.skip(why)
    return found


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool (bounded); its output in the result."""
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, check=False)


def load_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every rule of the rules file."""
    data = yaml.safe_load(path.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    """The shipped dashboard."""
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_targets(board: dict[str, Any] | None = None) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel."""
    for panel in (board or dashboard())["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def runnable(expr: str) -> str:
    """A dashboard expression with its Grafana variables replaced by values Prometheus
    accepts; an unknown ``$variable`` is left for the parser to reject."""
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not in a label
    matcher, a range, a grouping clause or a string, not a function or an aggregation (an
    identifier followed by ``(``), and not a keyword."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    found = set()
    for match in re.finditer(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call is None and name not in PROMQL_WORDS:
            found.add(name)
    return found


@pytest.mark.parametrize(("expr", "names"), [
    ('max by (node) (hafo_node_state{state="down"}) == 1', {"hafo_node_state"}),
    ("absent(hafo_leader == 1)", {"hafo_leader"}),
    ("histogram_quantile(0.99, sum by (job, le) (rate(hafo_x_bucket[5m]))) > 0.5",
     {"hafo_x_bucket"}),
    ("max_over_time(a_total[30m] offset 1h) - min_over_time(a_total[30m])", {"a_total"}),
    ('100 * DCGM_FI_DEV_FB_USED{Hostname=~"$node"} / (b + c)', {"DCGM_FI_DEV_FB_USED", "b", "c"}),
])
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def sample_names(family: Metric) -> set[str]:
    """The sample names Prometheus stores for a family (those of a labelled family that has
    no child yet included)."""
    names = {sample.name for sample in family.samples}
    if family.type == "counter":
        names.add(f"{family.name}_total")
    elif family.type == "histogram":
        names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
    elif family.type == "summary":
        names |= {family.name, f"{family.name}_sum", f"{family.name}_count"}
    else:
        names.add(family.name)
    return names


async def exported(tmp_path: Path) -> set[str]:
    """Every sample name a real controller's and a real agent's ``/metrics`` can show (their
    registries, built without etcd)."""
    controller = Controller(parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                                          "controller": {"name": "ctl-1"}}, "controller"))
    agent = Agent(parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                                "checkpoint": {"root": str(tmp_path / "ck")},
                                "node": {"name": "node-a", "state_dir": str(tmp_path / "state"),
                                         "gpus": {"simulate": {"count": 1}}}}, "agent"))
    try:
        names: set[str] = set()
        for registry in (controller.registry, agent.registry):
            for family in registry.collect():
                names |= sample_names(family)
        return names
    finally:
        await controller.store.close()
        await agent.close()


def input_series_names(paths: Iterable[Path]) -> set[str]:
    """The metric names of the promtool tests' input series."""
    names = set()
    for path in paths:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test["input_series"]:
                names.add(re.match(r"[A-Za-z_:][\w:]*", series["series"]).group(0))  # type: ignore[union-attr]
    return names


def test_the_rules_and_the_example_config_are_valid() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = load_rules()
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout
    config = promtool("check", "config", str(CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr
    # the alerts the issue asks for, each with a `for:`, a severity and annotations that
    # name what it is about
    names = {rule["alert"] for rule in rules}
    assert {"HafoNodeDown", "HafoGpuUnhealthy", "HafoWorkloadFailed", "HafoWorkloadFlapping",
            "HafoNoLeader", "HafoEtcdErrors", "HafoFailsafeActive",
            "HafoCheckpointStale", "HafoQueueStarved"} <= names
    for rule in rules:
        assert rule.get("for"), f"{rule['alert']}: no for:"
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"].keys() == {"summary", "description"}, rule["alert"]
    about = {"HafoNodeDown": "$labels.node", "HafoGpuUnhealthy": "$labels.UUID",
             "HafoWorkloadFailed": "$labels.workload", "HafoCheckpointStale": "$labels.workload",
             "HafoQueueStarved": "$labels.queue"}
    for alert, label in about.items():
        rule = next(r for r in rules if r["alert"] == alert)
        assert label in rule["annotations"]["summary"], alert


def test_the_rules_unit_tests_pass() -> None:
    assert len(RULE_TESTS) >= 3
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_the_unit_tests_cover_every_alert_and_its_for(tmp_path: Path) -> None:
    """Each alert is tested, and with every ``for:`` cut to 0 s each alert fails a test: the
    tests check that no alert fires before its ``for:`` has passed."""
    alerts = {rule["alert"] for rule in load_rules()}
    tested = {case["alertname"] for path in RULE_TESTS
              for test in yaml.safe_load(path.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    assert tested == alerts
    (tmp_path / "tests").mkdir()
    text = re.sub(r"(?m)^(\s+for: ).*$", r"\g<1>0s", RULES.read_text())
    assert text != RULES.read_text()
    (tmp_path / RULES.name).write_text(text)
    for path in RULE_TESTS:
        shutil.copy(path, tmp_path / "tests" / path.name)
    result = promtool("test", "rules", *(str(tmp_path / "tests" / p.name) for p in RULE_TESTS))
    assert result.returncode != 0
    failed = set(re.findall(r"alertname: (\w+), time:", result.stdout + result.stderr))
    assert failed == alerts, f"no test catches a missing for: on {sorted(alerts - failed)}"


async def test_every_metric_used_is_exported(tmp_path: Path) -> None:
    names = await exported(tmp_path)
    assert {"hafo_node_state", "hafo_workload_state", "hafo_workload_restarts_total",
            "hafo_failsafe_active", "hafo_workload_checkpoint_age_seconds",
            "hafo_detection_seconds_bucket", "DCGM_FI_DEV_GPU_UTIL", "hafo_queue_gpus",
            "hafo_queue_pending_seconds"} <= names
    known = names | PROMETHEUS_SERIES
    used: dict[str, set[str]] = {}
    for rule in load_rules():
        used[f"rule {rule['alert']}"] = metric_names(rule["expr"])
    for title, expr in dashboard_targets():
        used.setdefault(f"panel {title!r}", set()).update(metric_names(expr))
    used["the promtool tests' input series"] = input_series_names(RULE_TESTS)
    unknown = {where: sorted(found - known) for where, found in used.items() if found - known}
    assert not unknown, f"metric names hafo does not export: {unknown}"
    assert all(used.values()), [where for where, found in used.items() if not found]


#: The part of Grafana's dashboard model this dashboard uses (Grafana's own schema is not
#: available as JSON schema from the registries reachable here: monitoring/README.md)
DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {"type": "object", "required": ["list"], "properties": {"list": {
            "type": "array", "items": {"type": "object", "required": ["name", "type"],
                                       "properties": {"type": {"enum": ["datasource",
                                                                        "query"]}}}}}},
        "panels": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/panel"}},
    },
    "$defs": {
        "gridPos": {"type": "object", "required": ["h", "w", "x", "y"], "properties": {
            "h": {"type": "integer", "minimum": 1}, "w": {"type": "integer", "minimum": 1,
                                                          "maximum": 24},
            "x": {"type": "integer", "minimum": 0, "maximum": 23},
            "y": {"type": "integer", "minimum": 0}}},
        "datasource": {"type": "object", "required": ["type", "uid"], "properties": {
            "type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}}},
        "panel": {"type": "object", "required": ["type", "id", "title", "gridPos"],
                  "properties": {"id": {"type": "integer"}, "title": {"type": "string",
                                                                       "minLength": 1},
                                 "gridPos": {"$ref": "#/$defs/gridPos"}},
                  "if": {"properties": {"type": {"const": "row"}}},
                  "then": {"required": ["panels", "collapsed"]},
                  "else": {
                      "required": ["datasource", "targets", "fieldConfig", "options"],
                      "properties": {
                          "type": {"enum": ["timeseries", "stat", "table", "heatmap"]},
                          "datasource": {"$ref": "#/$defs/datasource"},
                          "targets": {"type": "array", "minItems": 1, "items": {
                              "type": "object", "required": ["refId", "expr", "datasource"],
                              "properties": {"expr": {"type": "string", "minLength": 1},
                                             "datasource": {"$ref": "#/$defs/datasource"}}}}}}},
    },
}


def test_the_dashboard_structure() -> None:
    board = dashboard()
    jsonschema.validate(board, DASHBOARD_SCHEMA)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(set(refs)) == len(refs), panel["title"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == ["Cluster", "Nodes and GPUs", "Failover latency", "Control plane and etcd",
                    "Queues"]
    kinds = {p["type"] for p in panels}
    assert "heatmap" in kinds
    defined = {f"${v['name']}" for v in board["templating"]["list"]}
    for title, expr in dashboard_targets(board):
        for variable in re.findall(r"\$\{?\w+\}?", expr):
            assert variable in defined | {"$__rate_interval"}, f"{title}: {variable}"
        assert "$" not in runnable(expr), title


#: Grafana's published dashboard types (npm, Apache-2.0) and the compiler that checks the JSON
#: against them; pinned, installed once per machine into NPM_CACHE
GRAFANA_SCHEMA = "@grafana/schema@13.2.3"
TYPESCRIPT = "typescript@5.9.3"
NPM_CACHE = Path.home() / ".cache" / "hafo-tests" / "grafana-schema-13.2.3"


@pytest.mark.timeout(300)
def test_the_dashboard_type_checks_against_grafana_schema(tmp_path: Path) -> None:
    """The dashboard JSON as an object literal of ``@grafana/schema``'s ``Dashboard`` type,
    compiled by TypeScript: a field Grafana does not know, or a value of the wrong type, fails
    (the only machine-readable form of Grafana's dashboard schema in the registries here)."""
    npm, node = tool("npm", "Node.js's npm"), tool("node", "Node.js")
    tsc = NPM_CACHE / "node_modules" / "typescript" / "bin" / "tsc"
    types = NPM_CACHE / "node_modules" / "@grafana" / "schema" / "dist" / "types" / "raw" / \
        "dashboard" / "x" / "types.gen"
    if not tsc.exists() or not types.with_suffix(".d.ts").exists():
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        installed = subprocess.run(
            [npm, "install", "--prefix", str(NPM_CACHE), "--no-audit", "--no-fund",
             "--no-save", GRAFANA_SCHEMA, TYPESCRIPT],
            capture_output=True, text=True, timeout=110, check=False)
        assert installed.returncode == 0, installed.stdout + installed.stderr
    # ThresholdsMode is a TypeScript enum: its JSON value "absolute" is the enum's member
    literal = DASHBOARD.read_text().replace('"mode": "absolute"',
                                            '"mode": ThresholdsMode.Absolute')
    source = tmp_path / "dashboard.ts"
    source.write_text(f"import {{ Dashboard, ThresholdsMode }} from {json.dumps(str(types))};\n"
                      f"export const dashboard: Dashboard = {literal};\n")
    checked = subprocess.run([node, str(tsc), "--noEmit", "--strict", "--skipLibCheck",
                              str(source)], capture_output=True, text=True, timeout=110,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the check has teeth: a misspelt panel field fails it
    source.write_text(source.read_text().replace('"gridPos"', '"gridPoz"', 1))
    broken = subprocess.run([node, str(tsc), "--noEmit", "--strict", "--skipLibCheck",
                             str(source)], capture_output=True, text=True, timeout=110,
                            check=False)
    assert broken.returncode != 0 and "gridPoz" in broken.stdout

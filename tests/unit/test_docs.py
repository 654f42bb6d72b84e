"""The documentation in docs/ and README.md against the code: the contract names every CLI
command and flag, every config and spec field, every HTTP route and every metric; relative
links resolve; no file cites the design document that no longer exists."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import hafo.model.config as config_module
import hafo.model.spec as spec_module
from hafo.agent.daemon import Agent
from hafo.api import make_agent_app, make_controller_app
from hafo.cli import build_parser
from hafo.controller.daemon import Controller
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.model.config import parse_config
from hafo.store import Keys

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CONTRACT = DOCS / "contract.md"
RETIRED = "DES" + "IGN.md"  # the retired design document, spelled apart: not cited here
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
             ".ruff_cache", ".pytest_cache", "build", "dist", ".whl", ".schemathesis",
             "schemathesis-report", ".tox"}
SKIP_FILES = {"CHANGELOG.md"}  # history entries may name what existed then


def contract() -> str:
    return CONTRACT.read_text()


def repo_files() -> Iterator[Path]:
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name not in SKIP_FILES:
                yield Path(root) / name


def test_no_file_cites_the_retired_design_document() -> None:
    found = []
    for path in repo_files():
        try:
            if path.stat().st_size > 2_000_000:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary files
        for number, line in enumerate(text.splitlines(), 1):
            if RETIRED in line:
                found.append(f"{path.relative_to(REPO)}:{number}")
    assert not found, f"cite docs/design.md, docs/safety.md or docs/contract.md instead: {found}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("hafo's parser has no subcommands")


def test_every_cli_command_is_in_the_contract() -> None:
    text = contract()
    commands = _subcommands()
    assert len(commands) >= 10
    missing = [name for name in commands if f"`hafo {name}`" not in text]
    assert not missing, f"docs/contract.md lacks the command(s) {missing}"


def test_every_cli_flag_is_in_the_contract() -> None:
    text = contract()
    missing = set()
    for name, sub in _subcommands().items():
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in text:
                    missing.add(f"hafo {name} {option}")
    assert not missing, f"docs/contract.md lacks the flag(s) {sorted(missing)}"


def test_every_config_field_is_in_the_contract() -> None:
    fields = config_module.CONFIG.fields()  # from the config's declaration
    assert {"cluster", "etcd.endpoints", "node.gpus", "health.interval"} <= fields
    text = contract()
    # a key that only holds others (node.gpus.simulate) is documented by theirs
    missing = sorted(f for f in fields if f"`{f}`" not in text and f"`{f}." not in text)
    assert not missing, f"docs/contract.md lacks the config field(s) {missing}"


def test_every_spec_field_is_in_the_contract() -> None:
    fields = spec_module.SPEC.fields()  # from the spec's declaration
    assert {"name", "command", "restart.window", "checkpoint.mode"} <= fields
    text = contract()
    missing = sorted(f for f in fields if f"`{f}`" not in text)
    assert not missing, f"docs/contract.md lacks the spec field(s) {missing}"


def _key_paths(data: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            if key not in ("labels", "actions", "utilization", "mig"):  # free-form keys
                yield from _key_paths(value, path)


@pytest.mark.parametrize("name", ["agent.yaml", "controller.yaml"])
def test_example_config_keys_are_in_the_contract(name: str) -> None:
    import yaml

    raw = yaml.safe_load((REPO / "examples" / name).read_text())
    text = contract()
    missing = [p for p in _key_paths(raw) if f"`{p}`" not in text]
    assert not missing, f"docs/contract.md lacks {missing} (used in examples/{name})"


class _Controller:
    name = "ctl-1"
    keys = Keys("docs")
    store = None

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(1, {}, {}, frozenset(), {}, {}, {})

    def ready(self) -> bool:
        return True

    def stale_seconds(self) -> float | None:
        return None

    def not_ready_reason(self) -> str:
        return ""

    def etcd_contact_age(self) -> float:
        return 0.0

    def leading(self) -> bool:
        return False

    async def recent_events(self, limit: int = 100) -> list[Event]:
        return []

    failsafe_hold = 3.5

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        return "available"


class _Agent:
    name = "node-a"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {}


def _routes(app: Any) -> set[str]:
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        if route.method != "HEAD" and path:
            out.add(f"{route.method} {path}")
    return out


@pytest.mark.parametrize("app", ["controller", "agent"])
def test_every_http_route_is_in_the_contract(app: str) -> None:
    built = (make_controller_app(_Controller()) if app == "controller"  # type: ignore[arg-type]
             else make_agent_app(_Agent()))
    routes = _routes(built)
    assert "GET /healthz" in routes
    text = contract()
    missing = sorted(r for r in routes if f"`{r}`" not in text)
    assert not missing, f"docs/contract.md lacks the {app} route(s) {missing}"


async def test_every_metric_is_in_the_contract(tmp_path: Path) -> None:
    """Every family a real controller's and a real agent's ``/metrics`` export (built
    without etcd; a counter under its ``_total`` name) is in the contract's Metrics
    section."""
    etcd = {"endpoints": ["http://127.0.0.1:1"]}
    controller = Controller(parse_config({"etcd": etcd, "controller": {"name": "ctl-1"}},
                                         "controller"))
    agent = Agent(parse_config({"etcd": etcd, "checkpoint": {"root": str(tmp_path / "ck")},
                                "node": {"name": "node-a", "state_dir": str(tmp_path / "st"),
                                         "gpus": {"simulate": {"count": 1}}}}, "agent"))
    try:
        names = {family.name + ("_total" if family.type == "counter" else "")
                 for registry in (controller.registry, agent.registry)
                 for family in registry.collect()}
    finally:
        await controller.store.close()
        await agent.close()
    text = contract()
    section = text[text.index("\n## Metrics\n"):text.index("\n## Monitoring\n")]
    assert {"hafo_leader", "hafo_queue_gpus", "hafo_queue_pending_seconds",
            "DCGM_FI_DEV_GPU_UTIL"} <= names
    missing = sorted(name for name in names if f"| `{name}` |" not in section)
    assert not missing, f"docs/contract.md's Metrics lacks {missing}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors of a Markdown text."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else HEADING.match(line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(2).strip().lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def test_docs_exist() -> None:
    for name in ("design.md", "safety.md", "contract.md"):
        assert (DOCS / name).is_file(), name


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # links inside code are not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        missing_anchor = (anchor and resolved.suffix == ".md" and resolved.exists()
                          and anchor not in _anchors(resolved.read_text()))
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: broken link(s) {broken}"

"""The reference pages generated from the code (scripts/docs_reference.py) and the MkDocs hook
that adds them to the site (docs/hooks/reference.py): every config and spec field, CLI
command and flag, HTTP route, metric and event kind is on its page; a field without a
docstring fails the generator, naming it; a new field shows up with no other edit."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any

import markdown
import pytest
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from prometheus_client import CollectorRegistry

from hafo.agent.daemon import Agent
from hafo.api import make_agent_app, make_controller_app
from hafo.cli import build_parser
from hafo.controller.daemon import Controller
from hafo.decisions.plan import Cause
from hafo.model.config import CONFIG, Config, parse_config
from hafo.model.ends import InstanceEnd
from hafo.model.queues import QUEUE
from hafo.model.schema import Section
from hafo.model.spec import SPEC
from hafo.store.events import EVENT_KINDS
from scripts import docs_reference as ref

from .memory_controller import MemoryController

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "docs" / "hooks" / "reference.py"


# --- every declared thing is on its page -------------------------------------------------------

def test_every_config_field_is_on_the_config_page() -> None:
    fields = CONFIG.fields()
    assert {d.path for d in ref.field_docs(Config)} == fields  # the walk is the schema's
    page = ref.config_page()
    missing = sorted(f for f in fields if f"| `{f}` |" not in page)
    assert not missing, f"reference/config.md lacks {missing}"
    assert page.startswith("# Config file\n\nGenerated from the code (")


def test_every_spec_and_queue_field_is_on_the_spec_page() -> None:
    page = ref.spec_page()
    spec = page[page.index("## Workload spec"):page.index("## Checks")]
    queue = page[page.index("## Queue declaration"):]
    missing = sorted(f for f in SPEC.fields() if f"| `{f}` |" not in spec)
    missing += sorted(f"queue {f}" for f in QUEUE.fields() if f"| `{f}` |" not in queue)
    assert not missing, f"reference/spec.md lacks {missing}"
    for option in ("url", "expect_status", "stall_after", "max_rss_mib", "failure_threshold"):
        assert f"| `checks[].{option}` |" in page


def _commands(parser: argparse.ArgumentParser, name: str = "hafo") -> list[tuple[str, Any]]:
    out = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child, sub in action.choices.items():
                out += _commands(sub, f"{name} {child}")
    return out


def test_every_cli_command_and_flag_is_on_the_cli_page() -> None:
    page = ref.cli_page()
    sections = dict(re.findall(r"^#+ `(hafo[^`]*)`\n(.*?)(?=^#+ |\Z)", page, re.M | re.S))
    commands = _commands(build_parser())
    assert len(commands) > 30
    missing = []
    for name, parser in commands:
        if name not in sections:
            missing.append(name)
            continue
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" \
                        and not re.search(rf"`[^`]*(?<![\w-]){re.escape(option)}(?![\w-])",
                                          sections[name]):
                    missing.append(f"{name} {option}")
    assert not missing, f"reference/cli.md lacks {missing}"
    codes = page[page.index("## Exit codes"):]
    for code in (0, 1, 2, 3, 4, 5, 6, 130, 141):
        assert f"| `{code}` |" in codes


class _Agent:
    """What the agent's app reads."""

    name = "node-a"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {}


def _routes(app: Any) -> set[str]:
    """``METHOD /path`` of every route the aiohttp app serves (HEAD aside)."""
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        if route.method != "HEAD" and path:
            out.add(f"{route.method} {path}")
    return out


@pytest.mark.parametrize("app", ["controller", "agent"])
def test_every_http_route_is_on_the_api_page(app: str) -> None:
    built = (make_controller_app(MemoryController()) if app == "controller"  # type: ignore[arg-type]
             else make_agent_app(_Agent()))  # type: ignore[arg-type]
    routes = _routes(built)
    assert "GET /healthz" in routes
    page = ref.api_page()
    section = page[page.index(f"## {app.capitalize()} API"):]
    missing = sorted(r for r in routes if f"### {app.capitalize()} `{r}`" not in section)
    assert not missing, f"reference/api.md lacks the {app} route(s) {missing}"


async def test_every_metric_is_on_the_metrics_page(tmp_path: Path) -> None:
    """The families a real controller's and agent's registries export (collected as
    tests/unit/test_docs.py does), each with its type and labels."""
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
    page = ref.metrics_page()  # builds its own daemons (in a thread: a loop runs here)
    missing = sorted(name for name in names if f"| `{name}` |" not in page)
    assert not missing, f"reference/metrics.md lacks {missing}"
    assert "| `hafo_failovers_total` | counter | `cause` |" in page
    assert "| `hafo_queue_gpus` | gauge | `queue`, `kind` |" in page


def test_every_event_kind_and_cause_is_on_the_events_page() -> None:
    page = ref.events_page()
    missing = [kind for kind in EVENT_KINDS if f"| `{kind}` |" not in page]
    missing += [c.value for c in (*Cause, *InstanceEnd) if f"| `{c.value}` |" not in page]
    assert not missing, f"reference/events.md lacks {missing}"


def test_every_page_says_it_is_generated() -> None:
    for uri, page in ref.PAGES.items():
        text = page()
        assert re.match(r"# [^\n]+\n\nGenerated from the code \(", text), uri
        assert text == page(), f"{uri} is not deterministic"


# --- undocumented fields fail; new fields appear --------------------------------------------------

@dataclass(frozen=True)
class _Inner(Section):
    """A nested section."""

    depth: int = 2
    """How deep."""
    width: int = 3


@dataclass(frozen=True)
class _Outer(Section):
    """A root with fields that lack docstrings."""

    name: str = "x"  # a comment is no description
    inner: _Inner = _Inner()
    """The nested section."""
    level: float = 1.0


class _Colour(StrEnum):
    """A test enum."""

    RED = "red"
    """Warm."""
    BLUE = "blue"


def test_a_field_without_a_docstring_fails_naming_every_one() -> None:
    with pytest.raises(ref.UndocumentedError) as caught:
        ref.config_page(_Outer)
    assert caught.value.missing == ["_Inner.width", "_Outer.level", "_Outer.name"]
    assert "_Inner.width, _Outer.level, _Outer.name" in str(caught.value)
    with pytest.raises(ref.UndocumentedError, match=r"_Colour\.BLUE"):
        ref.enum_reference(_Colour)


def _load(path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


MODEL = '''
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from hafo.model.schema import INTEGER, Section


@dataclass(frozen=True)
class Limits(Section):
    """Limits."""

    cpus: Annotated[int, Field(ge=1, le=64), INTEGER] = 4
    """CPUs a workload may use."""
'''
NEW_FIELD = '''    retries: Annotated[int, Field(ge=0), INTEGER] = 5
    """How often a failed probe is tried again | at most."""
'''


def test_a_new_field_appears_with_its_docstring_type_and_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model_before.py").write_text(MODEL)
    (tmp_path / "model_after.py").write_text(MODEL + NEW_FIELD)
    before = _load(tmp_path / "model_before.py", "hafo_docs_model_before", monkeypatch)
    after = _load(tmp_path / "model_after.py", "hafo_docs_model_after", monkeypatch)
    assert "retries" not in ref.fields_reference(before.Limits)
    rows = ref.fields_reference(after.Limits, prefix="limits").splitlines()
    assert "| `limits.cpus` | integer | `4` | 1 to 64 | CPUs a workload may use. |" in rows
    assert ("| `limits.retries` | integer | `5` | >= 0 | How often a failed probe is tried "
            "again \\| at most. |") in rows


@dataclass(frozen=True)
class _Piped(Section):
    """Pipes in cells."""

    mode: str = "a|b"
    """`a|b` in code, and a | outside it, and <html> and *stars*."""


def test_a_pipe_in_a_cell_is_escaped() -> None:
    text = ref.fields_reference(_Piped)
    row = text.splitlines()[-1]
    assert row.endswith("| `a|b` in code, and a \\| outside it, and &lt;html> and \\*stars\\*. |")
    html = markdown.markdown(text, extensions=["tables"])
    cells = re.findall(r"<td>(.*?)</td>", html)
    assert len(cells) == 5, cells
    assert cells[1:] == ["string", "<code>a|b</code>", "",
                         "<code>a|b</code> in code, and a | outside it, and &lt;html&gt; and "
                         "*stars*."]


# --- the MkDocs hook ---------------------------------------------------------------------------

def test_no_generated_page_is_written_by_hand() -> None:
    written = [uri for uri in ref.PAGES if (REPO / "docs" / uri).exists()]
    assert not written, f"generated from the code, delete: {written}"
    assert sorted(ref.PAGES) == sorted(f"reference/{name}.md" for name in (
        "config", "spec", "cli", "api", "metrics", "events"))


def _hook(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _load(HOOK, "hafo_docs_reference_hook", monkeypatch)


def test_the_hook_refuses_a_hand_written_page(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "cli.md").write_text("# by hand\n")
    with pytest.raises(PluginError, match=r"reference/cli\.md"):
        _hook(monkeypatch).on_files(Files([]), {"docs_dir": str(tmp_path)})


def test_the_hook_fails_the_build_on_an_undocumented_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def undocumented() -> str:
        return ref.config_page(_Outer)

    monkeypatch.setitem(ref.PAGES, "reference/config.md", undocumented)
    with pytest.raises(PluginError, match=r"reference/config\.md: undocumented .*_Outer\.name"):
        _hook(monkeypatch).on_files(Files([]), {"docs_dir": str(tmp_path)})


def test_a_site_builds_with_the_generated_pages(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(textwrap.dedent("""\
        # hafo

        See the [config file](reference/config.md), the [spec](reference/spec.md#checks),
        the [CLI](reference/cli.md#exit-codes), the [API](reference/api.md), the
        [metrics](reference/metrics.md) and the [events](reference/events.md).
        """))
    (tmp_path / "mkdocs.yml").write_text(textwrap.dedent(f"""\
        site_name: test
        docs_dir: docs
        site_dir: site
        theme:
          name: material
          font: false
        hooks:
          - {HOOK}
        markdown_extensions:
          - tables
          - attr_list
          - toc:
              permalink: true
        validation:
          omitted_files: warn
          absolute_links: warn
          unrecognized_links: warn
          anchors: warn
        """))
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run([str(mkdocs), "build", "--strict", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    for name in ("config", "spec", "cli", "api", "metrics", "events"):
        html = (tmp_path / "site" / "reference" / name / "index.html").read_text()
        assert "Generated from the code" in html, name
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "<code>node.gpus.simulate.count</code>" in config

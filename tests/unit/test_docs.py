"""The documentation in docs/ and README.md against the code and against itself.

The reference pages generated from the code (docs/reference/config.md, spec.md, cli.md,
api.md, metrics.md, events.md) list every field, flag, route, metric and event kind by
construction; the hand-written pages beside them are checked here: every CLI command is
described on one of them, the example configs use only config fields, every section of the
old single-page contract (docs/contract.md, now a map) leads to a page that exists, every
relative link resolves, and no file cites the design document that no longer exists."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from markdown.extensions.toc import slugify

import hafo.model.config as config_module
from hafo.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
CONTRACT = DOCS / "contract.md"  # the map from the old contract's sections to their pages
SECTIONS = REFERENCE / "sections.json"
#: pages generated from the code when the site is built (docs/hooks/reference.py): links
#: into them are valid whether or not a build has written them
GENERATED = {REFERENCE / name for name in
             ("config.md", "spec.md", "cli.md", "api.md", "metrics.md", "events.md")}
RETIRED = "DES" + "IGN.md"  # the retired design document, spelled apart: not cited here
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
             ".ruff_cache", ".pytest_cache", "build", "dist", ".whl", ".schemathesis",
             "schemathesis-report", ".tox", "site"}
SKIP_FILES = {"CHANGELOG.md"}  # history entries may name what existed then


def repo_files() -> Iterator[Path]:
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name not in SKIP_FILES:
                yield Path(root) / name


def prose_pages() -> list[Path]:
    """The hand-written reference pages (not the generated ones)."""
    return [p for p in sorted(REFERENCE.glob("*.md")) if p not in GENERATED]


def prose() -> str:
    return "\n".join(p.read_text() for p in prose_pages())


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
    assert not found, f"cite docs/design.md, docs/safety.md or docs/reference/ instead: {found}"


def test_no_hand_written_page_takes_a_generated_pages_name() -> None:
    """The generated pages are written at build time; a file of that name in docs/reference/
    would be edited by hand and then overwritten."""
    assert not [p.name for p in GENERATED if p.exists()]


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[str]:
    """Every command and subcommand of ``parser``: ``submit``, ``queue``, ``queue set`` ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + name
                yield from _commands(sub, f"{prefix}{name} ")


def test_every_cli_command_is_described_on_a_reference_page() -> None:
    """cli.md lists every command's flags; what each command does is said by hand, on
    docs/reference/commands.md or the page of its subject."""
    commands = list(_commands(build_parser()))
    assert len(commands) >= 10 and "queue set" in commands
    text = prose()
    missing = [name for name in commands
               if not re.search(rf"`hafo {re.escape(name)}(?![\w-])", text)]
    assert not missing, f"docs/reference/*.md (by hand) lacks the command(s) {missing}"


def _key_paths(data: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            if key not in ("labels", "actions", "utilization", "mig"):  # free-form keys
                yield from _key_paths(value, path)


@pytest.mark.parametrize("name", ["agent.yaml", "controller.yaml"])
def test_example_config_keys_are_config_fields(name: str) -> None:
    """The examples use only fields the config declares (and so the generated config.md
    describes)."""
    import yaml

    raw = yaml.safe_load((REPO / "examples" / name).read_text())
    fields = config_module.CONFIG.fields()
    assert {"cluster", "etcd.endpoints", "node.gpus", "health.interval"} <= fields
    missing = [p for p in _key_paths(raw) if p not in fields]
    assert not missing, f"examples/{name} uses {missing}, which the config does not declare"


def _old_sections() -> dict[str, str]:
    """The moved contract's table: each old section's heading -> the link of its new place
    (relative to docs/)."""
    rows = re.findall(r'^\| <a id="[^"]+"></a>(?:&nbsp;)*(.+?) \| \[[^\]]*\]\(([^)]+)\)',
                      CONTRACT.read_text(), re.MULTILINE)
    return dict(rows)


def test_every_old_contract_section_has_a_new_place() -> None:
    """docs/contract.md maps each of the old contract's sections to its page, and
    docs/reference/sections.json (which rewrites the code's citations) says the same."""
    table = _old_sections()
    assert len(table) >= 36 and "Workload spec" in table and "Team tokens" in table
    mapping = json.loads(SECTIONS.read_text())
    for heading, link in table.items():
        assert mapping.get(heading) == f"docs/{link}", heading
    for heading, target in mapping.items():
        path, _, anchor = target.partition("#")
        assert path.startswith("docs/reference/") and (REPO / path).is_file(), (heading, target)
        assert REPO / path not in GENERATED, (heading, target)
        assert not anchor or anchor in _anchors((REPO / path).read_text()), (heading, target)


def test_the_old_anchors_still_lead_to_the_map() -> None:
    """Links into the old page (docs/contract.md#gangs) keep working: each row carries its
    section's old anchor."""
    text = CONTRACT.read_text()
    for heading in _old_sections():
        assert f'<a id="{_github_slug(heading)}">' in text, heading


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"""<[a-zA-Z][^>]*\s(?:id|name)=["']([^"']+)["']""")


def _github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _mkdocs_slug(heading: str) -> str:
    """The anchor MkDocs' toc extension gives a heading (its text without Markdown)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return str(slugify(text.replace("*", ""), "-"))


def _anchors(markdown: str) -> set[str]:
    """The heading anchors of a Markdown text, as GitHub and as MkDocs make them, and the
    ids of its HTML elements."""
    anchors: set[str] = set(HTML_ID.findall(markdown))
    counts: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else HEADING.match(line)
        if match is None:
            continue
        for slug, sep in ((_github_slug(match.group(2)), "-"),
                          (_mkdocs_slug(match.group(2)), "_")):
            n = counts.get(sep + slug, 0)
            counts[sep + slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}{sep}{n}")
    return anchors


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_docs_exist() -> None:
    for name in ("design.md", "safety.md", "contract.md", "reference/index.md",
                 "reference/commands.md", "reference/config-files.md", "reference/workloads.md",
                 "reference/http.md"):
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
        if resolved in GENERATED:
            continue  # written at build time, with the anchors of what it lists
        missing_anchor = (anchor and resolved.suffix == ".md" and resolved.exists()
                          and anchor not in _anchors(resolved.read_text()))
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: broken link(s) {broken}"

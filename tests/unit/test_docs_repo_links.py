"""The site's hook for included text and links to the repository's code
(docs/hooks/repo_links.py): sections of the README included with their links made relative
to the including page, code links turned into paths (or links to the code host), and a
link to a path that does not exist failing the build."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from mkdocs.exceptions import PluginError

REPO = Path(__file__).resolve().parents[2]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("repo_links", REPO / "docs/hooks/repo_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _hook()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "hafo").mkdir()
    (tmp_path / "hafo" / "guard.py").write_text("")
    (tmp_path / "docs" / "safety.md").write_text("# Safety\n")
    (tmp_path / "README.md").write_text(
        "# x\n<!-- --8<-- [start:part] -->\nSee [safety](docs/safety.md#rules) and "
        "[the\nguard](hafo/guard.py).\n```sh\n[not](a/link.md)\n```\n"
        "<!-- --8<-- [end:part] -->\nrest\n")
    return tmp_path


def test_a_readme_section_is_included_with_its_links_relative_to_the_page(repo: Path) -> None:
    page_dir = repo / "docs" / "guides"
    text = hook.include('before\n--8<-- "README.md:part"\nafter\n', page_dir, repo, "g.md")
    assert text == ("before\nSee [safety](../safety.md#rules) and [the\nguard]"
                    "(../../hafo/guard.py).\n```sh\n[not](a/link.md)\n```\nafter\n")
    whole = hook.include('--8<-- "README.md"\n', repo / "docs", repo, "c.md")
    assert "rest" in whole and "--8<--" not in whole


@pytest.mark.parametrize("line, error", [
    ('--8<-- "NOPE.md"', "includes NOPE.md, which does not exist"),
    ('--8<-- "README.md:other"', "has no one section 'other'"),
])
def test_an_include_of_nothing_fails_the_build(repo: Path, line: str, error: str) -> None:
    with pytest.raises(PluginError, match=error):
        hook.include(line + "\n", repo / "docs", repo, "p.md")


def test_code_links_become_paths_or_links_to_the_code_host(repo: Path) -> None:
    docs, page_dir = repo / "docs", repo / "docs" / "guides"
    text = ("[the guard](../../hafo/guard.py), [`hafo/guard.py`](../../hafo/guard.py), "
            "[safety](../safety.md), [web](https://example.org/x), [here](#top)\n")
    assert hook.rewrite(text, page_dir, docs, repo, None, "g.md") == (
        "the guard (`hafo/guard.py`), `hafo/guard.py`, [safety](../safety.md), "
        "[web](https://example.org/x), [here](#top)\n")
    hosted = hook.rewrite(text, page_dir, docs, repo, "https://code.example/hafo/blob/main/",
                          "g.md")
    assert "[the guard](https://code.example/hafo/blob/main/hafo/guard.py)" in hosted


def test_a_link_to_a_missing_repository_path_fails_the_build(repo: Path) -> None:
    with pytest.raises(PluginError, match=r"g\.md: .*\.\./\.\./hafo/gone\.py"):
        hook.rewrite("[gone](../../hafo/gone.py)\n", repo / "docs" / "guides", repo / "docs",
                     repo, None, "g.md")

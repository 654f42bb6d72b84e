"""MkDocs hook: text included from the repository's files, and links from a docs page to the
repository's code (``../hafo/agent/guard.py``).

- A line ``--8<-- "README.md:architecture"`` is replaced by the lines of ``README.md``
  between ``--8<-- [start:architecture]`` and ``--8<-- [end:architecture]`` (each in an HTML
  comment there), ``--8<-- "CHANGELOG.md"`` by the whole file: one text, in the README and
  on the site. The included links are rewritten to be relative to the including page.
- The docs in ``docs/`` link to the modules, tests and examples they describe, so that the
  same Markdown reads on a code host and here. The site holds only ``docs/``: such a link is
  rewritten to the file on the code host when ``extra.repo_blob`` is set (``…/blob/main``),
  else to the path as code, and a link to a path that does not exist fails the build (as a
  broken link between pages does, under ``--strict``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INCLUDE = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"\s*$')
MARKER = re.compile(r"--8<-- \[(start|end):([\w-]+)\]")


def _segments(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is code, part): fenced code blocks apart from the prose between."""
    parts: list[tuple[bool, str]] = []
    in_code = False
    for line in text.splitlines(keepends=True):
        fence = FENCE.match(line) is not None
        code = in_code or fence
        if parts and parts[-1][0] == code:
            parts[-1] = (code, parts[-1][1] + line)
        else:
            parts.append((code, line))
        if fence:
            in_code = not in_code
    return parts


def _relink(text: str, source_dir: Path, page_dir: Path) -> str:
    """``text``'s relative links (written from ``source_dir``) made relative to ``page_dir``
    (a link's text may run over lines)."""

    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        moved = os.path.relpath(source_dir / path, page_dir)
        return f"[{match.group(1)}]({moved}{'#' + anchor if anchor else ''})"

    return "".join(part if code else LINK.sub(fix, part) for code, part in _segments(text))


def _section(text: str, name: str, where: str) -> str:
    """The lines of ``text`` between its markers of section ``name``."""
    rows = text.splitlines(keepends=True)
    marks = [(i, found.groups()) for i, row in enumerate(rows)
             if (found := MARKER.search(row)) is not None]
    starts = [i for i, kind in marks if kind == ("start", name)]
    ends = [i for i, kind in marks if kind == ("end", name)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise PluginError(f"{where} has no one section {name!r}")
    return "".join(rows[starts[0] + 1:ends[0]])


def include(markdown: str, page_dir: Path, root: Path, where: str) -> str:
    """``markdown`` with its ``--8<--`` lines replaced by what they name (module docstring)."""
    out: list[str] = []
    for line in markdown.splitlines(keepends=True):
        match = INCLUDE.match(line.strip())
        if match is None:
            out.append(line)
            continue
        source = root / match.group(1)
        if not source.is_file():
            raise PluginError(f"{where}: includes {match.group(1)}, which does not exist")
        text = source.read_text()
        name = match.group(2)
        if name is not None:
            text = _section(text, name, f"{where}: {match.group(1)}")
        text = "".join(row for row in text.splitlines(keepends=True)
                       if MARKER.search(row) is None)
        out.append(_relink(text, source.parent, page_dir).rstrip("\n") + "\n")
    return "".join(out)


def _outside(target: str, page_dir: Path, docs_dir: Path, root: Path) -> Path | None:
    """The repository path a relative link leaves ``docs_dir`` for, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.partition("#")[0]
    if not path:
        return None
    resolved = (page_dir / path).resolve()
    if resolved == docs_dir or docs_dir in resolved.parents:
        return None
    if root not in resolved.parents and resolved != root:
        raise PluginError(f"a link leaves the repository: {target}")
    return resolved


def rewrite(markdown: str, page_dir: Path, docs_dir: Path, root: Path,
            blob: str | None, where: str) -> str:
    """``markdown`` with its links to repository files rewritten (module docstring)."""
    missing: list[str] = []

    def fix(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        resolved = _outside(target, page_dir, docs_dir, root)
        if resolved is None:
            return match.group(0)
        relative = resolved.relative_to(root).as_posix()
        if not resolved.exists():
            missing.append(target)
            return match.group(0)
        if blob:
            return f"[{text}]({blob.rstrip('/')}/{relative})"
        bare = text.strip("`")
        return text if bare in (relative, relative.rstrip("/")) or bare.endswith(
            relative) else f"{text} (`{relative}`)"

    out = "".join(part if code else LINK.sub(fix, part) for code, part in _segments(markdown))
    if missing:
        raise PluginError(f"{where}: link(s) to repository paths that do not exist: "
                          + ", ".join(sorted(set(missing))))
    return out


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: rewrite the page's links to repository files."""
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    src = page.file.abs_src_path
    page_dir = Path(src).parent if src else docs_dir / Path(page.file.src_uri).parent
    blob = (config.get("extra") or {}).get("repo_blob")
    page_dir = page_dir.resolve()
    markdown = include(markdown, page_dir, root, page.file.src_uri)
    return rewrite(markdown, page_dir, docs_dir, root, blob, page.file.src_uri)

"""Every file path that hafo's code and docs cite exists: a ``tests/...py`` or ``hafo/...py``
(or a benchmark, script, example, doc, role or alert file) named in hafo/**/*.py, docs/**/*.md,
the README or tests/README.md, as ``path`` or as a link (``../hafo/x.py``). CHANGELOG.md is
history: it names what was, and is not checked."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a path from the repository's root (or a docs/ link up to it, ``../``), never the tail of
#: another path (``/etc/hafo/agent.yaml``)
CITED = re.compile(r"(?:(?<=\.\./)|(?<![\w./-]))((?:hafo|tests|benchmarks|scripts|examples|"
                   r"plugins|docs|ansible|monitoring)/[\w/.-]*\.(?:py|md|ya?ml|toml|j2|sh))")


def citing_files() -> list[Path]:
    return [*sorted(ROOT.glob("hafo/**/*.py")), *sorted(ROOT.glob("docs/**/*.md")),
            ROOT / "README.md", ROOT / "tests" / "README.md"]


def cited(text: str) -> list[tuple[int, str]]:
    """(line, path) of every repository path ``text`` names."""
    return [(number, match.group(1)) for number, line in enumerate(text.splitlines(), 1)
            for match in CITED.finditer(line)]


def test_every_cited_path_exists() -> None:
    missing = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in citing_files()
               for line, name in cited(path.read_text()) if not (ROOT / name).exists()]
    assert not missing, "cited paths that do not exist: " + "; ".join(missing)


def test_the_scan_finds_paths_and_links_but_not_tails() -> None:
    text = ("see tests/unit/test_x.py and [`y`](../hafo/store/y.py)\n"
            "--config /etc/hafo/agent.yaml, hafo.store.client, docs/contract.md#events")
    assert cited(text) == [(1, "tests/unit/test_x.py"), (1, "hafo/store/y.py"),
                           (2, "docs/contract.md")]

"""What the ``ast`` checks of the house rules share (one retry policy, one way to stop on a
signal): a scan of every hafo module but the rule's own helper, grouped by place, and the
places an allow-list does not explain."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path

HAFO = Path(__file__).resolve().parents[2] / "hafo"

#: (enclosing function, line, rule) of each finding in one module's source.
Scan = Callable[[str], list[tuple[str, int, str]]]
#: (path under hafo/, enclosing function, rule) -> the lines found there.
Found = dict[tuple[str, str, str], list[int]]


def name_of(node: ast.AST) -> str:
    """The name an attribute or a name node says (``signal.SIGTERM`` -> ``SIGTERM``)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def scan_hafo(scan: Scan, helper: str) -> Found:
    """Every finding of ``scan`` in hafo/**/*.py except ``helper`` (the rule's own module)."""
    found: Found = {}
    for path in sorted(HAFO.rglob("*.py")):
        relative = path.relative_to(HAFO).as_posix()
        if relative == helper:
            continue
        for where, line, rule in scan(path.read_text()):
            found.setdefault((relative, where, rule), []).append(line)
    return found


def unexplained(found: Found, allowed: Mapping[tuple[str, str, str], str]) -> list[str]:
    """The findings no allow-list entry explains, as ``hafo/PATH:LINE in FUNCTION(): RULE``."""
    return sorted(f"hafo/{path}:{lines[0]} in {where}(): {rule}"
                  for (path, where, rule), lines in found.items()
                  if (path, where, rule) not in allowed)

"""No behaviour keyed on message text: reasons, whys and messages are for people only.

Decisions travel as typed data (``hafo.decisions.plan.Cause``, ``InstanceEnd``, a guard's
``stop_checkpoint``); rewording a message must never change an event, a metric or a status
code. This scans hafo's source for code that reads a message back: ``x in reason``,
``reason.startswith(...)``, ``why.removeprefix(...)``, ``message == "..."``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hafo

MESSAGE_NAMES = {"reason", "why", "message", "unhealthy_reason"}
READING_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix", "find", "index",
                   "partition", "rpartition", "split", "count"}


def _is_message(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in MESSAGE_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in MESSAGE_NAMES
    return False


def readings(tree: ast.AST) -> list[int]:
    """Line numbers where a message is read back to decide something."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn) and _is_message(right):
                    found.append(node.lineno)
                if isinstance(op, ast.Eq | ast.NotEq):
                    sides = (node.left, right)
                    if any(_is_message(s) for s in sides) and any(
                            isinstance(s, ast.Constant) and isinstance(s.value, str) and s.value
                            for s in sides):
                        found.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in READING_METHODS and _is_message(node.func.value)):
            found.append(node.lineno)
    return found


def test_the_scanner_finds_what_it_looks_for() -> None:
    code = ("if 'x' in guard.reason: pass\nwhy.removeprefix('a: ')\n"
            "ok = message == 'done'\nif reason: pass\n")
    assert readings(ast.parse(code)) == [1, 2, 3]


def test_no_module_decides_on_message_text() -> None:
    root = Path(hafo.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for line in readings(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(root.parent)}:{line}")
    assert not offenders, offenders

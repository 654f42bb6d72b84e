"""Static structlog event names: the event of every log call of hafo is a string literal, what
varies goes into key-value fields (docs/design.md, "Rules of the house").

An ``ast`` check over hafo/**/*.py: a call ``<logger>.debug/info/warning/error/exception/
critical(EVENT, ...)`` (or ``getattr(<logger>, level)(EVENT, ...)``) on a structlog logger
(``log``, ``logger``, ``self._log``, ``structlog.get_logger(...)``, ``<logger>.bind(...)``;
not the names a module binds to ``logging.getLogger``, whose %-style messages are static
already) must have a ``str`` constant as its event: not an f-string, a ``+``, a ``%``,
``.format()``, a conditional or a variable.

A few helpers forward their caller's event (a log-once or log-on-change wrapper): each is in
``FORWARDERS``, with the parameter it forwards, and every call of it must pass a literal there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

HAFO = Path(__file__).resolve().parents[2] / "hafo"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
LOGGER = re.compile(r"_?(log|logger)")

#: (path under hafo/, function) -> (the event parameter, its position among the call's
#: arguments (``self`` not counted), where its callers are: a path prefix under hafo/).
FORWARDERS: dict[tuple[str, str], tuple[str, int, str]] = {
    ("gpu/nvml/binding.py", "warn_once"): ("message", 1, "gpu/nvml/"),
    ("lb/haproxy.py", "_say"): ("event", 2, "lb/haproxy.py"),
    ("lb/haproxy.py", "_clear"): ("event", 1, "lb/haproxy.py"),
}


def _stdlib_loggers(tree: ast.Module) -> set[str]:
    """Names the module binds to ``logging.getLogger(...)``."""
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "logging.getLogger"):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_logger(node: ast.AST, stdlib: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return LOGGER.fullmatch(node.id) is not None and node.id not in stdlib
    if isinstance(node, ast.Attribute):
        return LOGGER.fullmatch(node.attr) is not None
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        return func == "structlog.get_logger" or (
            isinstance(node.func, ast.Attribute) and node.func.attr == "bind"
            and _is_logger(node.func.value, stdlib))
    return False


def _log_call(call: ast.Call, stdlib: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr in LEVELS and _is_logger(func.value, stdlib)
    return (isinstance(func, ast.Call) and isinstance(func.func, ast.Name)
            and func.func.id == "getattr" and bool(func.args)
            and _is_logger(func.args[0], stdlib))


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node of ``tree`` -> the name of the function it is in."""
    where: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else name
            where[child] = inner
            visit(child, inner)

    visit(tree, "<module>")
    return where


def scan(source: str, path: str = "") -> list[str]:
    """``line: code`` of every log call in ``source`` whose event is not a literal (a
    forwarder's own call passing its event parameter excepted)."""
    tree = ast.parse(source)
    stdlib = _stdlib_loggers(tree)
    where = _functions(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not _log_call(node, stdlib):
            continue
        event = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "event"), None)
        if _literal(event):
            continue
        forwarded = FORWARDERS.get((path, where.get(node, "")))
        if forwarded and isinstance(event, ast.Name) and event.id == forwarded[0]:
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def _forwarded_events(source: str, path: str) -> list[str]:
    """``line: code`` of every call of a forwarder in ``source`` whose event is not a
    literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else \
            getattr(node.func, "id", "")
        for (_, function), (param, position, scope) in FORWARDERS.items():
            if name != function or not path.startswith(scope):
                continue
            event = node.args[position] if len(node.args) > position else next(
                (k.value for k in node.keywords if k.arg == param), None)
            if not _literal(event):
                found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def sources() -> list[tuple[str, str]]:
    return [(p.relative_to(HAFO).as_posix(), p.read_text()) for p in sorted(HAFO.rglob("*.py"))]


def test_every_log_event_is_a_string_literal() -> None:
    found = [f"hafo/{path}:{line}" for path, source in sources()
             for line in scan(source, path)]
    assert not found, ("log events that are not a string literal: write a fixed event and "
                       "put what varies in fields (log.error(\"state directory not written\", "
                       "what=what)): " + "; ".join(found))


def test_every_forwarded_event_is_a_string_literal() -> None:
    found = [f"hafo/{path}:{line}" for path, source in sources()
             for line in _forwarded_events(source, path)]
    assert not found, "forwarded log events that are not a string literal: " + "; ".join(found)


def test_every_forwarder_still_exists() -> None:
    defined = {(path, node.name) for path, source in sources()
               for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert [key for key in FORWARDERS if key not in defined] == []


def test_the_scan_finds_each_kind_of_dynamic_event() -> None:
    source = '''
import logging, structlog
log = structlog.get_logger("hafo.x")
std = logging.getLogger("hafo.y")
def f(what, why, level, self):
    log.error(f"state directory: {what} not written")
    log.info("cluster condition " + ("set" if why else "cleared"))
    log.warning("%s failed" % what)
    log.debug("{} failed".format(what))
    log.info("written" if why else "replaced")
    log.warning(why)
    self._log.info(why)
    structlog.get_logger("hafo.z").info(why)
    log.bind(node="n").error(why)
    getattr(log, level)(why)
    log.info("fine", what=what)
    log.info(event="fine too")
    std.warning("stdlib: %s", what)
    self.kernel_log.read(why)
    task.exception()
'''
    assert [line.split(":")[0] for line in scan(source)] == [
        "6", "7", "8", "9", "10", "11", "12", "13", "14", "15"]

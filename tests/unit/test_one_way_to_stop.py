"""One way to stop on a signal: every asyncio SIGTERM/SIGINT handler of hafo goes through
``hafo.stopping`` (``on_signals``, ``stop_on_signals``, ``cancel_on_signals``).

An ``ast`` check over hafo/**/*.py for handlers installed by hand:

- ``async``: ``<loop>.add_signal_handler(SIG, ...)`` where ``SIG`` is SIGTERM, SIGINT or not a
  named signal at all (a variable: a loop over signals may hold them);
- ``sync``: ``signal.signal(SIG, ...)`` likewise: a synchronous handler of a stop signal.

Each exception is in ``ALLOWED``, with why. Signals other than SIGTERM and SIGINT (SIGUSR1
cuts a proxy's links, ...) are not stop signals and are not checked.
"""

from __future__ import annotations

import ast

from tests.unit.house_rules import name_of, scan_hafo, unexplained

HELPER = "stopping.py"  # hafo/stopping.py: the helper itself
STOP = {"SIGTERM", "SIGINT"}

#: (path under hafo/, enclosing function, rule) -> why it is not the helper's job.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("agent/guard.py", "run", "sync"):
        "hafo guard is synchronous (a 50 ms poll loop, no event loop): SIGTERM/SIGINT start "
        "the graceful stop (SIGUSR1 to the workload, stop_grace, then SIGTERM, SIGKILL), "
        "installed beside its SIGUSR1/SIGUSR2/SIGHUP handlers for the guard's whole life",
    ("local/nodeinit.py", "run_init", "sync"):
        "a simulated node's init (pid 1 of its namespaces): synchronous, a flag its reaping "
        "loop reads, for the process's whole life",
    ("local/nodeinit.py", "_forward_to", "sync"):
        "hafo's nsenter-like entry forwards SIGTERM/SIGINT/SIGUSR1 to the process it started "
        "inside a node: synchronous, for the process's whole life",
    ("local/dev_server.py", "run", "sync"):
        "after hafo dev stopped (its handlers, hafo.stopping.on_signals, removed) it ignores "
        "late signals so that a late Ctrl-C cannot kill the exit itself (SIG_IGN, not a stop)",
}



def _may_stop(node: ast.AST) -> bool:
    """Whether the signal argument is SIGTERM, SIGINT or not a named signal (a variable)."""
    name = name_of(node)
    return name in STOP or not (name.startswith("SIG") and name.isupper())


def _rule(call: ast.Call) -> str | None:
    func = call.func
    if not call.args or not _may_stop(call.args[0]):
        return None
    if isinstance(func, ast.Attribute) and func.attr == "add_signal_handler":
        return "async"
    if (isinstance(func, ast.Attribute) and func.attr == "signal"
            and name_of(func.value) == "signal"):
        return "sync"
    return None


def scan(source: str) -> list[tuple[str, int, str]]:
    """(enclosing function, line, rule) of every stop signal handled by hand in ``source``."""
    tree = ast.parse(source)
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            elif isinstance(child, ast.Call) and (rule := _rule(child)) is not None:
                found.append((where, child.lineno, rule))
            visit(child, inner)

    visit(tree, "<module>")
    return sorted(found, key=lambda f: f[1])


def test_no_stop_signal_is_handled_by_hand_outside_hafo_stopping() -> None:
    by_hand = unexplained(scan_hafo(scan, HELPER), ALLOWED)
    assert not by_hand, (
        "SIGTERM/SIGINT handled by hand: use hafo.stopping (stop_on_signals, "
        "cancel_on_signals, on_signals), or add the place to ALLOWED with why: "
        + "; ".join(by_hand))


def test_every_allowed_exception_still_exists() -> None:
    found = scan_hafo(scan, HELPER)
    assert [key for key in ALLOWED if key not in found] == []


def test_the_scan_finds_each_kind_of_hand_written_handler() -> None:
    source = '''
import asyncio, signal
async def stops():
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGINT, interrupt)
def sync():
    signal.signal(signal.SIGTERM, on_term)
async def fine():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, cut)
    signal.signal(signal.SIGUSR2, other)
    signal.getsignal(signal.SIGTERM)
'''
    assert scan(source) == [("stops", 6, "async"), ("stops", 7, "async"), ("sync", 9, "sync")]

"""One retry policy: every retry loop of hafo goes through ``hafo.retry``.

A grep-level check (via ``ast``) over hafo/**/*.py for retry loops written by hand:

- ``sleep``: a sleep (``asyncio.sleep``, ``time.sleep``, ``wait_event``) inside an ``except``
  handler: a failure waited out by hand;
- ``growth``: a delay grown by hand (``2 ** n`` of a variable ``n``, ``delay * 2``,
  ``delay *= 2``);
- ``attempts``: a ``for attempt in range(...)`` loop around a ``try``.

Each exception is in ``ALLOWED``, with why.
"""

from __future__ import annotations

import ast

from tests.unit.house_rules import name_of, scan_hafo, unexplained

HELPER = "retry.py"  # hafo/retry.py: the helper itself

SLEEPS = {"sleep", "wait_event"}
DELAY_WORDS = ("delay", "backoff", "interval", "wait", "pause")
ATTEMPT_WORDS = ("attempt", "retr", "tries", "try_")

#: (path under hafo/, enclosing function, rule) -> why it is not a hand-written retry.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("controller/daemon.py", "_watch_trust", "sleep"):
        "a periodic read of the store's identity every TRUST_EVERY: a failed round waits the "
        "same period as a successful one (its etcd calls retried under the store's policy)",
    ("model/spec.py", "delay", "growth"):
        "a workload's restart policy (restart.backoff doubling to max_backoff): a decision of "
        "the pure core, deterministic on purpose, not a retry of a failed call",
    ("decisions/failures.py", "uncounted_backoff", "growth"):
        "an uncounted restart's backoff: a decision of the pure core, deterministic on "
        "purpose (every controller must decide alike), not a retry of a failed call",
    ("checkpoint/sharded.py", "_deadline_poll", "growth"):
        "polls a condition (the other ranks' shards committed), not a failed operation; "
        "bounded by commit_timeout; synchronous code inside workloads",
}



def _is_sleep(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and name_of(node.func) in SLEEPS


def _delayname_of(node: ast.AST) -> bool:
    name = name_of(node).lower()
    return any(word in name for word in DELAY_WORDS)


def _is_two(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (2, 2.0)


def _grows(node: ast.AST) -> bool:
    """``2 ** n`` (``n`` not a constant), ``delay * 2`` or ``delay *= 2``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _is_two(node.left) and not isinstance(node.right, ast.Constant)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return ((_is_two(node.right) and _delayname_of(node.left))
                or (_is_two(node.left) and _delayname_of(node.right)))
    return (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult)
            and _delayname_of(node.target))


def _walk_here(node: ast.AST) -> list[ast.AST]:
    """``node`` and what it holds, not descending into nested functions."""
    found: list[ast.AST] = []
    todo = [node]
    while todo:
        each = todo.pop()
        found.append(each)
        for child in ast.iter_child_nodes(each):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                todo.append(child)
    return found


def scan(source: str) -> list[tuple[str, int, str]]:
    """(enclosing function, line, rule) of every hand-written retry in ``source``."""
    tree = ast.parse(source)
    found: list[tuple[str, int, str]] = []
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for function in [tree, *functions]:
        where = getattr(function, "name", "<module>")
        for node in _walk_here(function):
            if node is not function and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(node, ast.ExceptHandler):
                for inner in _walk_here(node):
                    if _is_sleep(inner):
                        found.append((where, inner.lineno, "sleep"))
            elif _grows(node):
                found.append((where, node.lineno, "growth"))
            elif (isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
                    and name_of(node.iter.func) == "range"
                    and any(w in name_of(node.target).lower() for w in ATTEMPT_WORDS)
                    and any(isinstance(n, ast.Try) for n in _walk_here(node))):
                found.append((where, node.lineno, "attempts"))
    return sorted(set(found), key=lambda f: (f[1], f[2]))



def test_no_retry_loop_is_written_by_hand_outside_hafo_retry() -> None:
    by_hand = unexplained(scan_hafo(scan, HELPER), ALLOWED)
    assert not by_hand, (
        "retry loops written by hand: use hafo.retry.Retry (or retry_call) with an explicit "
        "RetryPolicy, or add the place to ALLOWED with why: " + "; ".join(by_hand))


def test_every_allowed_exception_still_exists() -> None:
    found = scan_hafo(scan, HELPER)
    assert [key for key in ALLOWED if key not in found] == []


def test_the_scan_finds_each_kind_of_hand_written_retry() -> None:
    source = '''
import asyncio, time
async def sleeps_in_handler():
    while True:
        try:
            return await op()
        except OSError:
            await asyncio.sleep(1)
def grows(delay):
    while True:
        try:
            return op()
        except OSError:
            pass
        time.sleep(delay)
        delay *= 2
def powers(failures):
    return min(1.0, 0.05 * 2 ** failures)
async def tries():
    for attempt in range(3):
        try:
            return await op()
        except OSError:
            pass
async def fine():
    try:
        await op()
    except OSError:
        retry = 1
    await asyncio.sleep(1)
    def nested():
        time.sleep(1)
'''
    assert scan(source) == [("sleeps_in_handler", 8, "sleep"), ("grows", 16, "growth"),
                            ("powers", 18, "growth"), ("tries", 20, "attempts")]

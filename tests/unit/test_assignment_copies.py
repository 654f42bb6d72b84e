"""The per-node copy of an assignment follows the node it names (controller writes)."""

from __future__ import annotations

import pytest

from hafo.controller.apply import _mirror_ops
from hafo.decisions.plan import Action, Cause
from hafo.model.cluster import Assignment
from hafo.store import Delete, Keys, Put

KEYS = Keys("c")


def action(phase: str | None, node: str | None) -> Action:
    assignment = None if phase is None else Assignment(workload="w", phase=phase,  # type: ignore[arg-type]
                                                       node=node)
    return Action(kind="place", workload="w", cause=Cause.NEW, why="why", expected_revision=1,
                  assignment=assignment)


@pytest.mark.parametrize(("previous", "phase", "node", "expected"), [
    (None, "placed", "a", [("put", "a")]),                 # first placement
    ("a", "placed", "b", [("delete", "a"), ("put", "b")]),  # failover or move
    ("a", "moving", "a", [("put", "a")]),                  # stop it there first
    ("a", "placed", "a", [("put", "a")]),                  # restart in place
    ("a", "pending", None, [("delete", "a")]),
    ("a", "completed", None, [("delete", "a")]),
    ("a", None, None, [("delete", "a")]),                  # forgotten
    (None, "pending", None, []),
])
def test_copy_follows_the_node(previous: str | None, phase: str | None, node: str | None,
                               expected: list[tuple[str, str]]) -> None:
    ops = _mirror_ops(KEYS, action(phase, node), (previous,) if previous else ())
    got = [("put" if isinstance(op, Put) else "delete", KEYS.parse(op.key).node) for op in ops]
    assert got == expected
    assert all(isinstance(op, (Put, Delete)) and KEYS.parse(op.key).workload == "w"
               for op in ops)

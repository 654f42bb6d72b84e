"""What ``hafo drain`` moves (``hafo.decisions.drain``)."""

from __future__ import annotations

import pytest

from hafo.decisions.drain import workloads_to_drain
from hafo.model.cluster import Assignment, MoveRequest

from .conftest import make_node, make_snapshot, placed


def moving(wid: str, node: str) -> Assignment:
    return Assignment(workload=wid, phase="moving", node=node, gpus=(1,), epoch=5, stopping=5)


@pytest.mark.parametrize(("assignments", "node", "expected"), [
    ([], "a", []),
    ([placed("w2", "a"), placed("w1", "a", [1])], "a", ["w1", "w2"]),  # by workload id
    ([placed("w1", "a"), placed("w2", "b")], "a", ["w1"]),            # only that node's
    ([placed("w1", "b")], "a", []),
    ([moving("w1", "a"), placed("w2", "a", [2])], "a", ["w2"]),        # a move under way
    ([Assignment(workload="w1", phase="pending", epoch=3)], "a", []),
    ([Assignment(workload="w1", phase="completed", node="a", epoch=3)], "a", []),
    ([Assignment(workload="w1", phase="failed", node="a", epoch=3)], "a", []),
])
def test_workloads_to_drain(assignments: list[Assignment], node: str,
                            expected: list[str]) -> None:
    snapshot = make_snapshot([make_node("a"), make_node("b")], assignments=assignments)
    assert workloads_to_drain(snapshot, node) == [
        MoveRequest(wid, None, f"drain {node}") for wid in expected]


def test_a_down_or_cordoned_node_is_drained_alike() -> None:
    assignments = [placed("w1", "a")]
    for snapshot in (make_snapshot([make_node("a")], down=["a"], assignments=assignments),
                     make_snapshot([make_node("a")], cordoned=["a"], assignments=assignments)):
        assert [r.workload for r in workloads_to_drain(snapshot, "a")] == ["w1"]

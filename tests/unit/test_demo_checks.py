"""The demo's (and the tests') check that two epochs of one workload never overlapped."""

from __future__ import annotations

from typing import Any

import pytest

from hafo.demo import overlapping_lifetimes


def line(epoch: int, t: float) -> dict[str, Any]:
    return {"epoch": epoch, "t": t}


@pytest.mark.parametrize(("lines", "expected"), [
    pytest.param([], [], id="empty"),
    pytest.param([line(5, 1.0), line(5, 2.0)], [], id="one-epoch"),
    pytest.param([line(5, 1.0), line(5, 2.0), line(9, 3.0), line(9, 4.0)], [], id="disjoint"),
    pytest.param([line(5, 1.0), line(9, 1.5), line(5, 2.0)], [(5, 9)], id="overlap"),
    pytest.param([line(9, 3.0), line(5, 1.0), line(5, 2.0)], [], id="unordered-lines"),
    pytest.param([line(1, 0.0), line(1, 10.0), line(2, 1.0), line(3, 2.0)], [(1, 2), (1, 3)],
                 id="chained"),
])
def test_overlapping_lifetimes(lines: list[dict[str, Any]],
                               expected: list[tuple[int, int]]) -> None:
    assert overlapping_lifetimes(lines) == expected

"""The overlap check on progress logs and the chaos report's statistics (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from hafo.chaos.invariants import percentile
from hafo.local.progress import Overlap, overlaps


def line(workload: str, epoch: int, t: float) -> dict[str, Any]:
    return {"workload": workload, "epoch": epoch, "t": t}


@pytest.mark.parametrize(("lines", "expected"), [
    pytest.param([], [], id="empty"),
    pytest.param([line("a", 1, 0), line("a", 1, 1), line("a", 2, 2)], [], id="handover"),
    pytest.param([line("a", 1, 0), line("a", 2, 0.5), line("a", 1, 1)],
                 [Overlap("a", (1, 2), 0.5)], id="overlap"),
    pytest.param([line("a", 1, 0), line("b", 2, 0.5), line("a", 1, 1)], [],
                 id="other-workload-does-not-count"),
    pytest.param([line("a", 1, 0), line("a", 1, 10), line("a", 2, 1), line("a", 3, 5)],
                 [Overlap("a", (1, 2), 9), Overlap("a", (1, 3), 5)], id="long-zombie"),
])
def test_overlaps(lines: list[dict[str, Any]], expected: list[Overlap]) -> None:
    assert overlaps(lines) == expected


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 0.5, 0.0),
    ([3.0], 0.5, 3.0),
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
    ([1.0, 2.0, 3.0, 4.0], 0.95, 4.0),
    ([4.0, 1.0, 3.0, 2.0], 1.0, 4.0),
])
def test_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected

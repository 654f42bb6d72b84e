"""hafo.stats.percentile: nearest-rank (the chaos suite's and the benchmarks' reports) and
linear (the load generator's latencies)."""

from __future__ import annotations

import math

import pytest

from hafo.stats import percentile


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([], 50, 0.0),
    ([3.0], 50, 3.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
    ([1.0, 2.0, 3.0, 4.0], 95, 4.0),
    ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
    ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
])
def test_nearest_rank(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == expected


def test_nearest_rank_is_one_of_the_values_at_or_above_p_percent() -> None:
    values = [float(v) for v in range(1, 21)]  # 1 .. 20
    assert percentile(values, 50) == 10.0 and percentile(values, 95) == 19.0
    assert percentile(values, 96) == 19.0 and percentile(values, 97.6) == 20.0


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([0.1, 0.2, 0.3, 1.0], 0, 0.1),
    ([0.1, 0.2, 0.3, 1.0], 100, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
    ([1.0, 3.0], 25, 1.5),
    ([4.0, 1.0, 3.0, 2.0], 150, 4.0),  # clamped
    ([4.0, 1.0, 3.0, 2.0], -5, 1.0),
    ([7.0], 99, 7.0),
])
def test_linear(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p, method="linear") == pytest.approx(expected)


def test_empty_says_what_the_caller_asks() -> None:
    assert percentile([], 50) == 0.0
    assert math.isnan(percentile([], 50, method="linear", empty=math.nan))


def test_any_iterable_in_any_order() -> None:
    assert percentile(iter([3.0, 1.0, 2.0]), 50) == 2.0

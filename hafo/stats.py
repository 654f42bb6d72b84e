"""Percentiles for hafo's reports: the chaos suite's recovery times, the benchmarks' and the
load generator's latencies. Pure, standard library only."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

Method = Literal["nearest-rank", "linear"]


def percentile(values: Iterable[float], p: float, *, method: Method = "nearest-rank",
               empty: float = 0.0) -> float:
    """The ``p``-th percentile (0-100) of ``values``, in any order; ``empty`` when there are
    none.

    ``nearest-rank``: the smallest value with at least ``p`` percent of the values at or below
    it (always one of the values: a recovery time that happened). ``linear``: interpolated
    between the two nearest ranks, ``p`` clamped to 0-100 (0 is the least value, 100 the
    greatest)."""
    ordered = sorted(values)
    if not ordered:
        return empty
    if method == "nearest-rank":
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]
    rank = (len(ordered) - 1) * min(max(p, 0.0), 100.0) / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)

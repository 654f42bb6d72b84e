"""The invariants a chaos run checks, as pure functions over what was recorded."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Overlap:
    """Two instances of one workload alive at the same time."""

    workload: str
    epochs: tuple[int, int]
    seconds: float


def overlaps_from_log(lines: Iterable[Mapping[str, Any]]) -> list[Overlap]:
    """Overlaps of logged lifetimes (first to last line of each epoch) per workload."""
    spans: dict[tuple[str, int], tuple[float, float]] = {}
    for line in lines:
        key = (str(line["workload"]), int(line["epoch"]))
        first, last = spans.get(key, (line["t"], line["t"]))
        spans[key] = (min(first, line["t"]), max(last, line["t"]))
    found: list[Overlap] = []
    for workload in sorted({w for w, _ in spans}):
        mine = sorted(((e, s) for (w, e), s in spans.items() if w == workload),
                      key=lambda item: item[1][0])
        longest: tuple[int, float] | None = None
        for epoch, (start, end) in mine:
            if longest is not None and start < longest[1]:
                found.append(Overlap(workload, (longest[0], epoch), longest[1] - start))
            if longest is None or end > longest[1]:
                longest = (epoch, end)
    return found


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

"""The progress log of the built-in workload (``hafo.local.workload``), and the overlap check
that the demo, the tests and the chaos suite run on it: every line carries the workload, its
epoch, node, pid and time, so two instances alive at once show as overlapping lifetimes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Overlap:
    """Two instances (epochs) of one workload logged as alive at the same time."""

    workload: str
    epochs: tuple[int, int]
    seconds: float


def read_progress(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a progress log (a line cut by a kill is skipped)."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return lines


def overlaps(lines: Iterable[Mapping[str, Any]]) -> list[Overlap]:
    """Per workload, epochs whose logged lifetimes (first to last line) overlap."""
    spans: dict[tuple[str, int], tuple[float, float]] = {}
    for line in lines:
        key = (str(line["workload"]), int(line["epoch"]))
        first, last = spans.get(key, (line["t"], line["t"]))
        spans[key] = (min(first, line["t"]), max(last, line["t"]))
    found: list[Overlap] = []
    for workload in sorted({w for w, _ in spans}):
        mine = sorted(((e, s) for (w, e), s in spans.items() if w == workload),
                      key=lambda item: item[1][0])
        longest: tuple[int, float] | None = None  # the epoch that lives longest so far
        for epoch, (start, end) in mine:
            if longest is not None and start < longest[1]:
                found.append(Overlap(workload, (longest[0], epoch), longest[1] - start))
            if longest is None or end > longest[1]:
                longest = (epoch, end)
    return found

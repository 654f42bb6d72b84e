"""The progress log of the built-in workload (``hafo.local.workload``), and the overlap check
that the demo, the tests and the chaos suite run on it: every line carries the workload, its
epoch, node, pid and time, so two instances alive at once show as overlapping lifetimes."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Overlap:
    """Two instances (epochs) of one workload logged as alive at the same time."""

    workload: str
    epochs: tuple[int, int]
    seconds: float
    histories: tuple[int, int] = (0, 0)  # of each epoch: the restores before it (overlaps)


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


def history(t: float, restores: Sequence[float]) -> int:
    """How many of the (sorted) ``restores`` happened before time ``t``."""
    return bisect_right(restores, t)


def overlaps(lines: Iterable[Mapping[str, Any]],
             restores: Sequence[float] = ()) -> list[Overlap]:
    """Per workload, epochs whose logged lifetimes (first to last line) overlap.

    ``restores``: the times the store's history was replaced (``hafo restore`` into an etcd
    that lost its data). The restore's epoch base puts the new history's epochs past the old
    ones, but the check does not rely on the code it checks: an instance is its workload,
    history and epoch, so an epoch number repeated by another history is another instance.
    A process belongs to the history of its first line (the number of restores before it):
    an old instance still logging after a restore stays the old history's."""
    marks = sorted(restores)
    born: dict[tuple[Any, ...], float] = {}  # process -> its first line's time
    rows = []
    for line in lines:
        process = (str(line["workload"]), int(line["epoch"]), line.get("node"),
                   line.get("pid"), line.get("boot"))
        born[process] = min(born.get(process, line["t"]), line["t"])
        rows.append((process, line["t"]))
    spans: dict[tuple[str, int, int], tuple[float, float]] = {}
    for process, t in rows:
        key = (process[0], history(born[process], marks), process[1])
        first, last = spans.get(key, (t, t))
        spans[key] = (min(first, t), max(last, t))
    found: list[Overlap] = []
    for workload in sorted({w for w, _, _ in spans}):
        mine = sorted(((h, e, s) for (w, h, e), s in spans.items() if w == workload),
                      key=lambda item: item[2][0])
        longest: tuple[int, int, float] | None = None  # history, epoch living longest so far
        for hist, epoch, (start, end) in mine:
            if longest is not None and start < longest[2]:
                found.append(Overlap(workload, (longest[1], epoch), longest[2] - start,
                                     (longest[0], hist)))
            if longest is None or end > longest[2]:
                longest = (hist, epoch, end)
    return found


@dataclass(frozen=True)
class Resumption:
    """What the workload's own progress log says about one move from ``old_epoch`` to
    ``new_epoch``: the last step the old instance reached and the step the new one resumed
    from (its checkpoint). None where the log has no record of it (yet)."""

    old_epoch: int
    new_epoch: int
    last_step: int | None
    resumed_from: int | None

    @property
    def lost(self) -> int | None:
        """Steps done by the old instance that the new one does again; None if unknown."""
        if self.last_step is None or self.resumed_from is None:
            return None
        return max(0, self.last_step - self.resumed_from)


def resumption(lines: Iterable[Mapping[str, Any]], old_epoch: int,
               new_epoch: int) -> Resumption:
    """Read a move off a progress log: the old epoch's furthest step (a ``step``, or the
    ``resumed_from`` of its ``start`` record if it got no further) and the ``resumed_from``
    of the new epoch's ``start`` record."""
    last: int | None = None
    resumed: int | None = None
    for line in lines:
        epoch = int(line["epoch"])
        if epoch == old_epoch:
            reached = line.get("step", line.get("resumed_from"))
            if reached is not None:
                last = max(int(reached), last if last is not None else int(reached))
        elif epoch == new_epoch and line.get("event") == "start" and resumed is None:
            resumed = int(line["resumed_from"])
    return Resumption(old_epoch, new_epoch, last, resumed)

"""A gang's pre-flight verdict (docs/reference/gangs.md, "Pre-flight"): which members' ranks
to blame, given the figures every member measured (``hafo.model.preflight.RankFigures``).
Pure.

Every member of the gang judges the same figures (exchanged in the test's last collective),
so every member's report names the same ranks:

1. a rank of the gang without figures did not join: blamed;
2. else a rank is much slower when its local probe (``compute``) took more than ``slowdown``
   times the median of the OTHER ranks' probes AND more than that median plus
   ``min_excess`` seconds (small probes are noisy): every such rank is blamed.

Each rank is compared with the median of the others, not of all: with two slow ranks of
three, the median of either one's others is the mean of a fast and a slow probe, and neither
is blamed by a ``slowdown`` of 2 or more (half the gang slow is no outlier); with four or more
ranks a minority of slow ranks is blamed one and all.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from hafo.model.preflight import RankFigures

#: At most this many ranks are named in a sentence; the rest are counted.
NAMED_RANKS = 8


def rank_list(ranks: Sequence[int]) -> str:
    """``rank 2``, ``ranks 1 and 2``, ``ranks 1, 2 and 3``; past ``NAMED_RANKS`` ranks the
    rest are counted (``ranks 0, 1, ..., 7 and 12 more``)."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    if len(ordered) > NAMED_RANKS:
        named = ", ".join(str(r) for r in ordered[:NAMED_RANKS])
        return f"ranks {named} and {len(ordered) - NAMED_RANKS} more"
    return "ranks " + ", ".join(str(r) for r in ordered[:-1]) + f" and {ordered[-1]}"


def missing_text(ranks: Sequence[int]) -> str:
    """``rank 2 did not join``, ``ranks 1 and 2 did not join`` ("" for none)."""
    return f"{rank_list(ranks)} did not join" if ranks else ""


def _slow_text(rank: int, compute: float, others: float) -> str:
    """``rank 1's probe took 0.412s, 8.2x the other members' median 0.050s``."""
    times = f"{compute / others:.1f}x" if others > 0 else "more than"
    return f"rank {rank}'s probe took {compute:.3f}s, {times} the other members' median " \
        f"{others:.3f}s"


def judge(figures: Sequence[RankFigures], size: int, slowdown: float,
          min_excess: float) -> tuple[tuple[int, ...], str]:
    """The verdict on a gang of ``size`` ranks given the ``figures`` its members exchanged:
    (the ranks to blame, in order, and why in one sentence), or ``((), "")`` when it passed.

    Ranks of ``range(size)`` without figures are blamed first (``rank 2 did not join``);
    figures of ranks outside it are ignored (the first of a rank's duplicates counts). Else,
    with figures of two ranks or more, every rank whose probe exceeds both ``slowdown`` times
    the median of the other ranks' probes and that median plus ``min_excess`` is blamed
    (``rank 1's probe took 0.412s, 8.2x the other members' median 0.050s (slowdown 3)``)."""
    present: dict[int, RankFigures] = {}
    for figure in figures:
        if 0 <= figure.rank < size:
            present.setdefault(figure.rank, figure)
    missing = [rank for rank in range(size) if rank not in present]
    if missing:
        return tuple(missing), missing_text(missing)
    if len(present) < 2:
        return (), ""
    slow: list[tuple[int, float, float]] = []
    for rank, figure in sorted(present.items()):
        others = statistics.median(f.compute for r, f in present.items() if r != rank)
        if figure.compute > slowdown * others and figure.compute > others + min_excess:
            slow.append((rank, figure.compute, others))
    if not slow:
        return (), ""
    shown = "; ".join(_slow_text(*entry) for entry in slow[:NAMED_RANKS])
    more = f"; and {len(slow) - NAMED_RANKS} more" if len(slow) > NAMED_RANKS else ""
    return tuple(rank for rank, _, _ in slow), f"{shown}{more} (slowdown {slowdown:g})"

"""A gang's pre-flight verdict (``hafo.decisions.preflight.judge``): who did not join, who is
much slower than the other members. Pure, table-driven (docs/reference/gangs.md,
"Pre-flight")."""

from __future__ import annotations

import pytest

from hafo.decisions.preflight import judge, missing_text, rank_list
from hafo.model.preflight import RankFigures


def figures(*computes: float | None) -> list[RankFigures]:
    """One rank's figures per value, rank = position; None: that rank has none."""
    return [RankFigures(rank=rank, node=f"node-{rank}", compute=compute, joined=0.5)
            for rank, compute in enumerate(computes) if compute is not None]


@pytest.mark.parametrize(("computes", "slowdown", "min_excess", "blamed", "why"), [
    # all alike: passed
    ((0.05, 0.05, 0.05), 3, 0.05, (), ""),
    ((0.05, 0.06, 0.04), 3, 0.05, (), ""),
    # one did not join
    ((0.05, 0.05, None), 3, 0.05, (2,), "rank 2 did not join"),
    # several did not join (and the slow probe of a joined rank is not judged then)
    ((0.05, None, None, 0.9), 3, 0.05, (1, 2), "ranks 1 and 2 did not join"),
    ((None, None, None, 0.05), 3, 0.05, (0, 1, 2), "ranks 0, 1 and 2 did not join"),
    # a single rank present of 3: the two others did not join
    ((None, 0.05, None), 3, 0.05, (0, 2), "ranks 0 and 2 did not join"),
    # none present: every rank
    ((None, None), 3, 0.05, (0, 1), "ranks 0 and 1 did not join"),
    # one much slower: more than slowdown x the others' median and min_excess more
    ((0.05, 0.412, 0.05), 3, 0.05, (1,),
     "rank 1's probe took 0.412s, 8.2x the other members' median 0.050s (slowdown 3)"),
    # slower but only 2.9x: passed
    ((0.05, 0.145, 0.05), 3, 0.05, (), ""),
    # 10x slower, but by less than min_excess (a 1 ms probe and a 10 ms one): passed
    ((0.001, 0.010, 0.001), 3, 0.05, (), ""),
    # ... and by more than it
    ((0.001, 0.010, 0.001), 3, 0.005, (1,),
     "rank 1's probe took 0.010s, 10.0x the other members' median 0.001s (slowdown 3)"),
    # two of three slow: each is compared with the median of the others (one fast, one slow:
    # 0.225s), so neither is 3x it: passed (half the gang slow is no outlier)
    ((0.05, 0.4, 0.4), 3, 0.05, (), ""),
    # two of five slow: the others' median is a fast probe's: both blamed
    ((0.05, 0.4, 0.05, 0.5, 0.05), 3, 0.05, (1, 3),
     "rank 1's probe took 0.400s, 8.0x the other members' median 0.050s; rank 3's probe took "
     "0.500s, 10.0x the other members' median 0.050s (slowdown 3)"),
    # two ranks: the other's median is its probe
    ((0.05, 0.3), 3, 0.05, (1,),
     "rank 1's probe took 0.300s, 6.0x the other members' median 0.050s (slowdown 3)"),
    # a much faster rank is not blamed, nor are the others: their others' median (a fast and
    # a normal probe, 0.0255s) is halved at most
    ((0.001, 0.05, 0.05), 3, 0.01, (), ""),
    # a fractional slowdown is shown as given
    ((0.05, 0.1, 0.05), 1.5, 0.01, (1,),
     "rank 1's probe took 0.100s, 2.0x the other members' median 0.050s (slowdown 1.5)"),
    # the others' median is 0: no ratio
    ((0.0, 0.3, 0.0), 3, 0.05, (1,),
     "rank 1's probe took 0.300s, more than the other members' median 0.000s (slowdown 3)"),
    # a gang of one: nothing to compare with
    ((0.5,), 3, 0.05, (), ""),
])
def test_the_verdict(computes: tuple[float | None, ...], slowdown: float, min_excess: float,
                     blamed: tuple[int, ...], why: str) -> None:
    assert judge(figures(*computes), len(computes), slowdown, min_excess) == (blamed, why)


def test_the_order_of_the_figures_does_not_matter() -> None:
    shuffled = list(reversed(figures(0.05, 0.412, 0.05, 0.06)))
    assert judge(shuffled, 4, 3, 0.05)[0] == (1,)
    assert judge(figures(0.05, 0.412, 0.05, 0.06), 4, 3, 0.05)[0] == (1,)


def test_ranks_outside_the_gang_and_duplicates_are_ignored() -> None:
    extra = [*figures(0.05, 0.05), RankFigures(rank=7, node="x", compute=9.0, joined=0.0)]
    assert judge(extra, 3, 3, 0.05) == ((2,), "rank 2 did not join")
    assert judge(extra, 2, 3, 0.05) == ((), "")
    twice = [*figures(0.05, 0.05), RankFigures(rank=1, node="again", compute=9.0, joined=0.0)]
    assert judge(twice, 2, 3, 0.05) == ((), "")  # the first of rank 1's figures counts


def test_many_slow_ranks_are_all_blamed_and_a_few_named() -> None:
    computes = [0.05] * 20 + [1.0] * 10
    blamed, why = judge(figures(*computes), 30, 3, 0.05)
    assert blamed == tuple(range(20, 30))
    assert why.startswith("rank 20's probe took 1.000s, 20.0x")
    assert why.endswith("; and 2 more (slowdown 3)")
    assert why.count("'s probe took") == 8


@pytest.mark.parametrize(("ranks", "text"), [
    ((), ""),
    ((2,), "rank 2 did not join"),
    ((2, 1), "ranks 1 and 2 did not join"),
    ((0, 1, 2), "ranks 0, 1 and 2 did not join"),
    (tuple(range(12)), "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 4 more did not join"),
])
def test_missing_text(ranks: tuple[int, ...], text: str) -> None:
    assert missing_text(ranks) == text
    if ranks:
        assert text.startswith(rank_list(ranks))

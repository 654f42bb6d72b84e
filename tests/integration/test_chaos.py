"""The chaos suite, short and seeded: one fault of every kind, invariants checked, over two
seeds. Every kind of workload (single, gang member, service replica, and one that leaves an
escaped process behind) runs on a node that loses power and boots again with its disk, and
processes hafo did not start run on every node (none may be signalled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hafo.chaos.faults import FAULT_KINDS
from hafo.chaos.runner import WORKLOAD_KINDS, run_chaos

pytestmark = pytest.mark.timeout(500)


@pytest.mark.parametrize("seed", [11, 12])
async def test_short_seeded_chaos_run_keeps_every_invariant(tmp_path: Path, seed: int) -> None:
    report = await run_chaos(seed=seed, faults=len(FAULT_KINDS), base_dir=tmp_path / "chaos",
                             say=lambda line: None)
    print(report.table())
    assert sorted({r.kind for r in report.results}) == sorted(FAULT_KINDS)
    assert not report.overlaps, report.overlaps
    assert not report.concurrent, report.concurrent[:5]
    assert not report.not_running
    assert not report.bystanders, report.bystanders
    assert sorted(report.rebooted) == sorted(WORKLOAD_KINDS), report.rebooted
    assert all(not r.violations for r in report.results), [r for r in report.results
                                                          if r.violations]
    power = [r.recovery for r in report.results if r.kind == "node-power-loss"]
    assert power and all(t is not None and t < 3 + 2.0 for t in power)
    assert report.ok

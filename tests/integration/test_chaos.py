"""The chaos suite, short and seeded: one fault of every kind, invariants checked, over two
seeds. Every kind of workload (single, gang member, service replica, and one that leaves an
escaped process behind) runs on a node that loses power and boots again with its disk, and
processes hafo did not start run on every node (none may be signalled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hafo.chaos.faults import FAULT_KINDS
from hafo.chaos.runner import WORKLOAD_KINDS, run_chaos

pytestmark = pytest.mark.timeout(600)


#: What the fast profile's 0.6 s of slack does not cover (docs/safety.md, "The fast
#: profile"): the failsafe round that keeps work through an etcd that lost its data takes the
#: store's identity read, a controller's etcd probe (up to 0.4 s) and its answer. Nothing runs
#: twice (checked); the work is fenced and restarted. Only these violations are excused.
FAST_AVAILABILITY = {"etcd-lost-data": "killed while etcd was not the cluster"}


@pytest.mark.parametrize(("seed", "profile"), [(11, "default"), (12, "default"), (11, "fast")])
async def test_short_seeded_chaos_run_keeps_every_invariant(tmp_path: Path, seed: int,
                                                            profile: str) -> None:
    report = await run_chaos(seed=seed, faults=len(FAULT_KINDS), base_dir=tmp_path / "chaos",
                             say=lambda line: None, profile=profile)
    print(report.table())
    assert sorted({r.kind for r in report.results}) == sorted(FAULT_KINDS)
    assert not report.overlaps, report.overlaps
    assert not report.concurrent, report.concurrent[:5]
    assert not report.not_running
    assert not report.bystanders, report.bystanders
    assert sorted(report.rebooted) == sorted(WORKLOAD_KINDS), report.rebooted
    # Availability findings, reported and not failed on (nothing runs twice: checked above):
    # - an agent restarted on this busy 2-core machine can miss its renewal bound (1.5 s at
    #   worst): its work is then restarted in place, uncounted (docs/safety.md, "Hitless agent
    #   restarts": not guaranteed on an oversubscribed machine);
    # - a whole etcd cluster killed and started again can still fence work on a machine
    #   starved of CPU for seconds (docs/safety.md, "Known gaps");
    # an etcd stall (etcd-stall) restarts nothing: not among them (docs/safety.md, "An etcd
    # stall"; on a machine oversubscribed by other work it can, "Known gaps").
    availability = {"agent-restart", "whole-etcd-restart"}
    excused = FAST_AVAILABILITY if profile == "fast" else {}
    known = [r for r in report.results if r.violations and (
        r.kind in availability or (r.kind in excused and all(
            v.endswith(excused[r.kind]) for v in r.violations)))]
    for result in known:
        print(f"availability finding: {result}")
    broken = [r for r in report.results if r.violations and r not in known]
    assert not broken, broken
    # A power cut targets the node running most kinds of workload, a gang member among them:
    # every workload of that node must run again elsewhere, the gang's other members stopped
    # and the whole gang started again, which takes longer than one workload's move (TTL + 2 s).
    ttl = 1 if profile == "fast" else 3
    power = [r.recovery for r in report.results if r.kind == "node-power-loss"]
    assert power and all(t is not None and t < ttl + 5.0 for t in power), power

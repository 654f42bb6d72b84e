"""Issue 28, finding 3: a fault shared by many nodes is a cluster condition, not a node fault
(``hafo.decisions.shared_faults``). Pure, on an injected clock; then with ``reconcile``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest

from hafo.decisions.classify import Verdict
from hafo.decisions.reconcile import reconcile
from hafo.decisions.shared_faults import (
    SETTLE,
    SharedState,
    assess_shared,
    hold,
    split_verdicts,
    with_node_faults,
)
from hafo.model import health as h
from hafo.model.cluster import ClusterSnapshot, NodeRecord, ResourceFault
from hafo.model.health import Finding

from .conftest import make_node, make_snapshot, placed, status, submit

ROOT = "checkpoint root /shared/ckpt"
FULL = ResourceFault(h.DISK_FULL, ROOT, "disk full (/shared/ckpt: 49.9 MiB free of 50 MiB "
                     "required): checkpoint filesystem nearly full")
NOW = 1000.0


def nodes(faulty: Iterable[str], names: str = "abcd") -> list[NodeRecord]:
    bad = set(faulty)
    return [replace(make_node(n), resource_faults=(FULL,) if n in bad else ())
            for n in names]


def cluster(faulty: Iterable[str], names: str = "abcd", down: Iterable[str] = ()
            ) -> ClusterSnapshot:
    """Nodes ``names``, those in ``faulty`` reporting FULL; one workload on each node, ``wN``
    on node N."""
    return make_snapshot(nodes(faulty, names), down=down,
                         workloads=[submit(f"w{n}") for n in names],
                         assignments=[placed(f"w{n}", n, [0], epoch=10 + i)
                                      for i, n in enumerate(names)],
                         statuses=[status(f"w{n}", n, 10 + i) for i, n in enumerate(names)])


@pytest.mark.parametrize(("faulty", "down", "condition", "node_faults"), [
    pytest.param("abc", "", True, set(), id="3-of-4-cluster-condition"),
    pytest.param("abcd", "", True, set(), id="4-of-4-cluster-condition"),
    pytest.param("a", "", False, {"a"}, id="1-of-4-node-fault"),
    pytest.param("ab", "", False, {"a", "b"}, id="2-of-4-is-not-most"),
    pytest.param("ab", "d", True, set(), id="2-of-3-live-most"),
    pytest.param("a", "bcd", False, {"a"}, id="1-of-1-live-is-not-shared"),
])
def test_most_nodes_at_once_is_a_cluster_condition(faulty: str, down: str, condition: bool,
                                                   node_faults: set[str]) -> None:
    snap = cluster(faulty, down=down)
    first = assess_shared(SharedState(), snap, NOW)
    assert first.node_faults == {}  # nobody is a node fault before the settle time
    later = assess_shared(first.state, snap, NOW + SETTLE)
    assert set(later.node_faults) == node_faults
    assert all(reason == FULL.message for reason in later.node_faults.values())
    if condition:
        [found] = first.conditions
        assert (found.kind, found.resource, found.nodes) == (h.DISK_FULL, ROOT, tuple(faulty))
        assert [c.set for c in first.changes] == [True]
        assert later.conditions == first.conditions and later.changes == ()  # said once
        assert "49.9 MiB free of 50 MiB required" in first.changes[0].message
    else:
        assert first.conditions == later.conditions == () and first.changes == ()


def test_nodes_reporting_one_after_the_other_are_one_condition() -> None:
    """Agents' health cycles are not in step: a lone first reporter is not drained."""
    one = assess_shared(SharedState(), cluster("a"), NOW)
    assert one.node_faults == {} and one.conditions == ()
    most = assess_shared(one.state, cluster("abc"), NOW + SETTLE - 1)
    assert most.node_faults == {} and len(most.conditions) == 1
    assert assess_shared(most.state, cluster("abc"), NOW + 5 * SETTLE).node_faults == {}


def test_a_condition_clears_when_no_node_reports_it_and_rides_out_the_stragglers() -> None:
    state = assess_shared(SharedState(), cluster("abcd"), NOW).state
    straggler = assess_shared(state, cluster("d"), NOW + 100)  # a, b, c recovered first
    assert straggler.node_faults == {} and len(straggler.conditions) == 1
    assert straggler.changes == ()
    cleared = assess_shared(straggler.state, cluster(""), NOW + 101)
    assert cleared.conditions == () and [c.set for c in cleared.changes] == [False]
    assert "cleared" in cleared.changes[0].message


def test_a_lone_fault_left_after_the_condition_becomes_the_nodes_own() -> None:
    state = assess_shared(SharedState(), cluster("abcd"), NOW).state
    below = assess_shared(state, cluster("d"), NOW + 100)
    after = assess_shared(below.state, cluster("d"), NOW + 100 + SETTLE)
    assert after.conditions == () and [c.set for c in after.changes] == [False]
    assert set(after.node_faults) == {"d"}


def test_a_node_fault_is_applied_to_the_snapshot_and_moves_its_work() -> None:
    """1 of 4: the existing behaviour for a local disk full (checkpoint first, then move)."""
    snap = cluster("a")
    state = assess_shared(SharedState(), snap, NOW).state
    outcome = assess_shared(state, snap, NOW + SETTLE)
    decided = with_node_faults(snap, outcome.node_faults)
    assert decided.node_state("a") == "unhealthy"
    assert "49.9 MiB free of 50 MiB required" in decided.nodes["a"].reason
    moves = [(a.workload, a.event) for a in reconcile(decided, NOW + SETTLE).actions]
    assert moves == [("wa", "node-unhealthy")]


def test_a_cluster_condition_stops_and_moves_nothing() -> None:
    """Every node reports the shared fault: every node stays ready, nothing is decided."""
    snap = cluster("abcd")
    state = SharedState()
    for t in (NOW, NOW + SETTLE, NOW + 10 * SETTLE):
        outcome = assess_shared(state, snap, t)
        state = outcome.state
        decided = with_node_faults(snap, outcome.node_faults)
        assert decided is snap
        assert {decided.node_state(n) for n in "abcd"} == {"ready"}
        assert reconcile(decided, t).actions == ()


def test_a_new_workload_is_placed_during_a_cluster_condition() -> None:
    """REASON is never 'no ready nodes' because of a shared fault: the nodes are ready."""
    snap = make_snapshot(nodes("abcd"), workloads=[submit("new")])
    outcome = assess_shared(SharedState(), snap, NOW + SETTLE)
    [action] = reconcile(with_node_faults(snap, outcome.node_faults), NOW + SETTLE).actions
    assert action.kind == "place"


def test_a_dead_node_is_failed_over_whatever_it_reported() -> None:
    """Lease-based failover does not read findings: a down node's work moves."""
    snap = cluster("abcd", down="a")
    outcome = assess_shared(SharedState(), snap, NOW)
    assert outcome.conditions[0].nodes == ("b", "c", "d")
    decided = with_node_faults(snap, outcome.node_faults)
    assert [(a.workload, a.event) for a in reconcile(decided, NOW).actions] == \
        [("wa", "failover")]


def test_an_unhealthy_node_stays_unhealthy() -> None:
    """The rule never makes a node healthy: a node unhealthy for its own reasons (a GPU lost)
    stays so, whatever shared fault it also reports."""
    snap = cluster("abcd")
    sick = replace(snap.nodes["a"], healthy=False, reason="GPU 0: lost")
    snap = replace(snap, nodes={**snap.nodes, "a": sick})
    outcome = assess_shared(SharedState(), snap, NOW)
    decided = with_node_faults(snap, outcome.node_faults)
    assert decided.node_state("a") == "unhealthy" and decided.nodes["a"].reason == "GPU 0: lost"


def test_the_agent_splits_off_shareable_findings() -> None:
    full = Verdict(Finding(h.DISK_FULL, value=1.0, detail="x"), "drain-node", "nearly full")
    memory = Verdict(Finding(h.MEMORY_PRESSURE, value=90.0), "drain-node", "memory pressure")
    ignored = Verdict(Finding(h.DISK_READONLY, detail="x"), "ignore", "set by health.actions")
    kept, faults = split_verdicts([full, memory, ignored], ROOT)
    assert kept == (memory, ignored)
    assert faults == (ResourceFault(h.DISK_FULL, ROOT, full.reason),)


def test_the_agent_holds_a_fault_for_the_hold_down() -> None:
    held = hold({}, [FULL], 0.0, 10.0)
    assert list(hold(held, [], 9.0, 10.0).values()) == [(FULL, 0.0)]
    assert hold(held, [], 10.0, 10.0) == {}

"""Elastic capacity, pure: what blocks a node's removal (``hafo.decisions.removal``), the
pending demand as shapes and the removable nodes (``hafo.decisions.demand``), and when the
autoscale hook is called (``hafo.decisions.autoscale``): table tests."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.autoscale import HookState, after_call, due, started
from hafo.decisions.demand import (
    Demand,
    Removable,
    Shape,
    demand,
    observe_idle,
    pending_shapes,
    removable_nodes,
)
from hafo.decisions.removal import removal_refusal
from hafo.model.cluster import Assignment, ClusterSnapshot, Member
from hafo.model.queues import QueueSpec

from .conftest import make_node, make_snapshot, make_spec, placed, status, submit


def pending(wid: str) -> Assignment:
    return Assignment(workload=wid, phase="pending", epoch=3, reason="no room")


def gang(wid: str, *nodes: str) -> Assignment:
    members = tuple(Member(rank=i, node=n, gpus=(0,)) for i, n in enumerate(nodes))
    return Assignment(workload=wid, phase="placed", node=nodes[0], gpus=(0,), epoch=7,
                      members=members)


# --- removal -------------------------------------------------------------------------------

NODES = [make_node("a"), make_node("b"), make_node("c")]


@pytest.mark.parametrize(("snapshot", "node", "kind", "workloads", "words"), [
    (make_snapshot(NODES, down=["c"]), "c", None, (), ""),  # down, no work: at once
    (make_snapshot(NODES, down=["c"]), "zz", "unknown", (), "no node 'zz' (nodes: a, b, c)"),
    (make_snapshot(NODES), "c", "alive", (), "stop its agent first (systemctl stop "
                                              "hafo-agent), or it registers again"),
    (make_snapshot(NODES, down=["c"], workloads=[submit("w1"), submit("w2")],
                   assignments=[placed("w1", "c"), placed("w2", "c", [1])]),
     "c", "busy", ("w1", "w2"), "node c holds 2 workloads (w1, w2): drain it first"),
    # busy wins over alive: --drain knows to drain first
    (make_snapshot(NODES, workloads=[submit("w1")], assignments=[placed("w1", "c")]),
     "c", "busy", ("w1",), "holds 1 workload (w1)"),
    # a gang member holds it too
    (make_snapshot(NODES, down=["c"], workloads=[submit("g", nodes=2)],
                   assignments=[gang("g", "b", "c")]), "c", "busy", ("g",), "(g)"),
    # moving off it: its instance still runs there
    (make_snapshot(NODES, down=["c"], workloads=[submit("w1")],
                   assignments=[dataclasses.replace(placed("w1", "c"), phase="moving")]),
     "c", "busy", ("w1",), ""),
    # work that ended, or waits, holds nothing
    (make_snapshot(NODES, down=["c"], workloads=[submit("w1"), submit("w2")],
                   assignments=[Assignment(workload="w1", phase="completed", epoch=4),
                                pending("w2")]), "c", None, (), ""),
    # a cordoned, down node
    (make_snapshot(NODES, down=["c"], cordoned=["c"]), "c", None, (), ""),
])
def test_removal_refusal(snapshot: ClusterSnapshot, node: str, kind: str | None,
                         workloads: tuple[str, ...], words: str) -> None:
    refusal = removal_refusal(snapshot, node)
    if kind is None:
        assert refusal is None
        return
    assert refusal is not None
    assert (refusal.kind, refusal.workloads) == (kind, workloads)
    assert words in refusal.message


def test_removal_of_a_node_whose_expiry_is_unconfirmed_waits() -> None:
    snapshot = dataclasses.replace(make_snapshot(NODES, down=["c"]), expiring=frozenset({"c"}))
    refusal = removal_refusal(snapshot, "c")
    assert refusal is not None and refusal.kind == "alive"


def test_a_busy_node_names_at_most_five_workloads() -> None:
    subs = [submit(f"w{i}") for i in range(8)]
    snapshot = make_snapshot([make_node("a", 8)], down=["a"], workloads=subs,
                             assignments=[placed(f"w{i}", "a", [i]) for i in range(8)])
    refusal = removal_refusal(snapshot, "a")
    assert refusal is not None
    assert "holds 8 workloads (w0, w1, w2, w3, w4 and 3 more)" in refusal.message


# --- demand shapes -------------------------------------------------------------------------

FULL = [make_node("a", 8), make_node("b", 8)]


def busy(*extra: Any) -> dict[str, Any]:
    """Both nodes full (a 16-GPU gang), plus ``extra`` (submission, assignment) pairs."""
    subs = [submit("big", 8, nodes=2)] + [s for s, _ in extra]
    assigns = [gang("big", "a", "b")] + [a for _, a in extra]
    return {"workloads": subs, "assignments": assigns}


def shape(queue: str = "default", nodes: int = 1, gpus: int = 1, count: int = 1,
          model: str | None = None, profile: str | None = None) -> Shape:
    return Shape(queue, model, profile, nodes, gpus, count)


@pytest.mark.parametrize(("extra", "expected"), [
    ((), ()),
    # one single-node workload
    (((submit("w", 2), pending("w")),), (shape(gpus=2),)),
    # a gang of 4 x 8 is one shape, never 32 loose GPUs
    (((submit("g", 8, nodes=4), pending("g")),), (shape(nodes=4, gpus=8),)),
    # two of one shape are counted together
    (((submit("w1", 2), pending("w1")), (submit("w2", 2), pending("w2"))),
     (shape(gpus=2, count=2),)),
    # a MIG profile and a model glob are part of the shape
    (((submit("m", 2, gpu_profile="1g.10gb"), pending("m")),),
     (shape(gpus=2, profile="1g.10gb"),)),
    (((submit("h", 4, gpu_model="*H100*"), pending("h")),), (shape(gpus=4, model="*H100*"),)),
    # the queue too (no queue declared: no quota to wait on)
    (((submit("r", 1, queue="research"), pending("r")),), (shape("research"),)),
    # not yet tried (no assignment): not counted until the leader says it is pending
    (((submit("new", 2), None),), ()),
    # waiting on a restart backoff: its assignment is the placed one, not pending
    (((submit("w", 2), placed("w", "a", [0])),), ()),
])
def test_pending_shapes(extra: tuple[Any, ...], expected: tuple[Shape, ...]) -> None:
    kept = tuple((s, a) for s, a in extra if a is not None)
    subs = [s for s, a in extra if a is None]
    snap = make_snapshot(FULL, **busy(*kept))
    snap = dataclasses.replace(snap, workloads={**snap.workloads,
                                                **{s.id: s for s in subs}})
    assert pending_shapes(snap) == expected


def test_service_replicas_are_shapes_of_their_template() -> None:
    template = make_spec("svc", 1, replicas=3)
    service = submit("svc", spec=template)
    replicas = [dataclasses.replace(submit(f"svc.{i}", spec=dataclasses.replace(
        template, replicas=None)), service="svc") for i in range(3)]
    snap = make_snapshot(FULL, **busy(*((r, pending(r.id)) for r in replicas)))
    snap = dataclasses.replace(snap, workloads={**snap.workloads, "svc": service})
    assert pending_shapes(snap) == (shape(gpus=1, count=3),)


def test_a_preemptor_waiting_for_its_victims_is_no_demand() -> None:
    victim = dataclasses.replace(placed("low", "a", [0]), phase="moving", preempted_for="hi")
    snap = make_snapshot([make_node("a", 1)], workloads=[submit("low"), submit("hi")],
                         assignments=[victim, pending("hi")])
    assert pending_shapes(snap) == ()


def queued(*queues: QueueSpec, **kwargs: Any) -> ClusterSnapshot:
    snap = make_snapshot(FULL, **kwargs)
    return dataclasses.replace(snap, queues={q.name: q for q in queues})


def test_work_that_waits_on_its_quota_is_no_demand() -> None:
    # team-a has 4 GPUs of quota and uses 0: its first 4-GPU job is demand, the second
    # would exceed its quota (more nodes would not run it); team-b's queue is not declared.
    subs = [submit("a1", 4, queue="team-a", submitted_at=1), submit("a2", 4, queue="team-a",
                                                                     submitted_at=2),
            submit("b1", 1, queue="team-b")]
    snap = queued(QueueSpec(name="team-a", gpus=4), workloads=subs,
                  assignments=[pending(s.id) for s in subs])
    assert pending_shapes(snap) == (shape("team-a", gpus=4),)


def test_a_queue_without_quota_never_waits_on_one() -> None:
    subs = [submit(f"w{i}", 8, queue="open") for i in range(3)]
    snap = queued(QueueSpec(name="open"), workloads=subs,
                  assignments=[pending(s.id) for s in subs])
    assert pending_shapes(snap) == (shape("open", gpus=8, count=3),)


# --- removable nodes -----------------------------------------------------------------------

IDLE = [make_node("a", 8), make_node("b", 8), make_node("c", 8), make_node("d", 4)]


def test_idle_sightings_are_kept_while_idle_and_forgotten_after() -> None:
    snap = make_snapshot(IDLE, down=["d"], cordoned=["c"], workloads=[submit("w")],
                         assignments=[placed("w", "a")])
    seen = observe_idle({}, snap, 100.0)
    assert seen == {"b": 100.0}  # a busy, c cordoned, d down
    assert observe_idle(seen, snap, 130.0) == {"b": 100.0}
    busy_b = make_snapshot(IDLE, workloads=[submit("w")], assignments=[placed("w", "b")])
    assert "b" not in observe_idle(seen, busy_b, 140.0)
    # an instance reported there (not exited) is work too, assignment or not
    reported = make_snapshot(IDLE, statuses=[status("x", "b")])
    assert "b" not in observe_idle(seen, reported, 140.0)
    ended = make_snapshot(IDLE, statuses=[status("x", "b", state="exited", exit_code=0)])
    assert observe_idle(seen, ended, 140.0)["b"] == 100.0


@pytest.mark.parametrize(("now", "spares", "labels", "expected"), [
    (100.0, 0, {}, ()),  # nobody idle long enough
    (700.0, 0, {}, (Removable("a", 600.5), Removable("b", 300.5))),
    (700.0, 1, {}, (Removable("b", 300.5),)),  # the most-GPU idle node kept as a spare
    (700.0, 0, {"a": {"hafo.io/spare": "true"}}, (Removable("b", 300.5),)),
    # placement.spares counts idle nodes besides the labelled ones
    (700.0, 1, {"a": {"hafo.io/spare": "true"}}, ()),
])
def test_removable_nodes(now: float, spares: int, labels: dict[str, dict[str, str]],
                         expected: tuple[Removable, ...]) -> None:
    nodes = [make_node(n, 8, labels=labels.get(n)) for n in ("a", "b")]
    snap = make_snapshot(nodes)
    sightings = {"a": 99.5, "b": 399.5}
    out = removable_nodes(snap, sightings, now, idle_after=300.0, spares=spares)
    assert out == expected


def test_an_idle_node_a_pending_shape_would_use_is_not_removable() -> None:
    # a 2-node gang waits; one node is idle: it and one new node will run it
    nodes = [make_node("a", 8), make_node("b", 4)]
    snap = make_snapshot(nodes, workloads=[submit("g", 8, nodes=2)],
                         assignments=[pending("g")])
    assert removable_nodes(snap, {"a": 0.0, "b": 0.0}, 1000.0, 600.0) == (
        Removable("b", 1000.0),)


def test_demand_json() -> None:
    snap = make_snapshot([make_node("a", 8)], workloads=[submit("g", 8, nodes=4)],
                         assignments=[pending("g")])
    body = demand(snap, {"a": 0.0}, 10.0, 5.0).to_dict(1234.5678)
    assert body == {"pending": [{"queue": "default", "gpu_model": None, "gpu_profile": None,
                                 "nodes": 4, "gpus_per_node": 8, "count": 1}],
                    "removable": [], "at": 1234.568}


# --- when to call the hook -----------------------------------------------------------------

A = Demand((shape(gpus=2),))
B = Demand((), (Removable("x", 700.0),))


@pytest.mark.parametrize(("state", "demand_", "now", "expected"), [
    (HookState(), Demand(), 0.0, False),  # nothing pending, nothing removable: no news
    (HookState(), A, 0.0, True),
    (HookState(delivered=A.key, last_start=0.0), A, 100.0, False),  # taken already
    (HookState(delivered=A.key, last_start=0.0), B, 10.0, False),  # within the interval
    (HookState(delivered=A.key, last_start=0.0), B, 30.0, True),
    (HookState(delivered=A.key, last_start=0.0, running=True), B, 100.0, False),
    # idle times alone are no news
    (HookState(delivered=B.key, last_start=0.0), Demand((), (Removable("x", 900.0),)), 99.0,
     False),
    (HookState(delivered=A.key, last_start=0.0), Demand(), 40.0, True),  # back to nothing
])
def test_due(state: HookState, demand_: Demand, now: float, expected: bool) -> None:
    assert due(state, demand_.key, now, interval=30.0) is expected


def test_a_failed_call_is_logged_once_and_tried_again_after_the_interval() -> None:
    state = started(HookState(), 0.0)
    state, log = after_call(state, A.key, ok=False)
    assert log and not state.running
    assert not due(state, A.key, 10.0, 30.0)
    assert due(state, A.key, 30.0, 30.0)
    state, log = after_call(started(state, 30.0), A.key, ok=False)
    assert not log  # the same demand failed again: said already
    state, log = after_call(started(state, 60.0), B.key, ok=False)
    assert log  # a new demand failing is news
    state, log = after_call(started(state, 90.0), B.key, ok=True)
    assert not log and state.delivered == B.key
    assert not due(state, B.key, 500.0, 30.0)

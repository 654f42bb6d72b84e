"""Fair share by decayed usage history (``fair_sharing.usage_half_life``): the decay, the
entry penalty, the order it gives, the setting, and the leader's stored copy. Table-driven,
with an injected clock; the controller parts on the in-memory store."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from hafo.controller.fair_share import FairShareHistory
from hafo.decisions.fair_order import admission_order
from hafo.decisions.plan import Action, Cause, Plan
from hafo.decisions.reconcile import reconcile
from hafo.decisions.usage_history import (
    QueueHistory,
    UsageHistory,
    admitted,
    decay_factor,
    penalized,
    sampled,
)
from hafo.model.config import parse_config
from hafo.model.errors import ValidationError
from hafo.store import Election, Keys
from hafo.store.fair_share import decode_usage_history, read_usage_history
from hafo.store.memory import MemoryStore

from .conftest import placed, submit
from .test_quota import COHORT_AB, pool, q, quotas, request

T = 600.0  # the half-life of these tests, in seconds
NOW = 10_000.0


def history(at: float | None = NOW, **queues: tuple[float, float]) -> UsageHistory:
    return UsageHistory(at, {name: QueueHistory(*v) for name, v in queues.items()})


# -- the decay ----------------------------------------------------------------------------

@pytest.mark.parametrize(("dt", "factor"), [
    (0.0, 1.0),
    (T, 0.5),                 # one half-life halves
    (2 * T, 0.25),
    (T / 2, 2 ** -0.5),
    (-50.0, 1.0),             # a clock stepped back decays nothing
    (math.nan, 1.0),
    (1e300, 0.0),             # a huge step forgets everything, no overflow
    (math.inf, 0.0),
])
def test_decay_factor(dt: float, factor: float) -> None:
    assert decay_factor(dt, T) == pytest.approx(factor)


@pytest.mark.parametrize("half_life", [0.0, -1.0, math.nan, math.inf])
def test_decay_factor_refuses_a_half_life_that_is_not_one(half_life: float) -> None:
    with pytest.raises(ValueError, match="half_life"):
        decay_factor(1.0, half_life)


@pytest.mark.parametrize(("before", "now", "usage", "after"), [
    # First sample: starts at the usage now (as the instantaneous rule).
    (UsageHistory(), NOW, {"a": 8.0}, history(a=(8.0, 0.0))),
    # Zero usage decays: halves after a half-life, a quarter after two.
    (history(a=(8.0, 0.0)), NOW + T, {}, history(NOW + T, a=(4.0, 0.0))),
    (history(a=(8.0, 0.0)), NOW + 2 * T, {"a": 0.0}, history(NOW + 2 * T, a=(2.0, 0.0))),
    # Usage that starts counts half after a half-life.
    (history(a=(0.0, 0.0)), NOW + T, {"a": 8.0}, history(NOW + T, a=(4.0, 0.0))),
    # Steady usage stays where it is.
    (history(a=(8.0, 0.0)), NOW + 123.0, {"a": 8.0}, history(NOW + 123.0, a=(8.0, 0.0))),
    # The entry penalty decays as the usage comes in: their sum stays the charge.
    (history(a=(0.0, 8.0)), NOW + T, {"a": 8.0}, history(NOW + T, a=(4.0, 4.0))),
    # The clock stepped back: nothing decays, the history is anchored at the new time.
    (history(a=(8.0, 2.0)), NOW - 500.0, {"a": 0.0}, history(NOW - 500.0, a=(8.0, 2.0))),
    # A huge step: only the usage now is left.
    (history(a=(8.0, 2.0)), NOW + 1e12, {"a": 3.0}, history(NOW + 1e12, a=(3.0, 0.0))),
    # Not a number: unchanged.
    (history(a=(8.0, 2.0)), math.nan, {"a": 3.0}, history(a=(8.0, 2.0))),
    # Usage that is not a number of GPUs counts as none.
    (history(a=(8.0, 0.0)), NOW + T, {"a": math.nan}, history(NOW + T, a=(4.0, 0.0))),
    (history(a=(8.0, 0.0)), NOW + T, {"a": -5.0}, history(NOW + T, a=(4.0, 0.0))),
    # A queue first seen starts at its usage now.
    (history(a=(8.0, 0.0)), NOW + T, {"b": 2.0}, history(NOW + T, a=(4.0, 0.0), b=(2.0, 0.0))),
])
def test_advance(before: UsageHistory, now: float, usage: dict[str, float],
                 after: UsageHistory) -> None:
    got = before.advance(now, usage, T)
    assert (got.at is None and after.at is None) or got.at == after.at
    assert got.queues.keys() == after.queues.keys()
    for name, expected in after.queues.items():
        assert got.queues[name].average == pytest.approx(expected.average)
        assert got.queues[name].penalty == pytest.approx(expected.penalty)


def test_advance_keeps_only_the_declared_queues() -> None:
    got = history(a=(1.0, 0.0), gone=(5.0, 1.0)).advance(NOW + 1, {"x": 3.0}, T,
                                                         declared=["a", "b"])
    assert sorted(got.queues) == ["a", "b"]  # "gone" forgotten, undeclared "x" never kept


def test_a_running_workload_counts_its_charge_from_admission_on() -> None:
    """Admitted at once in full (the penalty), then the sampled usage takes over: the
    effective usage stays the charge, every cycle, until it ends; then it fades."""
    state = history(a=(0.0, 0.0)).penalize("a", 4.0)
    assert state.effective() == {"a": 4.0}
    for cycle in range(1, 50):
        state = state.advance(NOW + 7.0 * cycle, {"a": 4.0}, T)
        assert state.effective()["a"] == pytest.approx(4.0)
    ended = state.advance(state.at + T, {}, T)  # type: ignore[operator]
    assert ended.effective()["a"] == pytest.approx(2.0)


@pytest.mark.parametrize(("queue", "amount", "penalty"), [
    ("a", 2.0, 3.0),
    ("a", 0.0, 1.0),
    ("a", -4.0, 1.0),        # not a charge: nothing
    ("a", math.inf, 1.0),
    ("nope", 2.0, None),     # not declared at the last sample: left out
])
def test_penalize(queue: str, amount: float, penalty: float | None) -> None:
    got = history(a=(5.0, 1.0)).penalize(queue, amount)
    assert got.queues["a"].average == 5.0
    assert (got.queues[queue].penalty if queue in got.queues else None) == penalty


# -- the order ----------------------------------------------------------------------------

def test_history_orders_the_borrowers_instead_of_the_usage_now() -> None:
    """Both borrow now, a more (3 over its quota, b 1): by the usage now b goes first; a's
    history is low (its usage is new), b's high (it borrowed long): a goes first."""
    requests = [request("a1", at=1), request("b1", "b", at=2)]
    state = quotas({"a": 6, "b": 4}, *COHORT_AB)
    assert [r.workload for r in admission_order(requests, state)] == ["b1", "a1"]
    by_history = admission_order(requests, state, history={"a": 4.0, "b": 7.0})
    assert [r.workload for r in by_history] == ["a1", "b1"]
    # A queue not in the history counts its usage now (a: 3 above, not 0 above).
    assert [r.workload for r in admission_order(requests, state, history={"b": 3.0})] \
        == ["b1", "a1"]


def test_history_does_not_change_who_is_within_its_quota() -> None:
    """a is within its quota now, b borrows: a first, whatever their histories (a's high,
    b's none); a1 alone is entitled to reclaim."""
    requests = [request("b1", "b", priority=9), request("a1")]
    state = quotas({"b": 4}, *COHORT_AB)
    order = admission_order(requests, state, history={"a": 50.0, "b": 0.0})
    assert [r.workload for r in order] == ["a1", "b1"]
    assert state.entitled == {"a1"}


@pytest.mark.parametrize("seed", range(20))
def test_the_history_changes_the_order_between_queues_only(seed: int) -> None:
    """Each queue's own requests come in the same order with or without a history (so a
    waiting workload's place in its queue, and who is entitled, are the same)."""
    rng = random.Random(seed)
    queues = (q("a", 4, cohort="c"), q("b", 2, cohort="c", weight=2), q("d", 6, cohort="c"))
    requests = [request(f"r{i}", rng.choice("abd"), rng.choice([1, 2, 4, 9]),
                        priority=rng.choice([0, 0, 5]), at=float(rng.randrange(50)))
                for i in range(12)]
    used = {name: float(rng.randrange(8)) for name in "abd"}
    plain = quotas(used, *queues)
    without = admission_order(requests, plain)
    with_history = quotas(used, *queues)
    history = {name: rng.uniform(0, 12) for name in "abd"}
    by_history = admission_order(requests, with_history, history=history)
    for name in "abd":
        assert [r.workload for r in without if r.spec.queue == name] \
            == [r.workload for r in by_history if r.spec.queue == name]
    assert plain.entitled == with_history.entitled


def test_a_burst_does_not_all_get_in_before_another_queue() -> None:
    """Equal histories; a sends 4 borrowing requests, older than b's one: a's first goes
    first (older), then b's, then a's others (each counted on top of those before it)."""
    requests = [request(f"a{i}", at=i) for i in range(1, 5)] + [request("b1", "b", at=10)]
    state = quotas({"a": 4, "b": 4}, *COHORT_AB)
    order = admission_order(requests, state, history={"a": 4.0, "b": 4.0})
    assert [r.workload for r in order] == ["a1", "b1", "a2", "a3", "a4"]


def test_the_entry_penalty_counts_the_burst_admitted_last_cycle() -> None:
    """Last cycle a's burst of 3 was admitted (not yet sampled); this cycle b's request
    goes before a's next one, though a's is older."""
    snapshot = pool(COHORT_AB, nodes=3, workloads=tuple(
        submit(f"a{i}", 1, queue="a", submitted_at=float(i)) for i in range(1, 5)))
    plan = Plan(tuple(Action(kind="place", workload=f"a{i}", cause=Cause.NEW, why="",
                             expected_revision=0, assignment=placed(f"a{i}", "n1"))
                      for i in range(1, 4)))
    assert admitted(plan, snapshot) == {"a": 3.0}
    state = penalized(history(a=(4.0, 0.0), b=(4.0, 0.0)), admitted(plan, snapshot))
    requests = [request("a4", at=4), request("b1", "b", at=10)]
    order = admission_order(requests, quotas({"a": 4, "b": 4}, *COHORT_AB),
                            history=state.effective())
    assert [r.workload for r in order] == ["b1", "a4"]


def test_a_failover_pays_no_entry_penalty() -> None:
    """Work that held GPUs already (placed again after a failover) is in the usage."""
    snapshot = pool(COHORT_AB, workloads=(submit("a1", 2, queue="a"),),
                    assignments=(placed("a1", "n1", (0, 1)),))
    plan = Plan((Action(kind="place", workload="a1", cause=Cause.NEW, why="",
                        expected_revision=0, assignment=placed("a1", "n2", (0, 1))),))
    assert admitted(plan, snapshot) == {}


def test_reconcile_orders_by_the_history_given() -> None:
    """Room for one more; a borrows 1 now, b none: by the usage now b3 gets it (a4 would
    borrow 2, b3 1); with b's history higher (it borrowed much of late), a4 does."""
    queues = (q("a", 2, cohort="c"), q("b", 2, cohort="c"), q("idle", 4, cohort="c"))
    workloads = [submit(w, 1, queue=w[0], submitted_at=float(i))
                 for i, w in enumerate(["a1", "a2", "a3", "b1", "b2"])]
    workloads += [submit("a4", 1, queue="a", submitted_at=10.0),
                  submit("b3", 1, queue="b", submitted_at=11.0)]
    running = [placed("a1", "n1", (0,)), placed("a2", "n1", (1,)), placed("a3", "n1", (2,)),
               placed("b1", "n1", (3,)), placed("b2", "n2", (0,))]
    # n2 keeps one GPU free, and the pool (8) one GPU: room for one of a4 and b3
    busy = pool(queues, nodes=2, gpus=4, workloads=(*workloads, submit("x", 2, queue="idle")),
                assignments=(*running, placed("x", "n2", (1, 2))))

    def placed_now(usage_history: dict[str, float] | None) -> list[str]:
        plan = reconcile(busy, NOW, min_runtime=0.0, usage_history=usage_history)
        return sorted(a.workload for a in plan.actions if a.kind == "place")

    assert placed_now(None) == ["b3"]  # b borrows less now
    assert placed_now({"a": 3.0, "b": 6.0}) == ["a4"]  # b borrowed more of late


# -- the setting --------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "error"), [
    (600, None),
    (0.5, None),
    (30 * 24 * 3600, None),
    (0, "fair_sharing.usage_half_life: must be > 0"),
    (-60, "fair_sharing.usage_half_life: must be > 0"),
    (30 * 24 * 3600 + 1, "fair_sharing.usage_half_life: is 2.592e+06 s; at most 2592000 s"),
    ("10m", "fair_sharing.usage_half_life: must be a number"),
    (True, "fair_sharing.usage_half_life: must be a number"),
    (math.inf, "fair_sharing.usage_half_life: must be a finite number"),
])
def test_the_setting(value: Any, error: str | None) -> None:
    raw = {"controller": {"name": "c1"}, "fair_sharing": {"usage_half_life": value}}
    if error is None:
        assert parse_config(raw, "controller").fair_sharing.usage_half_life == value
        return
    with pytest.raises(ValidationError) as caught:
        parse_config(raw, "controller")
    assert str(caught.value).startswith(error), str(caught.value)


def test_the_setting_is_off_by_default() -> None:
    assert parse_config({"controller": {"name": "c1"}}, "controller") \
        .fair_sharing.usage_half_life is None


# -- the stored form and the leader's copy ------------------------------------------------

def test_the_stored_form_round_trips() -> None:
    state = history(a=(4.25, 1.5), b=(0.0, 0.0))
    assert UsageHistory.from_dict(state.to_dict()) == state
    assert UsageHistory.from_dict(UsageHistory().to_dict()) == UsageHistory()


@pytest.mark.parametrize(("value", "error"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[]", "format"),
    (b'{"format": 2, "queues": {}}', "format"),
    (b'{"format": 1, "at": "x", "queues": {}}', "at"),
    (b'{"format": 1, "at": 1, "queues": []}', "queues"),
    (b'{"format": 1, "at": 1, "queues": {"a": 3}}', "queues.a"),
    (b'{"format": 1, "at": 1, "queues": {"a": {"average": -1}}}', "queues.a.average"),
    (b'{"format": 1, "at": 1, "queues": {"a": {"penalty": "x"}}}', "queues.a.penalty"),
])
def test_a_corrupt_stored_value_is_refused_saying_what(value: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        decode_usage_history(value)


async def leading(store: MemoryStore, keys: Keys) -> Election:
    lease, _ttl = await store.grant_lease(30)
    election = Election(store, keys.leader, "ctl-1")
    await election.campaign(lambda: lease)
    return election


async def test_a_new_leader_goes_on_from_the_stored_history() -> None:
    store, keys = MemoryStore(), Keys("unit")
    election = await leading(store, keys)
    snapshot = pool(COHORT_AB, workloads=(submit("a1", 4, queue="a"),),
                    assignments=(placed("a1", "n1", (0, 1, 2, 3)),))
    first = FairShareHistory(store, keys, T, save_every=10.0)
    assert await first.before_cycle(snapshot, NOW) == {"a": 4.0, "b": 0.0}
    assert await first.save(election, NOW)
    assert not await first.save(election, NOW + 5)  # at most every 10 s
    idle = pool(COHORT_AB)
    await first.before_cycle(idle, NOW + T)
    assert await first.save(election, NOW + T)
    stored = await read_usage_history(store, keys)
    assert stored is not None and stored.effective() == {"a": 2.0, "b": 0.0}
    second = FairShareHistory(store, keys, T)  # takes office: reads it, goes on
    assert await second.before_cycle(idle, NOW + 2 * T) == {"a": 1.0, "b": 0.0}


async def test_a_corrupt_stored_history_is_ignored_once_and_overwritten() -> None:
    store, keys = MemoryStore(), Keys("unit")
    election = await leading(store, keys)
    await store.put(keys.fair_share, b"\x00garbage")
    keeper = FairShareHistory(store, keys, T)
    snapshot = pool(COHORT_AB, workloads=(submit("b1", 2, queue="b"),),
                    assignments=(placed("b1", "n1", (0, 1)),))
    assert await keeper.before_cycle(snapshot, NOW) == {"a": 0.0, "b": 2.0}  # afresh
    assert await keeper.before_cycle(snapshot, NOW + 1) == {"a": 0.0, "b": 2.0}
    assert await keeper.save(election, NOW + 1)
    assert await read_usage_history(store, keys) is not None


async def test_off_it_does_nothing() -> None:
    store, keys = MemoryStore(), Keys("unit")
    election = await leading(store, keys)
    keeper = FairShareHistory(store, keys, None)
    assert await keeper.before_cycle(pool(COHORT_AB), NOW) is None
    keeper.after_plan(Plan(()), pool(COHORT_AB))
    assert not await keeper.save(election, NOW)
    assert await store.get(keys.fair_share) is None


async def test_the_entry_penalty_of_an_applied_plan() -> None:
    store, keys = MemoryStore(), Keys("unit")
    keeper = FairShareHistory(store, keys, T)
    snapshot = pool(COHORT_AB, workloads=(submit("a1", 3, queue="a"),))
    await keeper.before_cycle(snapshot, NOW)
    keeper.after_plan(None, snapshot)  # nothing applied: no penalty
    assert keeper.history is not None and keeper.history.effective()["a"] == 0.0
    plan = Plan((Action(kind="place", workload="a1", cause=Cause.NEW, why="",
                        expected_revision=0, assignment=placed("a1", "n1", (0, 1, 2))),))
    keeper.after_plan(plan, snapshot)
    assert keeper.history.effective()["a"] == 3.0
    running = dataclasses.replace(snapshot, assignments={"a1": placed("a1", "n1", (0, 1, 2))})
    effective = await keeper.before_cycle(running, NOW + 5)
    assert effective is not None and effective["a"] == pytest.approx(3.0)
    assert sampled(keeper.history, running, NOW + 5, T).effective()["a"] == pytest.approx(3.0)


async def test_the_metric_is_the_leaders_effective_usage() -> None:
    from prometheus_client import CollectorRegistry

    from hafo.controller.fair_share import register_history_metrics

    store, keys = MemoryStore(), Keys("unit")
    keeper = FairShareHistory(store, keys, T)
    leads = [True]
    registry = CollectorRegistry()
    register_history_metrics(registry, keeper, lambda: leads[0])
    name = "hafo_queue_usage_history_gpus"
    assert registry.get_sample_value(name, {"queue": "b"}) is None  # nothing read yet
    await keeper.before_cycle(pool(COHORT_AB, workloads=(submit("b1", 2, queue="b"),),
                                   assignments=(placed("b1", "n1", (0, 1)),)), NOW)
    assert registry.get_sample_value(name, {"queue": "b"}) == 2.0
    leads[0] = False
    assert registry.get_sample_value(name, {"queue": "b"}) is None

"""How often the leader computes its demand: at most once a second, and at most
``DEMAND_SHARE`` of its time (the demand repeats admission over every pending workload on the
controller's event loop)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import hafo.controller.daemon as daemon
from hafo.controller.daemon import DEMAND_EVERY, DEMAND_SHARE, Controller
from hafo.decisions.demand import Demand
from hafo.model.config import parse_config

from .conftest import make_node, make_snapshot


@pytest.mark.parametrize("cost", [0.0, 0.1])
async def test_the_demand_is_computed_at_most_once_a_second_and_within_its_share(
        monkeypatch: pytest.MonkeyPatch, cost: float) -> None:
    """A cheap demand: again after DEMAND_EVERY; one that took ``cost`` seconds: not again
    before ``cost / DEMAND_SHARE`` (2 s for 0.1 s)."""
    calls: list[float] = []

    def slow_demand(snapshot: Any, idle: Any, now: float, *args: Any) -> Demand:
        calls.append(now)
        time.sleep(cost)
        return Demand()

    monkeypatch.setattr(daemon, "demand", slow_demand)
    config = parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                           "controller": {"name": "ctl-1"}}, "controller")
    controller = Controller(config)
    try:
        snapshot = make_snapshot([make_node("n1")])
        wait = max(DEMAND_EVERY, cost / DEMAND_SHARE)
        controller._elastic_step(snapshot, 100.0)
        controller._elastic_step(snapshot, 100.0 + DEMAND_EVERY / 2)
        assert calls == [100.0]
        if cost:
            controller._elastic_step(snapshot, 100.0 + wait - 0.2)
            assert calls == [100.0]  # the costly demand waits its share
        controller._elastic_step(snapshot, 110.0)  # (a sleep of 0.1 s may take longer)
        assert calls == [100.0, 110.0]
    finally:
        await controller.store.close()

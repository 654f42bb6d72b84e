"""Whether a parked warm member's process may become an instance (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from hafo.decisions.handover import adoption_refusal, relaunch_refusal
from hafo.model.spec import parse_spec

SPEC = parse_spec({"name": "g", "nodes": 2, "warm": True, "command": ["python", "t.py"],
                   "env": {"A": "1"}})
LAUNCH = {"argv": ["python", "t.py"], "cwd": "/w", "warm_dir": "/s/warm/g.5",
          "env": {"A": "1", "CUDA_VISIBLE_DEVICES": "0,1"}}


@pytest.mark.parametrize(("change", "gpus", "refusal"), [
    ({}, ["0", "1"], ""),
    ({"warm_dir": None}, ["0", "1"], "not a warm member"),
    ({"argv": ["python", "other.py"]}, ["0", "1"], "its command changed"),
    ({"cwd": "/elsewhere"}, ["0", "1"], "its command changed"),
    ({}, ["2", "3"], "its GPUs changed"),
    ({"env": {"A": "2", "CUDA_VISIBLE_DEVICES": "0,1"}}, ["0", "1"], "its environment changed"),
    ({"env": "not a mapping"}, ["0", "1"], "its GPUs changed"),
])
def test_relaunch_refusal(change: dict[str, Any], gpus: list[str], refusal: str) -> None:
    assert relaunch_refusal({**LAUNCH, **change}, SPEC, "/w", gpus) == refusal


def test_a_gang_that_is_no_longer_warm_is_not_handed_over() -> None:
    cold = parse_spec({"name": "g", "nodes": 2, "command": ["python", "t.py"]})
    assert relaunch_refusal(LAUNCH, cold, "/w", ["0", "1"]) == "not a warm member"


CURRENT = {"workload": "g", "node": "n1", "warm_dir": "/s/warm/g.5", "epoch": 5}


@pytest.mark.parametrize(("target", "refusal"), [
    ({**CURRENT, "epoch": 9}, ""),
    (None, "no launch file in the target"),
    ({**CURRENT, "epoch": 9, "workload": "h"}, "another workload"),
    ({**CURRENT, "epoch": 9, "node": "n2"}, "another node"),
    ({**CURRENT, "epoch": 9, "warm_dir": "/s/warm/other"}, "another warm_dir"),
    ({**CURRENT, "epoch": 5}, "not a later epoch"),
    ({**CURRENT, "epoch": "9"}, "not a later epoch"),
])
def test_adoption_refusal(target: dict[str, Any] | None, refusal: str) -> None:
    assert adoption_refusal(CURRENT, target) == refusal

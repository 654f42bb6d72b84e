"""The agent's per-pass instance decision (pure)."""

from __future__ import annotations

import pytest

from hafo.decisions.instances import Instance, InstancePlan, plan_instances


@pytest.mark.parametrize(("desired", "running", "may_start", "expected"), [
    pytest.param([("a", 5)], {}, True, InstancePlan((), (("a", 5),)), id="start-new"),
    pytest.param([("a", 5)], {}, False, InstancePlan((), ()), id="fenced-no-start"),
    pytest.param([("a", 5)], {("a", 5): True}, True, InstancePlan((), ()), id="running"),
    pytest.param([("a", 5)], {("a", 5): False}, True, InstancePlan((), ()),
                 id="exited-never-restarted-at-same-epoch"),
    pytest.param([], {("a", 5): True}, True, InstancePlan((("a", 5),), ()), id="unassigned"),
    pytest.param([], {("a", 5): False}, True, InstancePlan((), ()), id="unassigned-exited"),
    pytest.param([("a", 9)], {("a", 5): True}, True, InstancePlan((("a", 5),), ()),
                 id="new-epoch-waits-for-old-to-stop"),
    pytest.param([("a", 9)], {("a", 5): False}, True, InstancePlan((), (("a", 9),)),
                 id="new-epoch-after-old-exited"),
    pytest.param([("b", 2), ("a", 3)], {}, True, InstancePlan((), (("a", 3), ("b", 2))),
                 id="sorted"),
    pytest.param([("a", 3)], {("b", 1): True}, False, InstancePlan((("b", 1),), ()),
                 id="stop-even-when-fenced"),
])
def test_plan_instances(desired: list[Instance], running: dict[Instance, bool],
                        may_start: bool, expected: InstancePlan) -> None:
    assert plan_instances(desired, running, may_start) == expected

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


# Warm gangs: park requests, parked members and hand-overs (``park``: what the controller asked
# to park, ``parked``: what confirmed it).
@pytest.mark.parametrize(("desired", "running", "may_start", "park", "parked", "expected"), [
    pytest.param([], {("g", 5): True}, True, {"g": 5}, [],
                 InstancePlan((), (), park=(("g", 5),)), id="asked-to-park"),
    pytest.param([], {("g", 7): True}, True, {"g": 5}, [("g", 7)],
                 InstancePlan((), ()), id="a-standby-of-a-later-epoch-stays-parked"),
    pytest.param([], {("g", 4): True}, True, {"g": 5}, [],
                 InstancePlan((("g", 4),), ()), id="an-older-epoch-is-not-asked"),
    pytest.param([], {("g", 5): True}, True, {}, [],
                 InstancePlan((("g", 5),), ()), id="not-asked-stops"),
    pytest.param([], {("g", 5): True}, True, {"g": 5}, [("g", 5)],
                 InstancePlan((), ()), id="parked-waits-for-next-epoch"),
    pytest.param([], {("g", 5): True}, True, {}, [("g", 5)],
                 InstancePlan((("g", 5),), ()), id="parked-but-gang-went-on-without-it"),
    pytest.param([("g", 9)], {("g", 5): True}, True, {}, [("g", 5)],
                 InstancePlan((), (), hand_over=((("g", 5), ("g", 9)),)), id="hand-over"),
    pytest.param([("g", 9)], {("g", 5): True}, False, {}, [("g", 5)],
                 InstancePlan((), ()), id="no-hand-over-while-no-start-kept-parked"),
    pytest.param([("g", 9)], {("g", 5): True, ("g", 9): True}, True, {}, [("g", 5)],
                 InstancePlan((), ()), id="hand-over-under-way"),
    pytest.param([("g", 9)], {("g", 5): True, ("g", 9): False}, True, {}, [("g", 5)],
                 InstancePlan((("g", 5),), ()), id="hand-over-failed-parked-stops"),
    pytest.param([("g", 9)], {("g", 5): True, ("g", 4): True}, True, {}, [("g", 5)],
                 InstancePlan((("g", 4), ("g", 5)), ()), id="another-live-instance-no-hand-over"),
    pytest.param([("g", 9)], {("g", 5): True}, True, {"g": 5}, [],
                 InstancePlan((("g", 5),), ()), id="never-confirmed-and-next-epoch-stops"),
    pytest.param([("g", 9)], {("g", 5): False}, True, {}, [("g", 5)],
                 InstancePlan((), (("g", 9),)), id="parked-then-exited-starts-anew"),
    pytest.param([("g", 9)], {("g", 12): True}, True, {}, [("g", 12)],
                 InstancePlan((("g", 12),), ()), id="never-handed-to-an-older-epoch"),
])
def test_plan_warm_members(desired: list[Instance], running: dict[Instance, bool],
                           may_start: bool, park: dict[str, int], parked: list[Instance],
                           expected: InstancePlan) -> None:
    assert plan_instances(desired, running, may_start, park=park, parked=parked) == expected

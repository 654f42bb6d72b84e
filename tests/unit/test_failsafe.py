"""Failsafe rules (pure): set maintenance, who may lead, when an agent may keep work."""

from __future__ import annotations

import pytest

from hafo.decisions.failsafe import may_extend, may_lead, updated_set
from hafo.model.cluster import FailsafeSet

TWO = FailsafeSet(2, {"c1": {"api": "http://a", "since": 1}, "c2": {"api": "http://b",
                                                                    "since": 2}})


@pytest.mark.parametrize(("current", "registered", "expected"), [
    pytest.param(FailsafeSet(), {}, None, id="nothing-registered"),
    pytest.param(FailsafeSet(), {"c1": "http://a"},
                 FailsafeSet(1, {"c1": {"api": "http://a", "since": 1}}), id="bootstrap"),
    pytest.param(TWO, {"c1": "http://a", "c2": "http://b"}, None, id="unchanged"),
    pytest.param(TWO, {"c1": "http://a"}, None, id="absent-member-kept"),
    pytest.param(TWO, {"c1": "http://a2", "c2": "http://b"},
                 FailsafeSet(3, {"c1": {"api": "http://a2", "since": 1},
                                 "c2": {"api": "http://b", "since": 2}}), id="new-address"),
    pytest.param(TWO, {"c3": "http://c"},
                 FailsafeSet(3, {**TWO.members, "c3": {"api": "http://c", "since": 3}}),
                 id="added-with-new-version"),
])
def test_updated_set(current: FailsafeSet, registered: dict[str, str],
                     expected: FailsafeSet | None) -> None:
    assert updated_set(current, registered) == expected


@pytest.mark.parametrize(("name", "current", "acks", "in_set_for", "expected"), [
    pytest.param("c9", FailsafeSet(), {"n1": 0}, None, True, id="bootstrap-anyone"),
    pytest.param("c9", TWO, {"n1": 2}, None, False, id="not-a-member"),
    pytest.param("c2", TWO, {"n1": 2, "n2": 5}, None, True, id="every-node-acked"),
    pytest.param("c2", TWO, {"n1": 2, "n2": 1}, 10.0, False, id="a-node-has-not-acked"),
    pytest.param("c2", TWO, {"n1": 2, "n2": 1}, 305.0, True, id="waited-failsafe-max"),
    pytest.param("c1", TWO, {"n1": 1, "n2": 1}, None, True, id="old-member"),
    pytest.param("c2", TWO, {}, None, True, id="no-nodes"),
])
def test_may_lead(name: str, current: FailsafeSet, acks: dict[str, int],
                  in_set_for: float | None, expected: bool) -> None:
    assert may_lead(name, current, acks, in_set_for, failsafe_max=300.0) is expected


@pytest.mark.parametrize(("answers", "since_contact", "expected"), [
    pytest.param({"c1": "unavailable", "c2": "unavailable"}, 5.0, True, id="all-confirm"),
    pytest.param({"c1": "unavailable", "c2": "available"}, 5.0, False, id="one-reaches-etcd"),
    pytest.param({"c1": "unavailable", "c2": None}, 5.0, False, id="one-silent"),
    pytest.param({"c1": "unavailable"}, 5.0, False, id="one-missing"),
    pytest.param({"c1": "unavailable", "c2": "unavailable"}, 300.0, False, id="too-long"),
])
def test_may_extend(answers: dict[str, str | None], since_contact: float,
                    expected: bool) -> None:
    assert may_extend(answers, {"c1", "c2"}, since_contact, failsafe_max=300.0) is expected


def test_may_extend_needs_a_set() -> None:
    assert not may_extend({}, set(), 1.0, 300.0)

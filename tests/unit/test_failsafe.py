"""Failsafe rules (pure): set maintenance, who may lead, when an agent may keep work."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from hafo.agent.failsafe import AgentFailsafe
from hafo.controller.failsafe import ControllerFailsafe
from hafo.decisions.failsafe import (
    failsafe_deadline,
    may_extend,
    may_lead,
    promise_hold,
    recovery_window,
    updated_set,
)
from hafo.model.cluster import FailsafeSet
from hafo.store import Keys

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
    pytest.param({"c1": "recovering", "c2": "unavailable"}, 5.0, True, id="one-recovering"),
    pytest.param({"c1": "recovering", "c2": "recovering"}, 5.0, True, id="all-recovering"),
    pytest.param({"c1": "recovering", "c2": "available"}, 5.0, False, id="recovering-and-not"),
    pytest.param({"c1": "recovering", "c2": "RECOVERING"}, 5.0, False, id="unknown-answer"),
])
def test_may_extend(answers: dict[str, str | None], since_contact: float,
                    expected: bool) -> None:
    assert may_extend(answers, {"c1", "c2"}, since_contact, failsafe_max=300.0) is expected


def test_may_extend_needs_a_set() -> None:
    assert not may_extend({}, set(), 1.0, 300.0)


class _Etcd:
    """A store whose reads fail while ``down``."""

    def __init__(self) -> None:
        self.down = False

    async def get(self, _key: str) -> None:
        if self.down:
            raise TimeoutError("etcd is down")


def test_a_controller_answers_recovering_for_a_window_after_an_outage_and_holds_failovers(
        ) -> None:
    """Rule 1: "unavailable" while etcd fails; then "recovering" for the recovery window
    after the last such answer, each answer a promise of no failover for TTL + margin; then
    "available", and failovers allowed once the last promise is kept."""
    now = [100.0]
    etcd = _Etcd()
    failsafe = ControllerFailsafe("c1", cast(Any, etcd), Keys("t"), ttl=3.0, margin=0.5,
                                  failsafe_max=300.0, clock=lambda: now[0])
    answer = lambda: asyncio.run(failsafe.probe())  # noqa: E731
    assert answer() == "available" and failsafe.failover_allowed()
    etcd.down = True
    assert answer() == "unavailable" and not failsafe.failover_allowed()
    etcd.down, now[0] = False, 103.0
    window = recovery_window(3.0)
    assert answer() == "recovering" and failsafe.quiet_until == 103.0 + 3.5
    now[0] = 100.0 + window - 0.01
    assert answer() == "recovering"
    now[0] = 100.0 + window
    assert answer() == "available" and not failsafe.failover_allowed()
    now[0] = 100.0 + window - 0.01 + 3.5
    assert failsafe.failover_allowed()


@pytest.mark.parametrize(("promised", "since_contact", "expected"), [
    pytest.param({"c1": (10.0, 6.5), "c2": (12.0, 6.5)}, 5.0, 15.5, id="the-oldest-counts"),
    pytest.param({"c1": (10.0, 3.5), "c2": (9.0, 6.5)}, 5.0, 12.5, id="the-earliest-end"),
    pytest.param({"c1": (10.0, 6.5)}, 5.0, None, id="one-never-promised"),
    pytest.param({}, 5.0, None, id="none"),
    pytest.param({"c1": (10.0, 6.5), "c2": (12.0, 6.5)}, 300.0, None, id="etcd-too-long-ago"),
    pytest.param({"c1": (10.0, 6.5), "c2": (12.0, 6.5), "old": (1.0, 3.5)}, 5.0, 15.5,
                 id="a-non-member-ignored"),
])
def test_failsafe_deadline(promised: dict[str, tuple[float, float]], since_contact: float,
                           expected: float | None) -> None:
    assert failsafe_deadline(promised, {"c1", "c2"}, since_contact, failsafe_max=300.0,
                             margin=0.5) == expected


def test_a_promise_holds_a_ttl_and_the_margin() -> None:
    assert promise_hold(3.0, 0.5) == 3.5


def test_a_round_without_one_answer_keeps_that_controllers_earlier_promise() -> None:
    """Rule 2 per controller: a controller too busy to answer one round still counts with the
    promise it gave in an earlier one (its hold outlasts the extension it allows); one that
    says "available" withdraws it."""
    now = [50.0]
    answers: dict[str, str | None] = {"http://a": "unavailable", "http://b": "unavailable"}
    failsafe = AgentFailsafe("n1", cast(Any, None), Keys("t"), 300.0, last_contact=lambda: 45.0,
                             clock=lambda: now[0])
    failsafe.current = TWO

    async def ask(_session: object, url: str, _timeout: float) -> tuple[str | None, float]:
        return answers[url], 3.5

    failsafe._ask = ask  # type: ignore[method-assign]
    assert asyncio.run(failsafe.confirm(1.0)) == 2.5  # 3.5 - 2 x 0.5 from now
    now[0], answers["http://b"] = 51.0, None  # c2 did not answer this round
    assert asyncio.run(failsafe.confirm(1.0)) == 1.5  # from the round c2 last promised in
    now[0], answers["http://b"] = 52.0, "unavailable"
    assert asyncio.run(failsafe.confirm(1.0)) == 2.5
    now[0], answers["http://b"] = 53.0, "available"
    assert asyncio.run(failsafe.confirm(1.0)) is None and not failsafe.engaged


@pytest.mark.parametrize(("message", "busy"), [
    ("context deadline exceeded", True),
    ("etcdserver: request timed out", True),
    ("etcdserver: leader changed", True),
    ("etcdserver: raft proposal dropped", True),
    ("etcdserver: requested lease not found", False),
    ("etcdserver: permission denied", False),
])
def test_an_etcd_that_cannot_serve_now_is_not_a_refusal(message: str, busy: bool) -> None:
    """A resumed etcd stall answers "context deadline exceeded" for a moment: retried as an
    unreachable etcd (``TRANSIENT``), not raised as a refusal (``StoreError``)."""
    from hafo.store.client import etcd_busy

    assert etcd_busy(Exception(message)) is busy

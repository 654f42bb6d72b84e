"""Fencing deadline math: pure, injected times, no sleeping."""

from __future__ import annotations

import pytest

from hafo.decisions.fencing import can_start, fence_deadline, must_kill, renewed_deadline


@pytest.mark.parametrize(("sent_at", "ttl", "margin", "deadline"), [
    (100.0, 3.0, 0.5, 102.5),
    (0.0, 2.0, 0.5, 1.5),
    (50.0, 10.0, 0.0, 60.0),
    (1e6, 3.0, 1.0, 1e6 + 2.0),
])
def test_fence_deadline(sent_at: float, ttl: float, margin: float, deadline: float) -> None:
    assert fence_deadline(sent_at, ttl, margin) == pytest.approx(deadline)


@pytest.mark.parametrize(("ttl", "margin"), [(3.0, 0.5), (2.0, 1.0), (60.0, 5.0)])
def test_deadline_is_before_earliest_lease_expiry(ttl: float, margin: float) -> None:
    sent_at = 10.0
    for delay in (0.0, 0.01, 0.5, 2.0):  # etcd receives the keepalive ``delay`` after sending
        assert fence_deadline(sent_at, ttl, margin) < (sent_at + delay) + ttl


@pytest.mark.parametrize(("current", "sent_at", "expected"), [
    pytest.param(102.5, 101.0, 103.5, id="moves-forward"),
    pytest.param(102.5, 100.0, 102.5, id="same"),
    pytest.param(102.5, 99.0, 102.5, id="late-slow-ack-never-moves-back"),
    pytest.param(0.0, 5.0, 7.5, id="from-nothing"),
])
def test_renewed_deadline_never_moves_backwards(current: float, sent_at: float,
                                                expected: float) -> None:
    assert renewed_deadline(current, sent_at, 3.0, 0.5) == pytest.approx(expected)


def test_renewed_deadline_is_monotonic_over_out_of_order_acks() -> None:
    deadline = 0.0
    seen = []
    for sent_at in (10.0, 11.0, 10.5, 12.0, 9.0, 12.0):
        deadline = renewed_deadline(deadline, sent_at, 3.0, 0.5)
        seen.append(deadline)
    assert seen == sorted(seen)
    assert seen[-1] == pytest.approx(14.5)


@pytest.mark.parametrize(("now", "deadline", "kill"), [
    (100.0, 102.5, False),
    (102.49, 102.5, False),
    (102.5, 102.5, True),
    (200.0, 102.5, True),
])
def test_must_kill(now: float, deadline: float, kill: bool) -> None:
    assert must_kill(now, deadline) is kill


@pytest.mark.parametrize(("now", "deadline", "headroom", "ok"), [
    (100.0, 102.5, 1.0, True),
    (101.5, 102.5, 1.0, True),    # exactly the headroom left
    (101.6, 102.5, 1.0, False),
    (103.0, 102.5, 0.0, False),   # already past the deadline
    (102.5, 102.5, 0.0, True),
])
def test_can_start_needs_headroom(now: float, deadline: float, headroom: float,
                                  ok: bool) -> None:
    assert can_start(now, deadline, headroom) is ok

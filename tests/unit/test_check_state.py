"""The pure check state machine: thresholds, recovery and scheduling."""

from __future__ import annotations

import pytest

from hafo.decisions.check_state import CheckState, next_due, observe


def run(outcomes: str, threshold: int) -> CheckState:
    """Feed a string of outcomes ('.' ok, 'x' failure) through ``observe``."""
    state = CheckState()
    for i, c in enumerate(outcomes):
        state = observe(state, c == ".", f"run {i}", threshold)
    return state


@pytest.mark.parametrize(("outcomes", "threshold", "failures", "failing"), [
    pytest.param("", 3, 0, False, id="never-run"),
    pytest.param(".", 3, 0, False, id="one-success"),
    pytest.param("x", 3, 1, False, id="one-failure-below-threshold"),
    pytest.param("xx", 3, 2, False, id="two-failures-below-threshold"),
    pytest.param("xxx", 3, 3, True, id="reaches-threshold"),
    pytest.param("xxxxx", 3, 5, True, id="stays-failing"),
    pytest.param("xxx.", 3, 0, False, id="success-recovers"),
    pytest.param("xx.xx", 3, 2, False, id="success-resets-count"),
    pytest.param("x", 1, 1, True, id="threshold-one"),
    pytest.param("x", 0, 1, True, id="threshold-zero-means-one"),
    pytest.param("xxx.xxx", 3, 3, True, id="fails-again"),
])
def test_observe(outcomes: str, threshold: int, failures: int, failing: bool) -> None:
    state = run(outcomes, threshold)
    assert state.consecutive_failures == failures
    assert state.failing is failing
    assert state.runs == len(outcomes)
    assert state.last_detail == (f"run {len(outcomes) - 1}" if outcomes else "")


def test_observe_is_pure() -> None:
    before = CheckState(consecutive_failures=2, last_detail="x", failing=False, runs=7)
    after = observe(before, False, "boom", 3)
    assert before == CheckState(consecutive_failures=2, last_detail="x", failing=False, runs=7)
    assert after == CheckState(consecutive_failures=3, last_detail="boom", failing=True, runs=8)


@pytest.mark.parametrize(("started", "delay", "interval", "last_run", "due"), [
    pytest.param(100.0, 0.0, 10.0, None, 100.0, id="first-run-at-once"),
    pytest.param(100.0, 30.0, 10.0, None, 130.0, id="first-run-after-grace"),
    pytest.param(100.0, 0.0, 10.0, 100.0, 110.0, id="then-every-interval"),
    pytest.param(100.0, 30.0, 10.0, 130.0, 140.0, id="interval-after-grace"),
    pytest.param(100.0, 0.0, 10.0, 105.5, 115.5, id="from-previous-start"),
    pytest.param(100.0, 30.0, 1.0, 101.0, 130.0, id="never-before-grace-end"),
    pytest.param(100.0, -5.0, 10.0, None, 100.0, id="negative-delay-ignored"),
    pytest.param(100.0, 0.0, 0.05, 200.0, 200.05, id="short-interval"),
])
def test_next_due(started: float, delay: float, interval: float, last_run: float | None,
                  due: float) -> None:
    assert next_due(started, delay, interval, last_run) == pytest.approx(due)

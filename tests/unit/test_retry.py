"""hafo.retry: the one retry policy, with an injected clock, sleep and random numbers."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from hafo import retry as retry_module
from hafo.retry import RetriesExhausted, Retry, RetryPolicy, register_metrics, retry_call
from hafo.store.retry import store_policy


@pytest.fixture(autouse=True)
def _fresh_rate_limit() -> Iterator[None]:
    retry_module._warned_at.clear()
    yield
    retry_module._warned_at.clear()


class FakeTime:
    """A clock that only ``sleep`` moves; ``slept`` lists every wait."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def counter() -> Counter:
    return Counter("test_retries", "retries in a test", ["what"], registry=None)


def count(of: Counter, what: str) -> float:
    return float(of.labels(what)._value.get())


def retry_for(policy: RetryPolicy, time: FakeTime, what: str = "demo",
              rng: Any = lambda: 0.0, **kwargs: Any) -> Retry:
    return Retry(what, policy, sleep=time.sleep, clock=time.clock, rng=rng, **kwargs)


# -- delays -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "delays"), [
    (RetryPolicy(first=0.1, cap=5.0), [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]),
    (RetryPolicy(first=0.05, cap=1.0), [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]),
    (RetryPolicy(first=0.5, cap=0.5), [0.5] * 8),  # constant: first == cap
    (RetryPolicy(first=1.0, cap=0.25), [0.25] * 8),  # the cap wins
    (RetryPolicy(first=0.0, cap=0.0), [0.0] * 8),  # at once
])
def test_delays_double_from_first_up_to_the_cap(policy: RetryPolicy,
                                                delays: list[float]) -> None:
    assert [policy.delay(n, rng=lambda: 0.0) for n in range(1, 9)] == pytest.approx(delays)
    assert policy.delay(10_000, rng=lambda: 0.0) == policy.cap


@pytest.mark.parametrize("jitter", [0.0, 0.25, 0.5, 1.0])
def test_jitter_only_shortens_a_delay_within_its_bound(jitter: float) -> None:
    policy = RetryPolicy(first=0.1, cap=2.0, jitter=jitter)
    rng = random.Random(7).random
    for failures in range(1, 12):
        nominal = policy.delay(failures, rng=lambda: 0.0)
        assert policy.delay(failures, rng=lambda: 1.0) == pytest.approx(nominal * (1 - jitter))
        for _ in range(50):
            assert nominal * (1 - jitter) - 1e-12 <= policy.delay(failures, rng) <= nominal


def test_jitter_spreads_delays() -> None:
    policy = RetryPolicy(first=1.0, cap=1.0, jitter=0.5)
    rng = random.Random(3).random
    assert len({round(policy.delay(1, rng), 6) for _ in range(20)}) > 10


@pytest.mark.parametrize("bad", [
    {"first": -1.0}, {"cap": -0.1}, {"jitter": 1.5}, {"jitter": -0.1}, {"attempts": 0},
    {"warn_after": 0},
])
def test_a_policy_out_of_bounds_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


@pytest.mark.parametrize(("policy", "forever"), [
    (RetryPolicy(), True), (RetryPolicy(attempts=3), False), (RetryPolicy(deadline=1.0), False),
])
def test_forever_means_no_limit(policy: RetryPolicy, forever: bool) -> None:
    assert policy.forever is forever


# -- waits, limits ----------------------------------------------------------------------------


async def test_each_failure_waits_the_policys_next_delay() -> None:
    time = FakeTime()
    retry = retry_for(RetryPolicy(first=0.1, cap=0.4), time)
    for _ in range(5):
        await retry.failed(OSError("down"))
    assert time.slept == pytest.approx([0.1, 0.2, 0.4, 0.4, 0.4])
    retry.succeeded()
    await retry.failed(OSError("down again"))  # a new streak starts from the first delay
    assert time.slept[-1] == pytest.approx(0.1)


@pytest.mark.parametrize(("policy", "tries", "waits"), [
    (RetryPolicy(first=0.1, cap=1.0, attempts=1), 1, 0),
    (RetryPolicy(first=0.1, cap=1.0, attempts=4), 4, 3),
    # 0.1 + 0.2 + 0.4 = 0.7 s waited after the third failure: the fourth is past 0.6 s
    (RetryPolicy(first=0.1, cap=1.0, deadline=0.6), 4, 3),
    (RetryPolicy(first=0.1, cap=1.0, attempts=10, deadline=0.25), 3, 2),
])
async def test_the_policy_gives_up_at_its_limit_with_the_last_error(
        policy: RetryPolicy, tries: int, waits: int) -> None:
    time = FakeTime()
    retry = retry_for(policy, time)
    errors = [OSError(f"failure {n}") for n in range(1, tries + 1)]
    for error in errors[:-1]:
        await retry.failed(error)
    with pytest.raises(OSError) as raised:
        await retry.failed(errors[-1])
    assert raised.value is errors[-1]
    assert len(time.slept) == waits


async def test_a_failure_given_as_text_gives_up_as_retries_exhausted() -> None:
    time = FakeTime()
    retry = retry_for(RetryPolicy(attempts=1), time)
    with pytest.raises(RetriesExhausted, match="demo: it returned"):
        await retry.failed("it returned")


async def test_a_long_run_between_failures_starts_a_new_streak() -> None:
    time = FakeTime()
    retry = retry_for(RetryPolicy(first=0.1, cap=1.0, reset_after=1.0), time)
    await retry.failed(OSError())
    await retry.failed(OSError())
    time.now += 0.5  # a short run: the streak goes on
    await retry.failed(OSError())
    time.now += 1.5  # ran longer than reset_after: a new streak
    await retry.failed(OSError())
    assert time.slept == pytest.approx([0.1, 0.2, 0.4, 0.1])


async def test_retry_call_tries_again_only_what_it_is_told() -> None:
    time = FakeTime()
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TimeoutError("slow")
        return "ok"

    assert await retry_call("demo", RetryPolicy(first=0.1, attempts=5), flaky,
                            (TimeoutError,), sleep=time.sleep, clock=time.clock,
                            rng=lambda: 0.0) == "ok"
    assert calls == 3 and time.slept == pytest.approx([0.1, 0.2])

    async def refused() -> str:
        raise ValueError("no")

    with pytest.raises(ValueError):
        await retry_call("demo", RetryPolicy(attempts=5), refused, (TimeoutError,),
                         sleep=time.sleep, clock=time.clock)
    assert len(time.slept) == 2  # not retried


async def test_retry_calls_deadline_counts_from_the_first_attempt() -> None:
    time = FakeTime()

    async def slow_failure() -> None:
        time.now += 1.0  # each attempt takes a second to fail
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await retry_call("demo", RetryPolicy(first=0.1, deadline=2.5), slow_failure,
                         (TimeoutError,), sleep=time.sleep, clock=time.clock, rng=lambda: 0.0)
    assert len(time.slept) == 2  # failed at 1.0 and 2.1 s; at 3.3 s it gave up


def test_the_store_policy_keeps_its_budget_and_full_jitter() -> None:
    policy = store_policy(budget=10.0, attempts=12)
    assert (policy.first, policy.cap, policy.jitter) == (0.05, 1.0, 1.0)
    assert (policy.attempts, policy.deadline) == (12, 10.0)


# -- never silent: logs and metrics -----------------------------------------------------------


async def test_it_warns_once_the_failures_keep_coming_then_rate_limited() -> None:
    time = FakeTime()
    retry = retry_for(RetryPolicy(first=1.0, cap=1.0, jitter=0.0, warn_after=3,
                                  warn_every=10.0), time, node="n1")
    with capture_logs() as logs:
        for _ in range(15):
            await retry.failed(ConnectionError("refused"))
        retry.succeeded()
    warnings = [e for e in logs if e["log_level"] == "warning"]
    # the 3rd failure (t=102), then once 10 s passed (the 13th, at t=112)
    assert [e["attempt"] for e in warnings] == [3, 13]
    assert {e["event"] for e in warnings} == {"retrying"}
    assert warnings[0] == {"event": "retrying", "log_level": "warning", "what": "demo",
                           "attempt": 3, "error": "ConnectionError: refused",
                           "retry_in": 1.0, "node": "n1"}
    assert [(e["event"], e["attempt"]) for e in logs if e["log_level"] == "info"] == [
        ("retry succeeded", 16)]


@pytest.mark.parametrize(("warn_after", "failures", "warned_at"), [
    (1, 1, [1]), (2, 1, []), (2, 2, [2]), (3, 2, []), (3, 5, [3]),
])
async def test_warn_after_is_the_first_failure_warned_about(
        warn_after: int, failures: int, warned_at: list[int]) -> None:
    time = FakeTime()
    retry = retry_for(RetryPolicy(first=0.1, cap=0.1, warn_after=warn_after), time)
    with capture_logs() as logs:
        for _ in range(failures):
            await retry.failed(OSError())
        retry.succeeded()
    assert [e["attempt"] for e in logs if e["event"] == "retrying"] == warned_at
    assert any(e["event"] == "retry succeeded" for e in logs) is bool(warned_at)


async def test_the_rate_limit_is_per_what_across_callers() -> None:
    time = FakeTime()
    policy = RetryPolicy(first=0.1, cap=0.1, warn_after=1)
    with capture_logs() as logs:
        for what in ("etcd request", "etcd request", "etcd watch"):
            await retry_for(policy, time, what=what).failed(OSError())
    assert [e["what"] for e in logs if e["event"] == "retrying"] == [
        "etcd request", "etcd watch"]


async def test_giving_up_after_repeated_failures_is_a_warning() -> None:
    time = FakeTime()
    retry = retry_for(RetryPolicy(first=0.1, cap=0.1, attempts=3, warn_after=2,
                                  warn_every=0.0), time)
    with capture_logs() as logs, pytest.raises(OSError):
        for _ in range(3):
            await retry.failed(OSError("gone"))
    assert [(e["event"], e["attempt"]) for e in logs] == [
        ("retrying", 2), ("retries exhausted", 3)]


async def test_every_retry_is_counted_by_what() -> None:
    time = FakeTime()
    retries = counter()
    retry = retry_for(RetryPolicy(first=0.1, attempts=4), time, what="haproxy",
                      counter=retries)
    for _ in range(3):
        await retry.failed(OSError())
    assert count(retries, "haproxy") == 3.0
    with pytest.raises(OSError):
        await retry.failed(OSError())  # given up: not retried, not counted
    assert count(retries, "haproxy") == 3.0


def test_the_daemons_export_hafo_retries_total() -> None:
    registry = CollectorRegistry()
    register_metrics(registry)
    retry_module.RETRIES.labels("test export").inc()
    assert registry.get_sample_value("hafo_retries_total", {"what": "test export"}) >= 1.0

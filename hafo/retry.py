"""The one retry policy of hafo: every loop that tries a failed operation again does it here.

A ``RetryPolicy`` says how long to wait after each consecutive failure (exponential from
``first``, capped at ``cap``, each delay shortened at random by up to ``jitter`` of itself:
jitter spreads daemons that failed together and never makes a wait longer than the nominal
one, so no caller's timing gets slower than its cap) and when to give up (``attempts``,
``deadline``; neither: forever, only where a loop must never give up, such as a watch's
reconnects or holding a lease again).

A ``Retry`` applies one policy to one caller (a loop, or one call: ``retry_call``). It counts
every retry in ``hafo_retries_total{what}``, logs a warning (``"retrying"``: ``what``, the
``attempt`` count, the ``error`` and the next delay ``retry_in``) once the failures keep
coming (from the policy's ``warn_after``-th consecutive one), then at most once every
``warn_every`` seconds per ``what``, says ``"retry succeeded"`` when a streak it warned about
ends, and ``"retries exhausted"`` when it gives up. Nothing retries silently.

``tests/unit/test_one_retry_policy.py`` fails on a retry loop written by hand elsewhere.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter

from hafo.lazylog import get_logger

__all__ = ["RETRIES", "RetriesExhausted", "Retry", "RetryPolicy", "register_metrics",
           "retry_call"]

T = TypeVar("T")
log = get_logger("hafo.retry")  # structlog at the first line (hafo.lazylog)

#: Every retry of this process, by what was retried (a short, fixed name per caller). Both
#: daemons export it (``register_metrics``); one daemon runs per process.
RETRIES = Counter("hafo_retries", "Failed operations tried again after a backoff, by what "
                  "was retried", ["what"], registry=None)


def register_metrics(registry: CollectorRegistry) -> None:
    """Export ``hafo_retries_total`` on ``registry`` (once per registry)."""
    registry.register(RETRIES)


def _loop_time() -> float:
    """The running event loop's clock (virtual time on a test's virtual-time loop), else
    ``time.monotonic`` (as ``hafo.tasks.loop_time``, which imports this module)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


@dataclass(frozen=True)
class RetryPolicy:
    """How one caller retries (see the module).

    ``first``: the nominal wait after the first failure, doubling after each further one up
    to ``cap``; ``jitter``: each wait is shortened by a random fraction of it, up to this
    (0: none, 1: anywhere between 0 and the nominal wait). ``attempts``: give up after this
    many consecutive failures; ``deadline``: after this many seconds since the first failure
    of the streak (or since ``Retry``'s ``since``); neither: retry forever. ``warn_after``:
    the consecutive failure from which a warning is logged; ``warn_every``: seconds between
    two warnings for the same ``what``. ``reset_after``: a failure more than this many
    seconds after the last wait ended starts a new streak (an attempt that ran that long
    was a success of its own, as a restarted loop that ran for a while)."""

    first: float = 0.1
    cap: float = 5.0
    jitter: float = 0.5
    attempts: int | None = None
    deadline: float | None = None
    warn_after: int = 3
    warn_every: float = 30.0
    reset_after: float | None = None

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < 0:
            raise ValueError("retry delays must not be negative")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("retry jitter must be between 0 and 1")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("a retry policy allows at least one attempt")
        if self.warn_after < 1:
            raise ValueError("warn_after counts failures from 1")

    @property
    def forever(self) -> bool:
        """True if the policy never gives up."""
        return self.attempts is None and self.deadline is None

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """The wait after ``failures`` consecutive failures (1 or more): ``first`` doubled
        ``failures - 1`` times, at most ``cap``, shortened by up to ``jitter`` of itself."""
        base = min(self.cap, self.first * 2.0 ** max(0, min(failures - 1, 60)))
        return float(base * (1.0 - self.jitter * rng()))


class RetriesExhausted(Exception):
    """A policy gave up on a failure that was not an exception (``Retry.note`` of a text)."""


#: The last warning's time for each ``what`` (``RetryPolicy.warn_every``).
_warned_at: dict[str, float] = {}


def _describe(error: BaseException | str) -> str:
    if isinstance(error, str):
        return error
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Retry:
    """The retries of one caller under ``policy`` (see the module): ``await failed(error)``
    after each failure (it waits, or raises ``error`` when the policy gives up),
    ``succeeded()`` after a success. ``what`` names the caller in the metric and the logs
    (a short fixed text: it is a label); ``fields`` are added to its log lines. ``logger``,
    ``sleep``, ``clock``, ``rng`` and ``counter`` are for tests and for callers that wait
    on something else (a stop event) or log with their own bound fields."""

    def __init__(self, what: str, policy: RetryPolicy, *, logger: Any = None,
                 sleep: Callable[[float], Awaitable[Any]] | None = None,
                 clock: Callable[[], float] = _loop_time,
                 rng: Callable[[], float] = random.random,
                 counter: Counter | None = None, since: float | None = None,
                 **fields: Any) -> None:
        self.what = what
        self.policy = policy
        self.failures = 0
        self._log = logger if logger is not None else log
        self._sleep = sleep if sleep is not None else asyncio.sleep
        self._clock = clock
        self._rng = rng
        self._counter = counter if counter is not None else RETRIES
        self._fields = fields
        self._since = since
        self._resumed_at: float | None = None
        self._warned = False

    def note(self, error: BaseException | str) -> float:
        """Count one failure and return the wait before the next attempt (for a caller that
        logs the failure itself first, then ``pause``); raises ``error`` (a text: as
        ``RetriesExhausted``) when the policy gives up."""
        now = self._clock()
        policy = self.policy
        if (self.failures and policy.reset_after is not None and self._resumed_at is not None
                and now - self._resumed_at > policy.reset_after):
            self.failures, self._since, self._warned = 0, None, False
        if self._since is None:
            self._since = now
        self.failures += 1
        if ((policy.attempts is not None and self.failures >= policy.attempts)
                or (policy.deadline is not None and now - self._since >= policy.deadline)):
            if self.failures >= policy.warn_after and self._may_warn(now):
                self._log.warning("retries exhausted", what=self.what, attempt=self.failures,
                                  error=_describe(error), **self._fields)
            self.failures, self._since, self._warned = 0, None, False
            if isinstance(error, str):
                raise RetriesExhausted(f"{self.what}: {error}")
            raise error
        delay = policy.delay(self.failures, self._rng)
        self._counter.labels(self.what).inc()
        if self.failures >= policy.warn_after and self._may_warn(now):
            self._warned = True
            self._log.warning("retrying", what=self.what, attempt=self.failures,
                              error=_describe(error), retry_in=round(delay, 3), **self._fields)
        return delay

    async def pause(self, delay: float) -> None:
        """Wait ``delay`` (from ``note``) before the next attempt."""
        await self._sleep(delay)
        self._resumed_at = self._clock()

    async def failed(self, error: BaseException | str) -> None:
        """After a failure: count it, warn if they keep coming, wait the policy's delay;
        raises ``error`` when the policy gives up (see ``note``)."""
        await self.pause(self.note(error))

    def succeeded(self) -> None:
        """The attempt succeeded: the next failure is the first of a new streak."""
        if self._warned:
            self._log.info("retry succeeded", what=self.what, attempt=self.failures + 1,
                           **self._fields)
        self.failures, self._since, self._warned = 0, None, False

    def _may_warn(self, now: float) -> bool:
        last = _warned_at.get(self.what)
        if last is not None and last <= now < last + self.policy.warn_every:
            return False
        _warned_at[self.what] = now
        return True


async def retry_call(what: str, policy: RetryPolicy, call: Callable[[], Awaitable[T]],
                     retry_on: tuple[type[BaseException], ...], **kwargs: Any) -> T:
    """``await call()``, tried again under ``policy`` while it raises one of ``retry_on``;
    the last error is raised when the policy gives up. ``kwargs`` go to ``Retry``; the
    deadline counts from the first attempt."""
    clock = kwargs.pop("clock", _loop_time)
    retry = Retry(what, policy, clock=clock, since=clock(), **kwargs)
    while True:
        try:
            result = await call()
        except retry_on as exc:
            await retry.failed(exc)
            continue
        retry.succeeded()
        return result

"""Every retry policy of hafo, in one place: bounded, jittered, never silent and endless."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

T = TypeVar("T")
log = structlog.get_logger("hafo.retry")


class StoreUnavailable(Exception):
    """etcd could not be reached on any endpoint within the retry budget."""


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.debug("etcd call retry", attempt=state.attempt_number, error=repr(exc))


async def with_store_retry(call: Callable[[], Awaitable[T]],
                           retry_on: tuple[type[BaseException], ...],
                           budget: float = 10.0, attempts: int = 12) -> T:
    """Retry ``call`` on transient etcd errors: jittered exponential, at most ``budget`` s."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(retry_on),
        stop=stop_after_delay(budget) | stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.05, max=1.0),
        before_sleep=_log_retry,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise StoreUnavailable("unreachable")  # pragma: no cover - reraise=True raises first

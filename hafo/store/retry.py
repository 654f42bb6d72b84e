"""The etcd request retry: ``hafo.retry``'s one policy, with the store's budget.

Every retry of hafo goes through ``hafo.retry`` (jittered, capped, counted in
``hafo_retries_total``, a warning once it keeps failing); this module keeps the store's
``StoreUnavailable`` and the policy of one etcd request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from hafo.retry import RetryPolicy, retry_call

T = TypeVar("T")


class StoreUnavailable(Exception):
    """etcd could not be reached on any endpoint within the retry budget."""


def store_policy(budget: float = 10.0, attempts: int = 12) -> RetryPolicy:
    """One etcd request: waits of up to 0.05 s doubling to 1 s, anywhere below that (full
    jitter), giving up after ``attempts`` failures or ``budget`` seconds from the first
    attempt; a warning from the third failure on."""
    return RetryPolicy(first=0.05, cap=1.0, jitter=1.0, attempts=attempts, deadline=budget,
                       warn_after=3)


async def with_store_retry(call: Callable[[], Awaitable[T]],
                           retry_on: tuple[type[BaseException], ...],
                           budget: float = 10.0, attempts: int = 12) -> T:
    """Retry ``call`` on transient etcd errors (``store_policy``); the last error is raised
    once the policy gives up."""
    return await retry_call("etcd request", store_policy(budget, attempts), call, retry_on)

"""Fencing deadline math (docs/safety.md, rule 2). Pure; times are monotonic seconds.

etcd expires a lease no earlier than (receipt of the last keepalive + TTL). The agent sent that
keepalive before etcd received it, so ``sent_at + ttl`` is never later than the expiry; taking
a margin off leaves the guard time to kill the workload before anyone else can be assigned it.
Only a bounded clock *drift rate* is assumed, never synchronized clocks.
"""

from __future__ import annotations


def fence_deadline(sent_at: float, granted_ttl: float, margin: float) -> float:
    """Deadline (monotonic) by which a workload must be dead unless the lease is renewed."""
    return sent_at + granted_ttl - margin


def renewed_deadline(current: float, sent_at: float, granted_ttl: float, margin: float) -> float:
    """A deadline never moves backwards: a late, slow acknowledgement must not shorten it."""
    return max(current, fence_deadline(sent_at, granted_ttl, margin))


def must_kill(now: float, deadline: float) -> bool:
    """True once the fencing deadline has passed."""
    return now >= deadline


def can_start(now: float, deadline: float, min_headroom: float) -> bool:
    """Start new work only with at least ``min_headroom`` seconds left before the deadline."""
    return deadline - now >= min_headroom

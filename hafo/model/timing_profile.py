"""Timing profiles (docs/reference/config-files.md, "timing.profile"): named sets of the lease,
keepalive and fencing settings and the etcd raft timing they assume.

``default`` is hafo's long-standing timing (lease TTL 3 s). ``fast`` is for a LAN with a
dedicated etcd and a quiet control plane: a 1 s lease, keepalives every 0.2 s, guards that
kill 0.2 s before the lease can expire, and etcd run with a 15 ms heartbeat and a 150 ms
election timeout (10 x, etcd's advice). Its numbers are checked by ``election_problem`` like
anyone's, and measured in docs/benchmarks.md and docs/safety.md ("The fast profile").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROFILES", "TimingProfile"]


@dataclass(frozen=True)
class TimingProfile:
    """One profile: the ``timing`` defaults and etcd's raft timing (milliseconds)."""

    lease_ttl: int
    heartbeat: float
    fence_margin: float
    etcd_heartbeat_ms: int
    etcd_election_ms: int

    @property
    def election_timeout(self) -> float:
        """``etcd.election_timeout`` (seconds) that goes with the profile."""
        return self.etcd_election_ms / 1000


PROFILES: dict[str, TimingProfile] = {
    "default": TimingProfile(lease_ttl=3, heartbeat=1.0, fence_margin=0.5,
                             etcd_heartbeat_ms=50, etcd_election_ms=500),
    "fast": TimingProfile(lease_ttl=1, heartbeat=0.2, fence_margin=0.2,
                          etcd_heartbeat_ms=15, etcd_election_ms=150),
}

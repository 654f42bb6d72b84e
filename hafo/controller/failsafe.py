"""The controller's side of failsafe mode (rules 1 and 3 of hafo.decisions.failsafe)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from hafo.decisions.failsafe import may_lead, updated_set
from hafo.model.cluster import ClusterSnapshot, FailsafeSet
from hafo.store import TRANSIENT, Compare, Election, Keys, Put, Store, StoreError, codec
from hafo.tasks import loop_time

log = structlog.get_logger("hafo.controller")
PROBE_TIMEOUT = 0.4
PROBE_FAILURES: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError, TimeoutError)


class ControllerFailsafe:
    """Answers agents' failsafe questions and keeps this controller's promises."""

    def __init__(self, name: str, store: Store, keys: Keys, ttl: float, margin: float,
                 failsafe_max: float, clock: Callable[[], float] = loop_time) -> None:
        self.name = name
        self.store = store
        self.keys = keys
        self.hold = ttl + margin
        self.failsafe_max = failsafe_max
        self.clock = clock
        self.quiet_until = 0.0
        self.in_set_since: float | None = None

    async def probe(self) -> str:
        """Rule 1: 'unavailable' only if our own etcd request fails right now; that answer
        holds back every failover decision of ours for TTL + margin."""
        try:
            await asyncio.wait_for(self.store.get(self.keys.leader), PROBE_TIMEOUT)
            return "available"
        except PROBE_FAILURES:
            until = self.clock() + self.hold
            if until > self.quiet_until:
                if self.quiet_until < self.clock():
                    log.warning("failsafe: told an agent etcd is unavailable; failovers held",
                                controller=self.name, hold=self.hold)
                self.quiet_until = until
            return "unavailable"

    def failover_allowed(self) -> bool:
        """False while a promise made in ``probe`` holds."""
        return self.clock() >= self.quiet_until

    def may_lead(self, snapshot: ClusterSnapshot) -> bool:
        """Rule 3, from the cached snapshot."""
        if self.name in snapshot.failsafe.members and self.in_set_since is None:
            self.in_set_since = self.clock()
        in_set_for = None if self.in_set_since is None else self.clock() - self.in_set_since
        acks = {name: record.failsafe_seen for name, record in snapshot.nodes.items()}
        return may_lead(self.name, snapshot.failsafe, acks, in_set_for, self.failsafe_max)

    async def maintain_set(self, election: Election, snapshot: ClusterSnapshot) -> None:
        """As leader: add registered controllers to the failsafe set (fenced write)."""
        new = updated_set(snapshot.failsafe, snapshot.controller_apis)
        if new is None:
            return
        expected = snapshot.failsafe.version
        current = await self.store.get(self.keys.failsafe)
        current_set = FailsafeSet() if current is None else codec.decode_failsafe(current.value)
        if current_set.version != expected:
            return  # the cache is behind: next cycle
        guard = (Compare(self.keys.failsafe, "create", "==", 0) if current is None
                 else Compare(self.keys.failsafe, "mod", "==", current.mod_revision))
        result = await election.fenced([guard], [Put(self.keys.failsafe,
                                                     codec.encode(new.to_dict()))])
        if result.succeeded:
            log.info("failsafe set updated", version=new.version,
                     members=sorted(new.members), controller=self.name)

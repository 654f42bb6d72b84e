"""The controller's side of failsafe mode (rules 1 and 3 of hafo.decisions.failsafe)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import structlog

from hafo.decisions.failsafe import may_lead, promise_hold, recovery_window, updated_set
from hafo.model.cluster import ClusterSnapshot, FailsafeSet
from hafo.store import TRANSIENT, Compare, Election, Keys, Put, Store, StoreError, codec
from hafo.tasks import loop_time, retrieve_outcome

log = structlog.get_logger("hafo.controller")
PROBE_TIMEOUT = 0.4
FRESH = 0.5  # seconds a failed probe of etcd answers for
PROBE_FAILURES: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError, TimeoutError)



class ControllerFailsafe:
    """Answers agents' failsafe questions and keeps this controller's promises."""

    def __init__(self, name: str, store: Store, keys: Keys, ttl: float, margin: float,
                 failsafe_max: float, clock: Callable[[], float] = loop_time,
                 store_problem: Callable[[], str] = lambda: "") -> None:
        """``store_problem``: why our store is not the cluster we knew, or '' (then every
        answer is 'unavailable': our etcd works, but it is not the agents' cluster)."""
        self.name = name
        self.store_problem = store_problem
        #: why agents that ask us know another cluster than our store's, or '' (set by
        #: ``probe``; cleared when an operator accepts the store)
        self.contested = ""
        self.store = store
        self.keys = keys
        self.hold = promise_hold(ttl, margin)
        self.recovery = recovery_window(ttl)
        self.failsafe_max = failsafe_max
        self.clock = clock
        self.quiet_until = 0.0
        self.unavailable_at = -math.inf  # when our own etcd request last failed
        self._probing: asyncio.Future[bool] | None = None
        self.in_set_since: float | None = None

    async def probe(self, cluster: str | None = None,
                    ours: tuple[str, int] | None = None) -> str:
        """Rule 1: 'unavailable' only if our own etcd request failed just now (within
        ``FRESH``: one request answers every agent asking meanwhile, so a hundred agents
        asking at once during an outage cost one probe, and a busy controller still answers
        within the agents' round); for a recovery window after our last such answer,
        'recovering' (etcd is back, and the agents that kept their work on our word are
        reconnecting). Either answer holds back every failover decision of ours for
        ``hold``.

        A store that is not the cluster counts as an etcd that failed: ``cluster`` is the
        identity the asking agent knows ("ID/GENERATION", ``hafo.store.identity``), ``ours``
        our store's; an agent that knows another cluster, of our generation or a later one,
        contests our store (a controller started again on an etcd that lost its data wrote
        a new identity there): we decide nothing on it until an operator accepts it."""
        self._contest(cluster, ours)
        if self.store_problem():
            self.unavailable_at = self.clock()
        elif self.clock() - self.unavailable_at >= FRESH:
            if self._probing is None or self._probing.done():
                self._probing = asyncio.ensure_future(self._etcd_answers())
            if not await asyncio.shield(self._probing):
                self.unavailable_at = self.clock()
        if self.clock() - self.unavailable_at < FRESH:
            self._promise("told an agent etcd is unavailable")
            return "unavailable"
        if self.clock() < self.unavailable_at + self.recovery:
            self._promise("told an agent etcd is back, work kept while it reconnects")
            return "recovering"
        return "available"

    def _contest(self, cluster: str | None, ours: tuple[str, int] | None) -> None:
        if not cluster or ours is None or self.contested:
            return
        ident, _, generation = cluster.partition("/")
        if not generation.isdigit() or len(cluster) > 100:
            return
        if ident != ours[0] and int(generation) >= ours[1]:
            self.contested = (f"agents know cluster {ident} (generation {generation}), this "
                              f"store holds {ours[0]}: restore a backup (hafo restore) or "
                              "accept the store (hafo restore --as-is)")
            log.error("etcd is not the agents' cluster", controller=self.name,
                      reason=self.contested)

    async def _etcd_answers(self) -> bool:
        """One read of our own from etcd, answered within ``PROBE_TIMEOUT`` (a read still
        under way then counts as failed at once: a gRPC call whose cancellation takes
        seconds, while etcd's members start, must not make the agents' question time out)."""
        read = asyncio.ensure_future(self.store.get(self.keys.leader))
        done, _ = await asyncio.wait({read}, timeout=PROBE_TIMEOUT)
        if not done:
            read.cancel()
            read.add_done_callback(retrieve_outcome)
            return False
        error = read.exception()
        if error is not None and not isinstance(error, PROBE_FAILURES):
            raise error
        return error is None

    def _promise(self, what: str) -> None:
        """No failover decision of ours for ``hold`` from now."""
        until = self.clock() + self.hold
        if until > self.quiet_until:
            if self.quiet_until < self.clock():
                log.warning("failsafe: failovers held", controller=self.name, why=what,
                            hold=self.hold)
            self.quiet_until = until

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

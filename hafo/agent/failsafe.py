"""The agent's side of failsafe mode (rule 2 of hafo.decisions.failsafe): know the failsafe
set while etcd is reachable, and ask every controller in it when etcd is not."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from hafo.api.client import ApiClient, ApiError, client_tls
from hafo.decisions.failsafe import PROMISES, failsafe_deadline
from hafo.model.cluster import FailsafeSet
from hafo.store import TRANSIENT, Keys, Store, StoreError, codec

log = structlog.get_logger("hafo.agent")


class AgentFailsafe:
    """Failsafe set tracking and the question round."""

    def __init__(self, node: str, store: Store, keys: Keys, failsafe_max: float,
                 last_contact: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic, tls_ca: str | None = None,
                 ttl: float = 3.0, margin: float = 0.5) -> None:
        self.node = node
        self.tls_ca = tls_ca  # trusts controllers whose API serves TLS
        self.store = store
        self.keys = keys
        self.failsafe_max = failsafe_max
        self.ttl = ttl  # the lease TTL and fencing margin: the legacy hold is TTL + margin
        self.margin = margin
        self.last_contact = last_contact
        self.clock = clock
        self.current = FailsafeSet()
        self.engaged = False
        # controller -> (send time of its latest question answered with a promise, its hold)
        self.promised: dict[str, tuple[float, float]] = {}
        #: the store identity this agent knows, "ID/GENERATION", sent with each question
        #: (a controller whose store is another cluster decides nothing: its answer holds)
        self.cluster: Callable[[], str | None] = lambda: None

    async def refresh(self) -> bool:
        """Read the failsafe set; True if its version changed. Only a newer version is
        taken: the leader only ever raises it, so an older one (none at all in an etcd
        that lost its data) is a store that is not the cluster, whose set must not replace
        the controllers this agent asks while it keeps its work (``forget_set`` once an
        operator accepted such a store)."""
        with contextlib.suppress(*TRANSIENT, StoreError):
            kv = await self.store.get(self.keys.failsafe)
            new = FailsafeSet() if kv is None else codec.decode_failsafe(kv.value)
            if new.version > self.current.version:
                self.current = new
                return True
        return False

    def forget_set(self) -> None:
        """Take whatever set the store holds at the next ``refresh`` (an operator accepted
        the store as the cluster)."""
        self.current = FailsafeSet()

    async def _ask(self, client: ApiClient, url: str,
                   timeout: float) -> tuple[str | None, float]:
        """(the controller's answer or None, the hold it states: TTL + margin, the hold of
        controllers that do not state one)."""
        legacy = self.ttl + self.margin
        try:
            cluster = self.cluster()
            resp = await client.get(url, "/v1/failsafe",
                                    params={"cluster": cluster} if cluster else None,
                                    timeout=timeout)
            if resp.status != 200:
                return None, legacy
            body = resp.json()
        except ApiError:  # no answer, or not JSON
            return None, legacy
        if not isinstance(body, dict):
            return None, legacy
        hold = body.get("hold")
        if isinstance(hold, int | float) and not isinstance(hold, bool) \
                and 0 < hold <= self.failsafe_max:
            return str(body.get("etcd")), float(hold)
        return str(body.get("etcd")), legacy

    async def confirm(self, timeout: float) -> float | None:
        """One round of questions to every controller of the set; how many seconds from now
        the deadline may be extended to, or None (rule 2: the earliest end of each
        controller's latest promise; an answer that did not come leaves that controller's
        earlier promise in place, "available" withdraws it)."""
        members = self.current.apis()
        since_contact = self.clock() - self.last_contact()
        if not members or since_contact >= self.failsafe_max:
            self.promised.clear()
            return self._engage(None, {})
        sent = self.clock()
        async with ApiClient(tls=client_tls(self.tls_ca), timeout=timeout) as client:
            replies = dict(zip(members, await asyncio.gather(
                *(self._ask(client, url, timeout) for url in members.values())), strict=True))
        answers = {name: answer for name, (answer, _hold) in replies.items()}
        for name, (answer, hold) in replies.items():
            if answer in PROMISES:
                self.promised[name] = (sent, hold)
            elif answer is not None:
                self.promised.pop(name, None)
        for name in set(self.promised) - set(members):
            del self.promised[name]
        until = failsafe_deadline(self.promised, members, since_contact, self.failsafe_max,
                                  self.margin)
        return self._engage(None if until is None else until - self.clock(), answers)

    def _engage(self, age: float | None, answers: dict[str, str | None]) -> float | None:
        """Log when the failsafe engages or ends; returns ``age``."""
        if (age is not None) != self.engaged:
            self.engaged = age is not None
            if self.engaged:
                log.warning("failsafe: etcd unreachable for every controller too; keeping work",
                            node=self.node, controllers=sorted(answers))
            else:
                log.warning("failsafe off: not every controller confirmed", node=self.node,
                            answers=answers)
        return age

"""The agent's side of failsafe mode (rule 2 of hafo.decisions.failsafe): know the failsafe
set while etcd is reachable, and ask every controller in it when etcd is not."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable

import aiohttp
import structlog

from hafo.decisions.failsafe import may_extend
from hafo.model.cluster import FailsafeSet
from hafo.store import TRANSIENT, Keys, Store, StoreError, codec

log = structlog.get_logger("hafo.agent")


class AgentFailsafe:
    """Failsafe set tracking and the question round."""

    def __init__(self, node: str, store: Store, keys: Keys, failsafe_max: float,
                 last_contact: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic, tls_ca: str | None = None) -> None:
        self.node = node
        self.tls_ca = tls_ca  # trusts controllers whose API serves TLS
        self.store = store
        self.keys = keys
        self.failsafe_max = failsafe_max
        self.last_contact = last_contact
        self.clock = clock
        self.current = FailsafeSet()
        self.engaged = False

    async def refresh(self) -> bool:
        """Read the failsafe set; True if its version changed."""
        with contextlib.suppress(*TRANSIENT, StoreError):
            kv = await self.store.get(self.keys.failsafe)
            new = FailsafeSet() if kv is None else codec.decode_failsafe(kv.value)
            if new.version != self.current.version:
                self.current = new
                return True
        return False

    async def _ask(self, session: aiohttp.ClientSession, url: str, timeout: float) -> str | None:
        try:
            async with session.get(f"{url}/v1/failsafe",
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json()
                return str(body.get("etcd")) if isinstance(body, dict) else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def confirm(self, timeout: float) -> bool:
        """One round: True if every controller of the set says etcd is unavailable to it."""
        members = self.current.apis()
        since_contact = self.clock() - self.last_contact()
        if not members or since_contact >= self.failsafe_max:
            return False
        context = ssl.create_default_context(cafile=self.tls_ca) if self.tls_ca else None
        connector = aiohttp.TCPConnector(ssl=context) if context else None
        async with aiohttp.ClientSession(connector=connector) as session:
            answers = await asyncio.gather(*(self._ask(session, url, timeout)
                                             for url in members.values()))
        ok = may_extend(dict(zip(members, answers, strict=True)), set(members), since_contact,
                        self.failsafe_max)
        if ok != self.engaged:
            self.engaged = ok
            if ok:
                log.warning("failsafe: etcd unreachable for every controller too; keeping work",
                            node=self.node, controllers=sorted(members))
            else:
                log.warning("failsafe off: not every controller confirmed", node=self.node,
                            answers=dict(zip(members, answers, strict=True)))
        return ok

"""The controllers' agreement on their API's auth: the I/O of ``hafo.decisions.api_auth``.

Each controller publishes its settings in its presence key (``Keys.controller``, bound to its
lease: ``{"api": URL, "auth": {...}}``); ``ApiAuthAgreement.check`` reads the cluster's record
(``Keys.api_auth``) and every live controller's settings, judges, writes the record where the
verdict says so (guarded: created only where there is none, replaced only where it is the one
read), and keeps ``refusal``: why this controller refuses writes, '' while it agrees.

A mismatch (this controller's settings differ from the cluster's record) is said once in the
event log (``api-auth-mismatch``, given an ``EventLog``): when it is found, again only when it
changes (this controller's settings or the record), and once when it ends; ``mismatch`` is
what the ``hafo_api_auth_mismatch`` gauge exports.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from hafo.decisions.api_auth import ApiAuth, judge
from hafo.model.cluster import Event
from hafo.store import codec
from hafo.store.events import EventLog
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.records import Compare, Put

log = structlog.get_logger("hafo.controller")

#: How often a controller compares its settings with the cluster's.
CHECK_EVERY = 2.0

NOT_YET = "this controller has not yet compared its API auth with the cluster's; writes refused"


def _settings(value: bytes) -> ApiAuth | None:
    try:
        data: Any = codec.decode(value) if value else None
    except ValueError:
        return None
    return ApiAuth.from_dict(data.get("auth")) if isinstance(data, dict) else None


async def read_api_auth(store: Store, keys: Keys) -> tuple[ApiAuth | None, int,
                                                            dict[str, ApiAuth | None]]:
    """The cluster's record (None: none, or not of its shape), its mod revision (0: none),
    and the settings each live controller publishes (None: none)."""
    _, kvs = await store.get_prefix(keys.controllers)
    live = {kv.key[len(keys.controllers):]: _settings(kv.value) for kv in kvs}
    kv = await store.get(keys.api_auth)
    if kv is None:
        return None, 0, live
    try:
        record = ApiAuth.from_dict(codec.decode(kv.value))
    except ValueError:
        record = None
    return record, kv.mod_revision, live


class ApiAuthAgreement:
    """One controller's view of whether its API auth is the cluster's (see the module)."""

    def __init__(self, store: Store, keys: Keys, name: str, mine: ApiAuth,
                 events: EventLog | None = None) -> None:
        self.store = store
        self.keys = keys
        self.name = name
        self.mine = mine
        self.events = events
        #: why this controller refuses writes; '' while it agrees (not before the first check)
        self.refusal = NOT_YET
        self.checked = False
        #: the mismatch last said in an event: (this controller's settings, the record's)
        self.said: tuple[ApiAuth, ApiAuth | None] | None = None

    @property
    def mismatch(self) -> bool:
        """Whether the last check found this controller's settings not the cluster's (it
        refuses writes for it; not before the first check)."""
        return self.checked and bool(self.refusal)

    async def check(self) -> str:
        """Read, judge, write the record where due; the refusal ('' when none). Store errors
        propagate (the refusal found last stays)."""
        for _ in range(3):  # another controller wrote the record meanwhile: judge it again
            record, mod, live = await read_api_auth(self.store, self.keys)
            verdict = judge(self.mine, record, live)
            if verdict.write is None:
                break
            record = verdict.write
            guard = Compare(self.keys.api_auth, "mod", "==", mod) if mod else \
                Compare(self.keys.api_auth, "create", "==", 0)
            done = await self.store.txn([guard], [Put(self.keys.api_auth,
                                                      codec.encode(verdict.write.to_dict()))])
            if done.succeeded:
                if mod == 0:
                    log.info("cluster's API auth record written", controller=self.name,
                             auth=self.mine.describe())
                else:
                    log.info("cluster's API auth record replaced: every live controller has "
                             "these settings", controller=self.name, auth=self.mine.describe())
                verdict = judge(self.mine, verdict.write, live)
                break
        else:
            return self.refusal  # raced three times: the verdict found last stays
        self._keep(verdict.refusal)
        await self._say(record)
        return self.refusal

    def _keep(self, refusal: str) -> None:
        if refusal != self.refusal:
            if refusal:
                log.warning("this controller's API auth differs from the cluster's: writes "
                            "refused", controller=self.name, reason=refusal)
            elif self.checked:
                log.info("this controller's API auth is the cluster's again; writes accepted",
                         controller=self.name)
        self.refusal = refusal
        self.checked = True

    async def _say(self, record: ApiAuth | None) -> None:
        """One ``api-auth-mismatch`` event when a mismatch is found, changes or ends."""
        now = (self.mine, record) if self.mismatch else None
        if now == self.said:
            return
        if self.events is not None:
            message = (f"controller {self.name}: {self.refusal}" if now is not None else
                       f"controller {self.name}: its API auth is the cluster's again; "
                       "writes accepted")
            await self.events.append(Event(ts=time.time(), kind="api-auth-mismatch",
                                           message=message))
        self.said = now

    async def watch(self, errors: tuple[type[BaseException], ...],
                    every: float = CHECK_EVERY) -> None:
        """``check`` every ``every`` seconds until cancelled; ``errors`` (etcd unavailable)
        keep the last verdict."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.check()
            except errors as exc:
                log.debug("API auth not compared: etcd unavailable", error=repr(exc))

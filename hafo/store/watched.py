"""Every key under one prefix, decoded and kept current by a watch: the one load-watch-resync
loop of hafo (the controller's ``ClusterCache``, the agent's ``NodeAssignments`` and the
simulated fleet use it).

``load`` reads the prefix at a revision; ``follow`` watches from that revision + 1 on, across
endpoint failures (``EtcdStore.watch_prefix``), and replaces everything when the watch cannot
resume (a compaction: ``Resync``). A resync, like a ``load`` made while ``follow`` runs, is
applied as the changes it amounts to: the keys that went are reported deleted, every key read
is reported put; watch events the read already holds are not applied again. A value that
cannot be decoded is logged and skipped (the key keeps its last good value): one bad value
never stops a daemon.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

import structlog

from hafo.retry import Retry, RetryPolicy
from hafo.store.client import KV, TRANSIENT, Resync, WatchEvent
from hafo.store.protocol import Store

V = TypeVar("V")
log = structlog.get_logger("hafo.watch")

#: Called for every change a user of ``WatchedPrefix`` sees: (key, value before or None,
#: value now or None when the key was deleted).
OnChange = Callable[[str, V | None, V | None], None]

DECODE_ERRORS = (ValueError, KeyError, TypeError)

#: ``follow`` starting its watch again after it failed (its full re-read after a compaction
#: found etcd unavailable past the store's own retries): forever, 0.1 s doubling up to 1 s,
#: jittered down; the first failure is a warning already (the store retried it first).
FOLLOW_POLICY = RetryPolicy(first=0.1, cap=1.0, jitter=0.5, warn_after=1)


class WatchedPrefix(Generic[V]):
    """``values``: key -> decoded value of every key under ``prefix``; ``revision``: the
    store revision they reflect; ``changed``: set after every change (cleared by the reader).
    ``on_change`` hears of each key's change as it is applied."""

    def __init__(self, store: Store, prefix: str, decode: Callable[[KV], V],
                 on_change: OnChange[V] | None = None) -> None:
        self.store = store
        self.prefix = prefix
        self.decode = decode
        self.on_change = on_change
        self.values: dict[str, V] = {}
        self.revision = 0
        self.changed = asyncio.Event()
        # Revision of the last full read: watch events up to it are already in ``values``
        # (a ``load`` made while ``follow`` runs must not be undone by older events).
        self._read_at = 0
        # the watch ``follow`` runs now
        self._pump: asyncio.Future[BaseException | None] | None = None
        self._restart = False  # ``forget`` cancelled it: start it again
        self._delivered = False  # the watch under way applied an event

    async def load(self) -> int:
        """Read the whole prefix; returns its revision. A read older than the revision the
        watch has reached meanwhile (``follow`` runs, the read was slow) is dropped: what the
        watch applied is newer, and it missed nothing."""
        revision, kvs = await self.store.get_prefix(self.prefix)
        if revision >= self.revision:
            self.replace(revision, kvs)
        else:
            self.changed.set()
        return revision

    def apply(self, event: WatchEvent | Resync) -> None:
        """Apply one watch event (or a full resync)."""
        if isinstance(event, Resync):
            self.replace(event.revision, event.kvs)
            return
        kv = event.kv
        if kv.mod_revision <= self._read_at:
            return  # already read
        if event.kind == "delete":
            self._delete(kv.key)
        else:
            self._put(kv)
        self.revision = max(self.revision, kv.mod_revision)
        self.changed.set()

    def replace(self, revision: int, kvs: Iterable[KV]) -> None:
        """Everything under the prefix as read at ``revision``."""
        kvs = list(kvs)
        present = {kv.key for kv in kvs}
        for key in [k for k in self.values if k not in present]:
            self._delete(key)
        for kv in kvs:
            self._put(kv)
        self.revision = self._read_at = revision
        self.changed.set()

    def _put(self, kv: KV) -> None:
        try:
            value = self.decode(kv)
        except DECODE_ERRORS as exc:
            log.warning("skipping undecodable key", key=kv.key, error=str(exc))
            return
        old = self.values.get(kv.key)
        self.values[kv.key] = value
        if self.on_change is not None:
            self.on_change(kv.key, old, value)

    def _delete(self, key: str) -> None:
        old = self.values.pop(key, None)
        if self.on_change is not None:
            self.on_change(key, old, None)

    def forget(self) -> None:
        """Forget the revision reached: the store is another history (etcd lost its data and
        an operator accepted it, ``hafo restore``), whose revisions may be lower. The next
        ``load`` replaces every value whatever its revision, and ``follow`` watches again
        from the start of the new history (a watch left waiting for an old, higher
        revision would miss everything below it)."""
        self.revision = self._read_at = 0
        if self._pump is not None and not self._pump.done():
            self._restart = True
            self._pump.cancel()

    async def follow(self, on_event: Callable[[], Awaitable[None] | None] | None = None) -> None:
        """Apply watch events forever, from the revision reached + 1; ``on_event`` after each.
        The watch resumes across endpoint failures by itself; should even its full re-read
        after a compaction fail (etcd unavailable past the store's retry budget), it starts
        again after a short backoff (``FOLLOW_POLICY``) instead of ending; ``forget`` starts
        it again at once."""
        retry = Retry("watched prefix", FOLLOW_POLICY, logger=log, prefix=self.prefix)
        while True:
            pump = self._pump = asyncio.ensure_future(self._follow_once(on_event))
            try:
                error = await pump
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not self._restart or (current is not None and current.cancelling()):
                    pump.cancel()
                    raise
                self._restart = False
                continue
            if error is None:
                return
            if self._delivered:
                retry.succeeded()
            await retry.failed(error)

    async def _follow_once(self, on_event: Callable[[], Awaitable[None] | None] | None,
                           ) -> BaseException | None:
        """One watch, from the revision reached + 1, until it ends (None) or fails (the
        error)."""
        events = aiter(self.store.watch_prefix(self.prefix, self.revision + 1))
        self._delivered = False
        while True:
            try:
                event = await anext(events)
            except StopAsyncIteration:
                return None
            except TRANSIENT as exc:
                return exc
            self._delivered = True
            self.apply(event)
            if on_event is not None:
                result = on_event()
                if result is not None:
                    await result

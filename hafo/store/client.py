"""The etcd client of hafo: several endpoints with failover, bounded retries, typed results.

This package is the only code that imports the etcd client (``aetcd``). aetcd connects to one
host, so the endpoint list is handled here: a call that fails with a connection error (or a
timeout) moves to the next endpoint and is retried within a bounded, jittered budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlsplit

import aetcd
from aetcd import exceptions as etcd_errors

from hafo.lazylog import get_logger
from hafo.retry import Retry, RetryPolicy
from hafo.store import aetcd_adapter as adapter
from hafo.store.records import (
    KV,
    Compare,
    Delete,
    Get,
    Put,
    Resync,
    TxnResult,
    WatchEvent,
    key_events,
)
from hafo.store.retry import StoreUnavailable, with_store_retry
from hafo.store.tls import TlsFiles
from hafo.tasks import retrieve_outcome

if TYPE_CHECKING:
    from hafo.model.config import EtcdConfig

__all__ = [  # the records are re-exported from their first home
    "KV", "TRANSIENT", "Compare", "Delete", "EtcdStore", "Get", "LeaseNotFound", "Put",
    "Resync",
    "StoreAuthError", "StoreError", "TxnResult", "WatchEvent", "channel_options",
    "parse_endpoint",
]

T = TypeVar("T")
log = get_logger("hafo.store")  # structlog at the first line (hafo.lazylog)

TRANSIENT: tuple[type[BaseException], ...] = (
    etcd_errors.ConnectionFailedError,
    etcd_errors.ConnectionTimeoutError,
    etcd_errors.InternalError,
    asyncio.TimeoutError,
    StoreUnavailable,
)


#: What etcd answers when it is alive but cannot serve a request now (a resumed stall, a
#: leader election, overload): retried like an unreachable etcd, never a refusal.
ETCD_BUSY = ("context deadline exceeded", "etcdserver: request timed out",
             "etcdserver: leader changed", "etcdserver: no leader",
             "etcdserver: too many requests", "raft proposal dropped")


def etcd_busy(exc: BaseException) -> bool:
    """True if etcd's error says it is busy or electing, not that the request is wrong."""
    text = str(exc)
    return any(marker in text for marker in ETCD_BUSY)


class StoreError(Exception):
    """etcd refused a request for a reason other than availability (a bug or bad state)."""


class StoreAuthError(StoreError):
    """etcd refused our credentials (user name, password or client certificate)."""


class LeaseNotFound(StoreError):
    """etcd refused a request naming a lease it no longer has: the lease expired or was
    revoked (by a stalled raft leader resuming, too: etcd before 3.5.11, docs/safety.md)."""


#: etcd's answer to a request that names a lease it does not have.
LEASE_NOT_FOUND = "requested lease not found"


#: Called after every etcd request with (seconds taken, the error or None); daemons use it
#: for their request latency and error metrics.
Observer = Callable[[float, BaseException | None], None]


def parse_endpoint(url: str) -> tuple[str, int]:
    """``http://host:port`` -> (host, port)."""
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"bad etcd endpoint {url!r}")
    return parts.hostname, parts.port


#: The largest etcd reply a client accepts (etcd's own request limit is 1.5 MiB; replies to
#: range reads are bounded only by the data).
MAX_REPLY = 512 * 1024 * 1024



#: The shortest time gRPC may give a connection attempt (milliseconds): see channel_options.
MIN_CONNECT_MS = 500


def channel_options(max_backoff: float) -> dict[str, int]:
    """gRPC channel options that bound reconnection after etcd comes back.

    gRPC's defaults back off up to 120 s between connection attempts, and channels to one
    target share their subchannels (and so that backoff) through a process-wide pool: after an
    outage of 20 s a fresh channel waited 5 s or more before it tried again, longer than the
    few seconds a restarted etcd gives a restored lease. Each channel here keeps its own
    subchannels and retries every 0.1 s at first, never waiting more than ``max_backoff``
    (the store's ``reconnect_backoff``: half a heartbeat in the daemons), or 0.5 s if that is
    more: gRPC gives a connection attempt no more time than the backoff, and with the fast
    timing profile's 0.1 s a busy machine's handshakes timed out again and again (its agents
    never reconnected after a whole-etcd restart; "connection attempt timed out before
    receiving SETTINGS frame").

    Replies may be up to ``MAX_REPLY`` bytes: a read of the whole state prefix (a controller's
    load, ``hafo status``) is about 2.5 KB per node, over gRPC's 4 MiB default from about
    1,700 nodes on (20 MB at 10,000 nodes with gangs).
    """
    ceiling = max(MIN_CONNECT_MS, int(max_backoff * 1000))
    return {"grpc.use_local_subchannel_pool": 1,
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.min_reconnect_backoff_ms": 100,
            "grpc.max_reconnect_backoff_ms": ceiling,
            "grpc.max_receive_message_length": MAX_REPLY}


class EtcdStore:
    """Connection to an etcd cluster through any of its endpoints."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 2.0,
                 retry_budget: float = 10.0, username: str | None = None,
                 password: str | None = None, tls: TlsFiles | None = None,
                 observer: Observer | None = None, reconnect_backoff: float = 0.5) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self.timeout = timeout
        self.retry_budget = retry_budget
        self._username = username
        self._password = password
        self._tls = tls
        self.observer = observer
        self.reconnect_backoff = reconnect_backoff
        #: A watch's reconnects (``watch_prefix``): forever, from 0.04 s doubling up to the
        #: reconnect backoff (half a heartbeat in the daemons), jittered down; a warning
        #: from the third consecutive failure.
        self.watch_policy = RetryPolicy(first=min(0.04, reconnect_backoff),
                                        cap=reconnect_backoff, jitter=0.5, warn_after=3)
        self._index = 0
        self._client: aetcd.Client | None = None
        self._generation = 0
        self._lock = asyncio.Lock()
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        # moves to an endpoint that answered, and a failed keepalive's rotation
        self._moving: set[asyncio.Task[None]] = set()
        self._connecting: asyncio.Task[tuple[aetcd.Client, int]] | None = None
        # Connections kept to each endpoint for the hedged keepalive and the leader check
        # (``keepalive_any``, ``leaderless_majority``), made before they are needed: a
        # failover then costs one RPC, not a connect (a TLS handshake, an Authenticate: on a
        # busy machine during an election, longer than the fencing slack) per member.
        self._spares: dict[int, aetcd.Client] = {}
        self._spare_connecting: dict[int, asyncio.Task[aetcd.Client]] = {}
        # Endpoint logging, one line per change of state (never one per retry): the indices
        # that failed since the last answer, and since when none answers (None: one does).
        self._failed: set[int] = set()
        self._unreachable_since: float | None = None

    @classmethod
    def from_config(cls, config: EtcdConfig, **kwargs: Any) -> EtcdStore:
        """A store for a daemon's or the CLI's ``etcd`` section: endpoints, TLS files and
        authentication (the password read from ``password_file`` when that is given)."""
        password = config.password
        if config.password_file:
            password = Path(config.password_file).read_text().strip()
        tls = TlsFiles(config.ca, config.cert, config.key) if config.ca else None
        return cls(config.endpoints, username=config.username, password=password, tls=tls,
                   **kwargs)

    def _new_client(self, host: str, port: int, timeout: float) -> aetcd.Client:
        return adapter.new_client(host, port, timeout, tls=self._tls,
                                  username=self._username, password=self._password,
                                  options=channel_options(self.reconnect_backoff))

    def _observe(self, started: float, error: BaseException | None) -> None:
        if self.observer is not None:
            with contextlib.suppress(Exception):
                self.observer(time.monotonic() - started, error)

    @property
    def endpoint(self) -> str:
        """The endpoint in use now, as host:port."""
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    async def _current(self, timeout: float | None = None) -> tuple[aetcd.Client, int]:
        """The connected client of the current endpoint, within ``timeout`` (default: the
        store's timeout + 0.5 s).

        Connecting is one background task that every caller waits for with its own timeout
        and none cancels: with credentials it is an Authenticate call (a bcrypt check in
        etcd, seconds on a busy machine during an election), which a keepalive's short
        timeout would otherwise cut off again and again; and a caller never waits longer than
        its timeout because another caller is connecting to a dead member.
        """
        if self._closed:
            raise StoreUnavailable("store is closed")
        if self._client is not None:
            return self._client, self._generation
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
            self._connecting.add_done_callback(retrieve_outcome)
        limit = self.timeout + 0.5 if timeout is None else timeout
        return await asyncio.wait_for(asyncio.shield(self._connecting), limit)

    async def _connect(self) -> tuple[aetcd.Client, int]:
        try:
            return await self._connect_locked()
        except asyncio.CancelledError:
            # Abandoned (another endpoint answered, or the store closes): its waiters see a
            # connection failure, never a cancellation of their own.
            raise StoreUnavailable("connecting abandoned") from None

    async def _connect_locked(self) -> tuple[aetcd.Client, int]:
        async with self._lock:
            if self._closed:
                raise StoreUnavailable("store is closed")
            if self._client is None:
                host, port = self.endpoints[self._index]
                client = self._new_client(host, port, self.timeout)
                try:
                    # With credentials, connecting is an Authenticate call, which a
                    # powered-off member only lets time out.
                    await asyncio.wait_for(client.connect(), self.timeout + 0.5)
                except (etcd_errors.UnauthenticatedError,
                        etcd_errors.InvalidArgumentError) as exc:
                    raise StoreAuthError(f"etcd refused the credentials: {exc}") from None
                except TRANSIENT as exc:
                    # Move on, as a failed call does: retrying a dead endpoint forever kept a
                    # daemon off etcd although the other members served.
                    failed = self._index
                    self._index = (self._index + 1) % len(self.endpoints)
                    self._log_failure(failed, type(exc).__name__)
                    self._closing.add(asyncio.get_running_loop().create_task(
                        self._close_quietly(client)))
                    raise
                except BaseException:  # cancelled: the store is closing
                    self._closing.add(asyncio.get_running_loop().create_task(
                        self._close_quietly(client)))
                    raise
                adapter.require_leader(client)  # watches fail, not stall, without a leader
                self._client = client
                self._generation += 1
            return self._client, self._generation

    def _log_failure(self, failed: int, error: str) -> None:
        """Log the move away from endpoint ``failed`` (now at ``self._index``), once per
        change of state: an info line when the store moves to an endpoint that has not failed
        since the last answer, one warning when every endpoint has failed, then nothing until
        an endpoint answers again (``_answered``)."""
        self._failed.add(failed)
        if self._unreachable_since is not None:
            return  # already said: no endpoint answers
        previous = "{}:{}".format(*self.endpoints[failed])
        if len(self._failed) >= len(self.endpoints):
            self._unreachable_since = time.monotonic()
            log.warning("etcd unreachable: no endpoint answers", failed=previous,
                        endpoints=",".join(f"{h}:{p}" for h, p in self.endpoints), error=error)
        else:
            log.info("etcd endpoint failover", failed=previous, next=self.endpoint, error=error)

    def _answered(self) -> None:
        """An endpoint answered: after an outage, say so once (``_log_failure``)."""
        if self._unreachable_since is not None:
            log.info("etcd reachable again", endpoint=self.endpoint,
                     unreachable_for=round(time.monotonic() - self._unreachable_since, 3))
            self._unreachable_since = None
        self._failed.clear()

    async def _rotate(self, generation: int, error: BaseException) -> None:
        """Drop the connection of ``generation`` and move to the next endpoint."""
        async with self._lock:
            if generation != self._generation or self._client is None:
                return  # someone else already rotated
            old = self._client
            self._client = None
            failed = self._index
            self._index = (self._index + 1) % len(self.endpoints)
            if isinstance(error, etcd_errors.UnauthenticatedError):
                # An expired auth token (etcd's simple tokens last minutes): the endpoint
                # answered; the next connection authenticates again.
                log.debug("etcd auth token refused: reconnecting", endpoint=self.endpoint)
            else:
                self._log_failure(failed, type(error).__name__)
        # Calls still in flight on the old channel finish or fail on their own first.
        self._closing.add(asyncio.get_running_loop().create_task(
            self._close_quietly(old, delay=5.0)))

    def _rotate_soon(self, generation: int, error: BaseException) -> None:
        """``_rotate`` in the background, for a keepalive: rotating takes the lock, which a
        connect started by another caller may hold for its whole timeout (the store's, 2.5 s
        in the daemons), and a failed keepalive must return within its own timeout. The
        lease keeper's failsafe rounds run between its retries, and the deadline they keep
        is only seconds ahead: waiting here let it pass as etcd came back from a stall,
        which fenced the work it was resuming (tests/integration/test_etcd_stall.py)."""
        task = asyncio.get_running_loop().create_task(self._rotate(generation, error))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)

    async def _close_quietly(self, client: aetcd.Client, delay: float = 0.0) -> None:
        try:
            await asyncio.sleep(delay)
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(client.close(), 2.0)
        finally:
            self._closing.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]

    async def call(self, op: Callable[[aetcd.Client], Awaitable[T]],
                   budget: float | None = None) -> T:
        """Run ``op`` against the current endpoint, failing over and retrying on errors."""

        async def attempt() -> T:
            started = time.monotonic()
            try:
                client, generation = await self._current()
            except BaseException as exc:
                self._observe(started, exc)
                raise
            try:
                result = await asyncio.wait_for(op(client), self.timeout + 0.5)
            except TRANSIENT as exc:
                self._observe(started, exc)
                await self._rotate(generation, exc)
                raise
            except etcd_errors.UnauthenticatedError as exc:
                self._observe(started, exc)
                # An expired auth token: reconnect, which authenticates again.
                await self._rotate(generation, exc)
                raise StoreUnavailable(f"etcd auth token refused: {exc}") from exc
            except etcd_errors.ClientError as exc:
                self._observe(started, exc)
                self._answered()  # etcd answered, with a refusal
                if etcd_busy(exc):  # not a refusal: etcd could not serve it in time
                    raise StoreUnavailable(f"etcd did not serve the request: {exc}") from exc
                if LEASE_NOT_FOUND in str(exc):
                    raise LeaseNotFound(f"etcd refused the request: {exc}") from exc
                raise StoreError(f"etcd refused the request: {exc}") from exc
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being cancelled ourselves
                # The channel was closed under the call: treat as a connection failure.
                error = StoreUnavailable("etcd channel closed during the call")
                self._observe(started, error)
                raise error from None
            except BaseException as exc:
                self._observe(started, exc)
                raise
            self._observe(started, None)
            self._answered()
            return result

        return await with_store_retry(attempt, TRANSIENT,
                                      budget=self.retry_budget if budget is None else budget)

    async def close(self) -> None:
        """Close the connection; further calls fail with StoreUnavailable."""
        for task in list(self._moving):
            task.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        for connecting in self._spare_connecting.values():
            connecting.cancel()
        async with self._lock:
            self._closed = True
            client, self._client = self._client, None
        spares, self._spares = list(self._spares.values()), {}
        for task in list(self._closing):
            task.cancel()
        for each in [client, *spares]:
            if each is not None:
                await self._close_quietly(each)

    # -- key-value -----------------------------------------------------------------------

    async def get(self, key: str) -> KV | None:
        """Read one key."""
        result = await self.call(lambda c: c.get(key.encode()))
        return None if result is None else adapter.to_kv(result)

    async def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        """Read every key under ``prefix``; returns (revision, kvs)."""
        result = await self.call(lambda c: c.get_prefix(prefix.encode()))
        return result.header.revision, [adapter.to_kv(kv) for kv in result]

    async def get_newest(self, prefix: str, limit: int) -> list[KV]:
        """The ``limit`` keys under ``prefix`` that sort last (newest for time-ordered keys),
        returned in ascending key order. Only those are transferred."""
        return await self.call(adapter.mapped_errors(
            lambda c: adapter.range_newest(c, prefix, limit, self.timeout)))

    async def revision(self) -> int:
        """The store's current revision."""
        probe = await self.call(lambda c: c.get_prefix(b"/hafo/\0revision-probe"))
        return int(probe.header.revision)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write one key; returns the revision of the write."""
        result = await self.call(lambda c: c.put(key.encode(), value, lease=lease))
        return int(result.header.revision)

    async def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        result = await self.call(lambda c: c.delete(key.encode()))
        return result is not None

    async def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete | Get],
                  failure: Sequence[Put | Delete | Get] = ()) -> TxnResult:
        """Atomic compare-and-write. Not retried blindly on ambiguous errors by callers."""
        return await self.call(adapter.mapped_errors(
            lambda c: adapter.txn(c, compares, success, failure, self.timeout)))

    async def write_many(self, ops: Sequence[Put | Delete], per_txn: int = 100) -> int:
        """Unconditional writes, batched ``per_txn`` to a transaction (etcd allows 128
        operations per txn by default); returns the last revision written (0 if none)."""
        revision = 0
        for start in range(0, len(ops), per_txn):
            result = await self.txn([], ops[start:start + per_txn])
            revision = result.revision
        return revision

    # -- leases --------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> tuple[int, int]:
        """Grant a lease; returns (lease id, granted ttl)."""
        lease = await self.call(lambda c: c.lease(ttl))
        return int(lease.id), int(lease.ttl)

    async def keepalive(self, lease_id: int, timeout: float) -> int:
        """Send one keepalive; returns the granted TTL, 0 if the lease is gone. No retry."""

        async def op(client: aetcd.Client) -> int:
            reply = await client.refresh_lease(lease_id)
            return int(reply.TTL) if reply is not None else 0

        client, generation = await self._current(timeout)
        try:
            ttl = await asyncio.wait_for(adapter.mapped_errors(op)(client), timeout)
        except TRANSIENT as exc:
            self._rotate_soon(generation, exc)
            raise
        self._answered()
        return ttl

    async def keepalive_any(self, lease_id: int, timeout: float) -> int:
        """One keepalive through every endpoint at once: the first answer wins, and the store
        moves to the endpoint that gave it. Returns the granted TTL, 0 if the lease is gone.

        For the retry after a failed keepalive. The current endpoint may then be a powered-off
        machine (no reset: a call only times out) or a member that lost its raft leader, and
        the next endpoint in order may be no better: trying one after another spends a
        timeout on each dead one, more than the fencing slack (``lease_ttl - heartbeat -
        fence_margin``) allows. Raises the last error when no endpoint answers in time."""

        async def through(index: int) -> tuple[int, int]:
            if index == self._index and self._client is not None:
                return index, await self.keepalive(lease_id, timeout)
            reply = await self._on_spare(
                index, lambda c: c.refresh_lease(lease_id), timeout)
            return index, int(reply.TTL) if reply is not None else 0

        tasks = [asyncio.ensure_future(through(i)) for i in range(len(self.endpoints))]
        error: BaseException = StoreUnavailable("no etcd endpoint answered the keepalive")
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    index, ttl = await next_done
                except (*TRANSIENT, etcd_errors.ClientError, OSError) as exc:
                    error = exc
                    continue
                # The answer counts now: moving takes the lock, which a connect to a dead
                # member may hold for its whole timeout (the fencing slack is shorter).
                self._moving.add(asyncio.get_running_loop().create_task(self._move_to(index)))
                return ttl
        finally:
            for task in tasks:
                task.cancel()
        if isinstance(error, TRANSIENT):
            raise error
        raise StoreUnavailable(f"no etcd endpoint answered the keepalive: {error}") from error

    async def _spare(self, index: int, timeout: float) -> aetcd.Client:
        """The kept connection to endpoint ``index`` (see ``__init__``), connecting it first
        if need be: one background connect per endpoint, which callers wait for up to
        ``timeout`` and never cancel."""
        if self._closed:
            raise StoreUnavailable("store is closed")
        client = self._spares.get(index)
        if client is not None:
            return client
        connecting = self._spare_connecting.get(index)
        if connecting is None or connecting.done():
            connecting = asyncio.get_running_loop().create_task(self._connect_spare(index))
            connecting.add_done_callback(retrieve_outcome)
            self._spare_connecting[index] = connecting
        return await asyncio.wait_for(asyncio.shield(connecting), timeout)

    async def _connect_spare(self, index: int) -> aetcd.Client:
        host, port = self.endpoints[index]
        client = self._new_client(host, port, self.timeout)
        try:
            await asyncio.wait_for(client.connect(), self.timeout + 0.5)
        except BaseException:
            await self._close_quietly(client)
            raise
        if self._closed:
            await self._close_quietly(client)
            raise StoreUnavailable("store is closed")
        adapter.require_leader(client)
        self._spares[index] = client
        return client

    async def _on_spare(self, index: int, op: Callable[[aetcd.Client], Awaitable[T]],
                        timeout: float) -> T:
        """``op`` on the kept connection to endpoint ``index``, within ``timeout``. A slow or
        unreachable member keeps its connection (gRPC reconnects a channel by itself, within
        the reconnect backoff, and a member electing answers late, not never); one whose
        auth token was refused (the member restarted: its tokens are gone) is dropped, and
        the next call connects and authenticates again."""
        client = await self._spare(index, timeout)
        try:
            return await asyncio.wait_for(adapter.mapped_errors(op)(client), timeout)
        except etcd_errors.UnauthenticatedError:
            self._drop_spare(index, client)
            raise

    def _drop_spare(self, index: int, client: aetcd.Client) -> None:
        if self._spares.get(index) is client:
            del self._spares[index]
            self._closing.add(asyncio.get_running_loop().create_task(
                self._close_quietly(client, delay=5.0)))

    async def warm_spares(self, lease_id: int, timeout: float) -> None:
        """Keep the spare connections usable: one keepalive of ``lease_id`` through each
        endpoint other than the one in use (it proves the connection and, with
        credentials, keeps its auth token from expiring). Nothing is raised. For a lease
        holder, every half minute (``LeaseKeeper``)."""
        others = [i for i in range(len(self.endpoints)) if i != self._index]
        await asyncio.gather(*(self._on_spare(i, lambda c: c.refresh_lease(lease_id), timeout)
                               for i in others), return_exceptions=True)

    async def _move_to(self, index: int) -> None:
        """Make ``index`` the current endpoint (after it answered when the current did not)."""
        connecting = self._connecting
        if connecting is not None and not connecting.done() and index != self._index:
            connecting.cancel()  # to a member that did not answer: it may be dead
        try:
            await self._move_to_locked(index)
        finally:
            self._moving.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]

    async def _move_to_locked(self, index: int) -> None:
        async with self._lock:
            if self._closed:
                return
            if index == self._index:
                return
            # The spare that answered becomes the connection in use: no connect now.
            old, self._client = self._client, self._spares.pop(index, None)
            if self._client is not None:
                self._generation += 1
            previous, self._index = self.endpoint, index
            if self._unreachable_since is None:
                log.info("etcd endpoint failover", failed=previous, next=self.endpoint,
                         error="answered first")
            self._answered()
        if old is not None:
            self._closing.add(asyncio.get_running_loop().create_task(
                self._close_quietly(old, delay=5.0)))

    async def keepalive_many(self, lease_ids: Sequence[int], timeout: float) -> dict[int, int]:
        """Keep many leases alive over one LeaseKeepAlive stream (as etcd's Go client
        multiplexes them): one RPC carries every id. Returns lease id -> granted TTL (0: the
        lease is gone). No retry; ids without a reply before ``timeout`` are left out."""
        if not lease_ids:
            return {}
        async def op(client: aetcd.Client) -> dict[int, int]:
            return await adapter.keepalive_stream(client, lease_ids, timeout)

        client, generation = await self._current(timeout)
        try:
            ttls = await asyncio.wait_for(adapter.mapped_errors(op)(client), timeout + 0.5)
        except TRANSIENT as exc:
            await self._rotate(generation, exc)
            raise
        if ttls:
            self._answered()
        return ttls

    async def member_view(self, host: str, port: int,
                           timeout: float) -> tuple[int, int, int] | None:
        """(member id, leader id as that member sees it (0: none), cluster size), or None."""
        client = self._new_client(host, port, max(1, int(timeout + 0.999)))
        try:
            await asyncio.wait_for(client.connect(), timeout)
            return await asyncio.wait_for(adapter.member_status(client, timeout), timeout)
        except (TimeoutError, adapter.RpcError, etcd_errors.ClientError, OSError):
            return None
        finally:
            await self._close_quietly(client)

    async def leaderless_majority(self, timeout: float = 0.5) -> bool:
        """True if a majority of the etcd cluster's members say, right now, that they have no
        raft leader. Without a leader no lease can expire, and a new leader extends every
        lease by its full TTL, so a lease holder may extend its fencing deadline from before
        this call."""
        async def view(index: int) -> tuple[int, int, int] | None:
            try:
                if index == self._index and self._client is not None:
                    return await asyncio.wait_for(adapter.mapped_errors(
                        lambda c: adapter.member_status(c, timeout))(self._client), timeout)
                return await self._on_spare(
                    index, lambda c: adapter.member_status(c, timeout), timeout)
            except (*TRANSIENT, adapter.RpcError, etcd_errors.ClientError, OSError):
                return None

        views = await asyncio.gather(*(view(i) for i in range(len(self.endpoints))))
        answered = [v for v in views if v is not None]
        if not answered:
            return False
        size = max(v[2] for v in answered)
        leaderless = {member for member, leader, _ in answered if leader == 0}
        return len(leaderless) > size // 2

    async def live_leases(self) -> set[int]:
        """The ids of every lease etcd has now (one LeaseLeases call: a few hundred kB at
        10,000 nodes). A lease absent here has expired or was revoked."""

        return await self.call(adapter.mapped_errors(
            lambda c: adapter.lease_ids(c, self.timeout)))

    async def lease_ttl(self, lease_id: int) -> int:
        """Whole seconds left of a lease, rounded down as etcd does: 0 in its last second,
        -1 once it no longer exists (see ``lease_alive``)."""
        info = await self.call(lambda c: c.get_lease_info(lease_id, keys=False))
        return int(info.TTL)

    async def lease_alive(self, lease_id: int) -> bool:
        """True while etcd still has the lease (its keys exist), its last second included."""
        return await self.lease_ttl(lease_id) >= 0

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease (its keys are deleted at once)."""
        with contextlib.suppress(etcd_errors.ClientError):
            await self.call(lambda c: c.revoke_lease(lease_id), budget=3.0)

    # -- watches -------------------------------------------------------------------------

    async def watch_key(self, key: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change of exactly ``key`` (not of keys it is a prefix of) from
        ``start_revision`` on, across reconnects; a compaction yields the key's current
        state as a put or a delete."""
        async for event in key_events(self.watch_prefix(key, start_revision), key):
            yield event

    async def watch_prefix(self, prefix: str,
                           start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
        """Every change under ``prefix`` from ``start_revision`` on, across reconnects.

        The watch resumes from the last revision seen + 1 on another endpoint when its
        member dies: no event is lost or repeated. If that revision was compacted, a
        ``Resync`` with the full current state is yielded instead and the watch goes on.
        """
        next_revision = start_revision
        retry = Retry("etcd watch", self.watch_policy, logger=log, prefix=prefix)
        while True:
            try:
                client, generation = await self._current()
            except TRANSIENT as exc:
                await retry.failed(exc)
                continue
            watch = None
            try:
                watch = await client.watch_prefix(prefix.encode(), start_revision=next_revision)
                log.debug("watch created", prefix=prefix, start_revision=next_revision)
                self._answered()
                retry.succeeded()
                async for event in watch:
                    kv = adapter.to_kv(event.kv)
                    log.debug("watch event", key=kv.key, revision=kv.mod_revision)
                    next_revision = kv.mod_revision + 1
                    kind: Literal["put", "delete"] = "put" if event.kind == "PUT" else "delete"
                    yield WatchEvent(kind, kv)
            except etcd_errors.RevisionCompactedError:
                revision, kvs = await self.get_prefix(prefix)
                log.info("watch revision compacted, full re-read", prefix=prefix,
                         revision=revision)
                next_revision = revision + 1
                yield Resync(revision, tuple(kvs))
            except (*TRANSIENT, etcd_errors.WatchTimeoutError, etcd_errors.ClientError) as exc:
                await self._rotate(generation, exc)
                await retry.failed(exc)
            else:
                # The stream ended without error: the connection was closed under us.
                await asyncio.sleep(0.02)
            finally:
                if watch is not None and not self._closed:
                    # The consumer stopped (or we reconnect): free the server-side watch.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(watch.cancel())

"""A lease kept alive by a loop, with the fencing deadline derived from acknowledged keepalives.

aetcd's ``refresh`` sends a single keepalive; this loop sends one every ``heartbeat`` seconds
and tracks ``deadline``: send time of the last acknowledged keepalive + granted TTL - margin
(monotonic clock). Past the deadline the holder must consider itself fenced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from hafo.decisions.fencing import fence_deadline, renewed_deadline
from hafo.store.client import TRANSIENT
from hafo.store.protocol import Store
from hafo.tasks import bounded, loop_time

log = structlog.get_logger("hafo.lease")

Clock = Callable[[], float]

#: How often a lease holder proves its spare connections to the other etcd members (one
#: keepalive through each): they are ready when the member in use dies, and an auth token
#: on them does not expire unused (etcd's simple tokens: 5 minutes).
WARM_SPARES_EVERY = 30.0


#: How long past its own timeout a keepalive (or a question to the members) may take before
#: the keeper stops waiting for it.
#: A call's timeout bounds it only if its cancellation ends it at once: as etcd comes back
#: from a stall, keepalives were seen answered 3 to 4 s after they were sent, their 1 s
#: timeout notwithstanding, and while the keeper waited no failsafe question went out, so
#: the guards' deadline lapsed with every controller still promising (chaos seed 11).
HUNG_GRACE = 0.25


class LeaseLost(Exception):
    """etcd says the lease no longer exists (it expired or was revoked)."""


class LeaseKeeper:
    """Holds one lease: grant or adopt it, keep it alive, expose the fencing deadline."""

    def __init__(self, store: Store, ttl: int, heartbeat: float, margin: float,
                 clock: Clock = loop_time,
                 on_renew: Callable[[float], Awaitable[None] | None] | None = None,
                 failsafe: Callable[[float], Awaitable[float | None]] | None = None) -> None:
        self.store = store
        self.failsafe = failsafe
        self.ttl = ttl
        self.heartbeat = heartbeat
        self.margin = margin
        self.clock = clock
        self.on_renew = on_renew
        self.lease_id: int | None = None
        self.granted_ttl = ttl
        self.deadline = 0.0
        self.last_ack = 0.0
        self.lost = asyncio.Event()
        self._hedged_at = float("-inf")  # the last keepalive sent through every endpoint
        self._round: asyncio.Future[None] | None = None  # the failsafe round under way
        self._lost_why = ""
        self._warmed_at = float("-inf")  # the spare connections' last warm-up
        self._warming: asyncio.Future[None] | None = None

    async def grant(self, publish: bool = True) -> int:
        """Grant a fresh lease; the deadline starts from the grant's send time. ``publish``
        False: ``on_renew`` is not told until ``publish()`` (an agent publishes a deadline
        only once its lease holds the node name)."""
        sent = self.clock()
        self.lease_id, self.granted_ttl = await self.store.grant_lease(self.ttl)
        self.deadline = fence_deadline(sent, self.granted_ttl, self.margin)
        self.last_ack = self.clock()
        self.lost.clear()
        if publish:
            await self._notify()
        return self.lease_id

    async def publish(self) -> None:
        """Tell ``on_renew`` the current deadline."""
        await self._notify()

    async def adopt(self, lease_id: int) -> bool:
        """Take over an existing lease (agent restart) if it is still alive."""
        sent = self.clock()
        try:
            ttl = await self.store.keepalive(lease_id, timeout=self.heartbeat * 2)
        except TRANSIENT:
            return False
        if ttl <= 0:
            return False
        self.lease_id, self.granted_ttl = lease_id, ttl
        self.deadline = fence_deadline(sent, ttl, self.margin)
        self.last_ack = self.clock()
        self.lost.clear()
        await self._notify()
        return True

    async def _notify(self) -> None:
        if self.on_renew is not None:
            result = self.on_renew(self.deadline)
            if result is not None:
                await result

    def declare_lost(self, lease_id: int | None, why: str) -> None:
        """etcd said, in an answer to another request, that lease ``lease_id`` is gone: if
        it is still the lease held, ``run`` raises LeaseLost at once instead of at the next
        keepalive (up to a heartbeat later, while a controller may already act on the node's
        absence). An answer about an earlier lease (a call that retried through an outage
        while the lease was replaced) changes nothing."""
        if lease_id is not None and lease_id == self.lease_id and not self.lost.is_set():
            self._lost_why = f"lease {self.lease_id:x} {why}"
            self.lost.set()

    def valid(self) -> bool:
        """True while the fencing deadline has not passed."""
        return self.clock() < self.deadline and not self.lost.is_set()

    async def keepalive_once(self, timeout: float | None = None,
                             everywhere: bool = False) -> bool:
        """Send one keepalive; True if acknowledged. Raises LeaseLost if the lease is gone.
        ``everywhere``: through every etcd endpoint at once, the first answer counting (the
        retry after a failure, when the endpoint in use may be a dead machine)."""
        assert self.lease_id is not None, "grant() or adopt() first"
        sent = self.clock()
        send = self.store.keepalive_any if everywhere else self.store.keepalive
        limit = timeout or self.heartbeat
        try:
            ttl = await bounded(send(self.lease_id, timeout=limit), limit + HUNG_GRACE)
        except TRANSIENT as exc:
            log.warning("keepalive failed", error=type(exc).__name__,
                        fenced_in=round(self.deadline - self.clock(), 2))
            return False
        if ttl <= 0:
            self._lost_why = f"lease {self.lease_id:x} expired"
            self.lost.set()
            raise LeaseLost(self._lost_why)
        self.granted_ttl = ttl
        self.deadline = renewed_deadline(self.deadline, sent, ttl, self.margin)
        self.last_ack = self.clock()
        await self._notify()
        return True

    async def _extend_if(self, confirm: Callable[[float], Awaitable[bool]], timeout: float,
                         why: str) -> None:
        """If ``confirm`` proves that the lease cannot expire (or that nobody can act on its
        expiry) for TTL from before the check, move the deadline to (send time of the check
        + TTL - margin)."""
        sent = self.clock()
        try:  # the members' answers may come late too: the keeper's turn does not wait
            proven = await bounded(confirm(timeout), timeout + HUNG_GRACE)
        except TimeoutError:
            return
        if proven:
            await self._extend_from(sent, why)

    async def _extend_from(self, sent: float, why: str) -> None:
        """Move the deadline to (``sent`` + TTL - margin), never backwards."""
        await self._extend_to(sent + self.granted_ttl - self.margin, why)

    async def _extend_to(self, target: float, why: str) -> None:
        """Move the deadline to ``target``, never backwards."""
        if self.lost.is_set():
            return
        before = self.deadline
        self.deadline = max(self.deadline, target)
        if self.deadline > before:
            log.debug("deadline extended", why=why,
                      fenced_in=round(self.deadline - self.clock(), 2))
            await self._notify()

    async def _extend_if_leaderless(self, timeout: float) -> None:
        """During an etcd leader election no lease can expire, and the new leader extends
        every lease by its TTL: a majority of members saying they have no leader is proof."""
        await self._extend_if(lambda t: self.store.leaderless_majority(timeout=t), timeout,
                              "etcd has no leader, leases cannot expire")

    async def _extend_if_failsafe(self, timeout: float) -> None:
        """Ask the failsafe hook (seconds from now the deadline may move to, on every
        controller's promise, or None) and wait for its answer up to ``timeout``. A round
        still unanswered then goes on in the background, for up to twice as long, and
        extends the deadline when it ends: its answers count from their send time, so a
        controller that is slow to answer (busy as etcd comes back) still carries the work,
        while the keepalive retries go on at their own pace. One round at a time."""
        if self.failsafe is None:
            return
        if self._round is None or self._round.done():
            self._round = asyncio.ensure_future(self._failsafe_round(self.failsafe, 2 * timeout))
        await asyncio.wait({self._round}, timeout=timeout)

    async def _failsafe_round(self, confirm: Callable[[float], Awaitable[float | None]],
                              timeout: float) -> None:
        try:
            left = await confirm(timeout)
        except Exception as exc:  # a bug in a round must not end the keeper's cover silently
            log.error("failsafe round failed", error=repr(exc))
            return
        if left is not None:
            await self._extend_to(self.clock() + left,
                                  "failsafe: every controller reports etcd unavailable")

    async def _keepalive_gathering_proof(self) -> bool:
        """One keepalive with the heartbeat as its timeout. If it is still unanswered after
        half of that (a raft leader election stalls every write for a second or more), ask
        the members meanwhile whether they have a leader: proof gathered during the stall
        extends the deadline before the keepalive times out, not after, when the election
        may already be over and the proof gone."""
        keepalive = asyncio.ensure_future(self.keepalive_once())
        done, _ = await asyncio.wait({keepalive}, timeout=self.heartbeat / 2)
        if not done:
            try:
                await self._extend_if_leaderless(self.heartbeat / 2)
            except BaseException:
                keepalive.cancel()
                raise
        return await keepalive

    async def run(self) -> None:
        """Keep the lease alive until cancelled or lost (then LeaseLost is raised).

        A keepalive goes out every ``heartbeat``. When one is slow (half a heartbeat without an
        answer), and after a failure, the keeper asks the etcd members whether they have a
        raft leader (see ``_extend_if_leaderless``), so an etcd leader election does not fence
        healthy work; after a failure it also retries at once with a shorter timeout, through
        every endpoint at once (a powered-off etcd machine only times out).
        """
        keeping = asyncio.ensure_future(self._keep())
        declared = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({keeping, declared}, return_when=asyncio.FIRST_COMPLETED)
            if keeping.done():
                keeping.result()  # LeaseLost, or a bug
            raise LeaseLost(self._lost_why or f"lease {self.lease_id:x} lost")
        finally:
            for task in (keeping, declared):
                task.cancel()
            await asyncio.gather(keeping, declared, return_exceptions=True)
            for background in (self._round, self._warming):
                if background is not None:
                    background.cancel()

    async def _keep(self) -> None:
        ok = True
        while True:
            started = self.clock()
            if ok and started - self._warmed_at >= WARM_SPARES_EVERY and (
                    self._warming is None or self._warming.done()):
                assert self.lease_id is not None
                self._warmed_at = started
                self._warming = asyncio.ensure_future(
                    self.store.warm_spares(self.lease_id, self.heartbeat))
            if ok:
                ok = await self._keepalive_gathering_proof()
            else:
                retry = min(0.5, self.heartbeat / 2)
                # A controller takes up to 0.4 s to find etcd unreachable before it answers
                # (hafo.controller.failsafe.PROBE_TIMEOUT); a round that waited only as long
                # as a keepalive retry missed answers on a busy machine and fenced healthy
                # work in a whole-etcd restart. The extension counts from the round's start,
                # so a longer round is as safe.
                # Through every endpoint at once, at most once a heartbeat: enough to find a
                # live member within the slack, and a long etcd outage does not open a
                # connection to every member ten times a second.
                everywhere = started - self._hedged_at >= self.heartbeat
                if everywhere:
                    self._hedged_at = started
                # A keepalive through every endpoint opens fresh connections, which on a
                # busy machine take longer than a retry's timeout: it gets a heartbeat (its
                # acknowledgement counts from its send time, so waiting longer is as safe).
                result, *extended = await asyncio.gather(
                    self.keepalive_once(self.heartbeat if everywhere else retry,
                                        everywhere=everywhere),
                    self._extend_if_leaderless(retry),
                    self._extend_if_failsafe(max(retry, self.heartbeat)),
                    return_exceptions=True)
                for outcome in (result, *extended):
                    if isinstance(outcome, BaseException):
                        raise outcome
                ok = bool(result)
            elapsed = self.clock() - started
            period = self.heartbeat if ok else 0.1
            await asyncio.sleep(max(0.0, period - elapsed))

    async def revoke(self) -> None:
        """Give the lease up (clean shutdown): its keys disappear at once."""
        if self.lease_id is not None:
            await self.store.revoke_lease(self.lease_id)
            self.lost.set()

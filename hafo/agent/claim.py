"""The agent's hold on its node name: the lease record, adopting, waiting and claiming.

The rule is ``hafo.decisions.claim``; this module does the I/O. The lease record
(``instances/.lease.json``: the lease id and the revision of the claim) lives inside the
instance records directory, so that the records and the lease that protects them are kept,
moved or lost together: an agent whose state directory is empty, wiped or elsewhere has no
lease record and so is a new claimant, never an adopter of guards it cannot see.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import structlog

from hafo.agent.lease_record import (
    LeaseRecord,
    read_record,
    write_record,
)
from hafo.decisions.claim import ClaimView, decide_claim
from hafo.model.cluster import Event, Liveness
from hafo.retry import Retry, RetryPolicy
from hafo.store import KV, TRANSIENT, Compare, EventLog, Get, Keys, LeaseKeeper, Put, Store, codec

log = structlog.get_logger("hafo.agent")

WAIT_LOG_EVERY = 30.0


def etcd_away_policy(heartbeat: float) -> RetryPolicy:
    """How the agent retries holding its node (claiming, resuming, registering again) while
    etcd is away: forever, from 0.1 s doubling up to ``min(0.5, heartbeat / 2)`` and jittered
    down, so never slower than half a heartbeat (docs/safety.md: a node held again late is a
    node whose work a controller may move); a warning from the third failure."""
    wait = min(0.5, heartbeat / 2)
    return RetryPolicy(first=min(0.1, wait), cap=wait, jitter=0.5, warn_after=3)


class Displaced(Exception):
    """Another agent's lease holds the node's liveness key: our work must be fenced."""


class NodeClaim:
    """Acquire the node name (adopt, wait or claim) and keep its keys in place."""

    def __init__(self, name: str, store: Store, keys: Keys, keeper: LeaseKeeper,
                 state_dir: Path, events: EventLog, heartbeat: float,
                 fence_all: Callable[[str], None],
                 epoch_base: Callable[[], int] = lambda: 0) -> None:
        """``epoch_base``: the trusted generation's (``hafo.decisions.store_trust``): a claim
        at revision R is at epoch R + it, the epoch every assignment written after it
        exceeds."""
        self.name = name
        self.epoch_base = epoch_base
        self.store = store
        self.keys = keys
        self.keeper = keeper
        self.state_dir = state_dir
        self.events = events
        self.heartbeat = heartbeat
        self.fence_all = fence_all
        self.claimed = 0
        self.waiting_for: int | None = None  # another holder's lease while we wait

    async def _lease_alive(self, lease: int) -> bool:
        return await self.store.lease_alive(lease)

    async def _view(self, saved: LeaseRecord | None) -> tuple[ClaimView, int]:
        """What etcd says now, and the revision it was read at."""
        revision, kvs = await self.store.get_prefix(self.keys.alive(self.name))
        alive = next((kv for kv in kvs if kv.key == self.keys.alive(self.name)), None)
        node = await self.store.get(self.keys.node(self.name))
        holder = alive.lease if alive is not None else None
        recorded = None
        if node is not None:
            recorded = codec.decode_node(node.value).lease or None
        live = set()
        for lease in {holder, recorded, saved.lease if saved else None}:
            if lease and await self._lease_alive(lease):
                live.add(lease)
        return ClaimView(saved.lease if saved else None, holder, recorded, live), revision

    async def acquire(self) -> bool:
        """Hold the node name; True when our own lease was adopted (hitless restart)."""
        last_said = -math.inf  # said at once: a monotonic clock may be young (a fresh boot)
        announced: int | None = None
        retry = Retry("node claim", etcd_away_policy(self.heartbeat), logger=log,
                      node=self.name)
        while True:
            try:
                saved = read_record(self.state_dir)
                view, revision = await self._view(saved)
                retry.succeeded()
                decision = decide_claim(view)
                if decision.outcome == "adopt" and saved is not None:
                    if await self.keeper.adopt(saved.lease):
                        self.claimed = saved.claimed
                        self.waiting_for = None
                        log.info("lease adopted: running guards kept", node=self.name,
                                 lease=f"{saved.lease:x}")
                        if self.keeper.granted_ttl != self.keeper.ttl:
                            # timing changed (timing.profile, timing.lease_ttl): a lease keeps
                            # the TTL it was granted with (docs/safety.md, "The fast profile")
                            log.warning("the adopted lease keeps the TTL it was granted with; "
                                        "the configured TTL applies from this node's next "
                                        "lease", node=self.name,
                                        granted_ttl=self.keeper.granted_ttl,
                                        configured_ttl=self.keeper.ttl)
                        return True
                    continue  # it expired meanwhile: look again
                if decision.outcome == "wait":
                    self.waiting_for = decision.lease
                    if saved is not None and saved.lease in view.live:
                        # Our lease lives but no longer holds the name (its keys were deleted
                        # and another agent claimed it): what our guards run is not ours.
                        self.fence_all(f"node {self.name} is held by another agent's lease "
                                       f"{decision.lease:x}")
                    if time.monotonic() - last_said >= WAIT_LOG_EVERY:
                        last_said = time.monotonic()
                        log.warning("node name is in use: waiting until it is free (another "
                                    "agent with this name, or this node's previous agent "
                                    "whose records are gone)", node=self.name,
                                    why=decision.why, holder=f"{decision.lease:x}")
                    if announced != decision.lease:
                        announced = decision.lease
                        await self.events.append(Event(
                            ts=time.time(), kind="duplicate-node", node=self.name,
                            message=f"an agent asks for node name {self.name} while another "
                            "agent's live lease holds it; it waits until the name is free"))
                    await asyncio.sleep(self.heartbeat)
                    continue
                if await self._claim(revision, why=decision.why):
                    self.waiting_for = None
                    return False
            except TRANSIENT as exc:
                await retry.failed(exc)

    async def _claim(self, seen_free: int, why: str) -> bool:
        """Fence whatever our records still run, take a fresh lease and create the liveness
        key if nobody did meanwhile. ``seen_free``: the revision the name was seen free at;
        the claim is at its epoch (``epoch_base`` added: ``Liveness.claimed``)."""
        revision = seen_free + self.epoch_base()
        self.fence_all(f"claiming node {self.name} anew ({why})")
        if self.keeper.lease_id is None or not self.keeper.valid():
            # Not published yet: the fencing deadline file is read by every guard of this
            # state directory; a deadline of a lease that does not hold the name must never
            # reach guards of an earlier holder (docs/safety.md, rule 1b).
            await self.keeper.grant(publish=False)
        assert self.keeper.lease_id is not None
        lease = self.keeper.lease_id
        liveness = Liveness(node=self.name, lease=lease, since=time.time(), claimed=revision)
        result = await self.store.txn(
            [Compare(self.keys.alive(self.name), "create", "==", 0)],
            [Put(self.keys.alive(self.name), codec.encode(liveness.to_dict()), lease=lease)])
        if not result.succeeded:
            return False  # someone registered first: look again
        self.claimed = revision
        self._save_record(lease, revision)
        await self.keeper.publish()
        log.info("node claimed", node=self.name, lease=f"{lease:x}", claimed=revision,
                 ttl=self.keeper.granted_ttl, why=why)
        return True

    def _save_record(self, lease: int, claimed: int) -> None:
        """Write the lease record; a state directory that refuses it (read-only, full) is
        logged and the hold kept: only a restarted agent misses the record."""
        try:
            write_record(self.state_dir, LeaseRecord(lease, claimed))
        except OSError as exc:
            log.error("lease record not written: a restarted agent cannot adopt this lease",
                      node=self.name, path=str(exc.filename or self.state_dir),
                      error=exc.strerror or str(exc))

    async def resume(self, workloads: Collection[str], seen_at: int) -> bool:
        """After our lease expired in an etcd stall or outage (docs/safety.md, "An etcd
        stall"): hold the name again with a new lease *and keep the registration* (its
        ``claimed`` revision, so its instances stay ours), if and only if, in one
        transaction, nobody holds the name and no assignment copy of ``workloads`` under this
        node changed since revision ``seen_at``. A controller that moved this node's work
        did so in a transaction that required the name unheld (``hafo.controller.apply``):
        one of the two transactions fails. The new lease's deadline is published only once
        this one succeeded. True when resumed; False: claim afresh (fencing everything)."""
        if self.keeper.lease_id is None or not self.keeper.valid():
            await self.keeper.grant(publish=False)
        assert self.keeper.lease_id is not None
        lease = self.keeper.lease_id
        alive = self.keys.alive(self.name)
        compares = [Compare(alive, "create", "==", 0)]
        for workload in sorted(workloads):
            copy = self.keys.node_assignment(self.name, workload)
            compares += [Compare(copy, "version", ">", 0), Compare(copy, "mod", "<", seen_at + 1)]
        liveness = Liveness(node=self.name, lease=lease, since=time.time(),
                            claimed=self.claimed)
        result = await self.store.txn(
            compares, [Put(alive, codec.encode(liveness.to_dict()), lease=lease)], [Get(alive)])
        if not result.succeeded and not self._held_by(result.reads, lease):
            return False
        self._save_record(lease, self.claimed)
        await self.keeper.publish()
        log.warning("node held again with a new lease after its lease expired; running "
                    "guards kept", node=self.name, lease=f"{lease:x}", claimed=self.claimed,
                    instances=len(workloads))
        return True

    def _held_by(self, reads: Sequence[KV | None], lease: int) -> bool:
        """The liveness key read in a failed resume is held by ``lease``, the one that resume
        put it with: an earlier try of the same resume committed although its answer was lost
        (a timeout as etcd came back from a stall), and retrying it found its own key. Nobody
        else puts a key with our lease, and no controller moved our work since: its move
        requires the name unheld, which our committed try made it not."""
        current = reads[0] if reads else None
        return current is not None and current.lease == lease

    async def ensure_alive_key(self) -> int:
        """Put our liveness key back if it is missing (deleted by hand while our lease lives);
        Displaced if another lease holds it. Returns the revision."""
        lease = self.keeper.lease_id
        assert lease is not None
        liveness = Liveness(node=self.name, lease=lease, since=time.time(),
                            claimed=self.claimed)
        key = self.keys.alive(self.name)
        result = await self.store.txn([Compare(key, "create", "==", 0)],
                                      [Put(key, codec.encode(liveness.to_dict()), lease=lease)],
                                      [Get(key)])
        if not result.succeeded:
            current = result.reads[0] if result.reads else None
            if current is not None and current.lease == self.keeper.lease_id:
                return result.revision  # our lease since (resumed while this call retried)
            if current is not None and current.lease != lease:
                raise Displaced(f"node {self.name}'s liveness key is held by lease "
                                f"{current.lease:x}, not ours ({lease:x})")
        return result.revision


"""A restarted agent renews its own lease before anything else (hitless restarts).

After a crash the agent's guards keep their workloads only until the fencing deadline of the
last keepalive: ``lease_ttl - fence_margin`` after it, so between ``lease_ttl - fence_margin -
heartbeat`` and ``lease_ttl - fence_margin`` seconds after the crash (1.5 to 2.5 s by
default). Starting the full agent (the API server, metrics, the GPU backend, NVML's init on a
real node) takes longer than that on a busy machine. So the ``hafo agent`` command first reads
the lease record of its state directory and the brief of etcd settings its predecessor left
beside it (``hafo.agent.renewal_brief``), sends one keepalive for that lease and publishes
the new deadline, before the config is even loaded (about a quarter of a second after the
exec, against most of a second with the config models built first); the claim rule
(``hafo.agent.claim``) then decides as before whether the lease is ours to adopt. Without a
brief (the first start of this version, an inline etcd password) it renews the same way once
the config is loaded (``renew_saved_lease``).

Renewing is safe whatever the claim decides: it only extends a lease this node already holds,
so a claimant of the name waits longer; an agent that finds the name held by another lease
fences its own guards at once (``NodeClaim.acquire``). The published deadline is computed as
the lease keeper's (send time + granted TTL - margin) and never moves backwards.

One renewal buys one TTL. With the fast timing profile (a 1 s lease) that ends before the rest
of the start-up (the heavy imports, the API server: about a second on a busy 2-core machine)
reaches the claim, so a ``LeaseBridge`` goes on renewing the recorded lease every heartbeat, in
a thread of its own (the imports hold the event loop), until the agent is about to claim the
node (``LeaseBridge.stop``; it writes nothing after that returns), the lease is gone, or
``BRIDGE_LIMIT`` has passed (a start-up stuck for that long must not keep the node alive).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.agent.fencefile import FENCE_FILE, read_deadline, write_deadline
from hafo.agent.lease_record import read_record
from hafo.agent.renewal_brief import RenewalBrief, read_brief, state_dir_of
from hafo.decisions.fencing import renewed_deadline
from hafo.store.client import EtcdStore
from hafo.store.tls import TlsFiles


@dataclass(frozen=True)
class EarlyRenewal:
    """What the start-up's renewal did: seconds the guards had left before it
    (``had_left``, the margin the restart kept) and have left after it (``left``), and the
    bridge that renews on until the claim."""

    had_left: float
    left: float
    bridge: LeaseBridge


#: The longest a ``LeaseBridge`` renews for a start-up that has not reached its claim (s).
BRIDGE_LIMIT = 20.0


class LeaseBridge:
    """Renews the recorded lease every heartbeat, in a thread with its own event loop and
    etcd client, from the early renewal until ``stop`` (the agent is about to claim the
    node), the lease is gone, or ``limit`` seconds have passed. Each acknowledged keepalive
    publishes its deadline as the first renewal did; none is written once ``stop`` returned."""

    def __init__(self, state_dir: Path, lease: int, brief: RenewalBrief,
                 make_store: Callable[[], EtcdStore], limit: float = BRIDGE_LIMIT) -> None:
        self.state_dir = state_dir
        self.lease = lease
        self.brief = brief
        self.make_store = make_store
        self.limit = limit
        self.renewals = 0  # keepalives acknowledged (tests, logs)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name="hafo-lease-bridge",
                                        daemon=True)

    def start(self) -> None:
        """Start renewing (the first keepalive one heartbeat from now)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing: no deadline is written after this returns."""
        with self._lock:
            self._stopped.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end (after ``stop``)."""
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            asyncio.run(self._renew_until_stopped())
        except Exception:  # best effort: the agent's own keeper follows
            return

    async def _stopped_within(self, seconds: float) -> bool:
        """Wait ``seconds`` (the loop running: the etcd client's own tasks go on); True as
        soon as ``stop`` was called."""
        end = time.monotonic() + seconds
        while not self._stopped.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.02, left))
        return True

    async def _renew_until_stopped(self) -> None:
        heartbeat = self.brief.heartbeat
        until = time.monotonic() + self.limit
        store = self.make_store()
        try:
            while not await self._stopped_within(heartbeat) and time.monotonic() < until:
                sent = time.monotonic()
                try:
                    ttl = await asyncio.wait_for(store.keepalive(self.lease, timeout=heartbeat),
                                                 heartbeat * 2)
                except Exception:
                    continue  # etcd slow or away: try again a heartbeat later
                if ttl <= 0:
                    return  # the lease is gone: nothing left to bridge
                with self._lock:
                    if self._stopped.is_set():
                        return
                    publish_renewal(self.state_dir, sent, ttl, self.brief.fence_margin)
                    self.renewals += 1
        finally:
            await store.close()


def publish_renewal(state_dir: Path, sent: float, ttl: int, margin: float) -> tuple[float, float]:
    """Publish the deadline of a keepalive sent at ``sent`` and acknowledged with ``ttl``, as
    the lease keeper computes it and never backwards: (the deadline before, the one now)."""
    before = read_deadline(state_dir / FENCE_FILE)
    deadline = renewed_deadline(before, sent, ttl, margin)
    write_deadline(state_dir, deadline)
    return before, deadline


def _brief_store(brief: RenewalBrief) -> Callable[[], EtcdStore]:
    """A maker of etcd clients from the brief's settings (raises for an unreadable password
    file at once, not in the maker)."""
    password = Path(brief.password_file).read_text().strip() if brief.password_file else None
    tls = TlsFiles(brief.ca, brief.cert, brief.key) if brief.ca else None
    return lambda: EtcdStore(brief.endpoints, username=brief.username, password=password,
                             tls=tls, reconnect_backoff=brief.heartbeat / 2)


async def renew_from_brief(config_path: str) -> EarlyRenewal | None:
    """Before the config is loaded: renew the recorded lease with the brief of the agent
    before us (an ``EarlyRenewal``: the slack kept, the seconds left, the started bridge), or
    None (no brief, no record, the lease is gone, etcd did not answer in time, or anything
    else unexpected)."""
    try:
        state_dir = state_dir_of(config_path)
        brief = read_brief(state_dir) if state_dir is not None else None
        if state_dir is None or brief is None:
            return None
        make_store = _brief_store(brief)
    except Exception:  # best effort: the full start-up reports every problem properly
        return None
    return await _renew(state_dir, make_store, brief)


async def renew_saved_lease(config: Any) -> EarlyRenewal | None:
    """Keep the lease of our records alive and publish its deadline (an ``EarlyRenewal``), or
    None (no records, the lease is gone, or etcd did not answer in time)."""
    assert config.node is not None
    timing = config.timing
    brief = RenewalBrief(tuple(config.etcd.endpoints), timing.heartbeat, timing.fence_margin)
    return await _renew(Path(config.node.state_dir),
                        lambda: EtcdStore.from_config(config.etcd,
                                                      reconnect_backoff=timing.heartbeat / 2),
                        brief)


async def _renew(state_dir: Path, make_store: Callable[[], EtcdStore],
                 brief: RenewalBrief) -> EarlyRenewal | None:
    """One keepalive for the recorded lease through a store of ``make_store`` (closed after),
    the new deadline published if it was acknowledged, and a bridge started."""
    try:
        store = make_store()
    except Exception:
        return None
    try:
        record = read_record(state_dir)
        if record is None:
            return None
        sent = time.monotonic()
        ttl = await asyncio.wait_for(store.keepalive(record.lease, timeout=brief.heartbeat),
                                     brief.heartbeat * 2)
        if ttl <= 0:
            return None
        before, deadline = publish_renewal(state_dir, sent, ttl, brief.fence_margin)
        bridge = LeaseBridge(state_dir, record.lease, brief, make_store)
        bridge.start()
        return EarlyRenewal(had_left=before - sent, left=deadline - time.monotonic(),
                            bridge=bridge)
    except Exception:  # best effort: the claim that follows reports etcd's errors properly
        return None
    finally:
        await store.close()

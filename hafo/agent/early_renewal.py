"""A restarted agent renews its own lease before anything else (hitless restarts).

After a crash the agent's guards keep their workloads only until the fencing deadline of the
last keepalive: ``lease_ttl - fence_margin`` after it, so between ``lease_ttl - fence_margin -
heartbeat`` and ``lease_ttl - fence_margin`` seconds after the crash (1.5 to 2.5 s by
default). Starting the full agent (the API server, metrics, the GPU backend, NVML's init on a
real node) takes longer than that on a busy machine. So the ``hafo agent`` command first reads
the lease record of its state directory, sends one keepalive for that lease and publishes the
new deadline, having imported only the store; the claim rule (``hafo.agent.claim``) then
decides as before whether the lease is ours to adopt.

Renewing is safe whatever the claim decides: it only extends a lease this node already holds,
so a claimant of the name waits longer; an agent that finds the name held by another lease
fences its own guards at once (``NodeClaim.acquire``). The published deadline is computed as
the lease keeper's (send time + granted TTL - margin) and never moves backwards.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from hafo.agent.fencefile import FENCE_FILE, read_deadline, write_deadline
from hafo.agent.lease_record import read_record
from hafo.decisions.fencing import renewed_deadline
from hafo.model.config import Config
from hafo.store import EtcdStore


async def renew_saved_lease(config: Config) -> float | None:
    """Keep the lease of our records alive and publish its deadline; the seconds left before
    that deadline, or None (no records, the lease is gone, or etcd did not answer in time)."""
    assert config.node is not None
    state_dir = Path(config.node.state_dir)
    record = read_record(state_dir)
    if record is None:
        return None
    timing = config.timing
    store = EtcdStore.from_config(config.etcd, reconnect_backoff=timing.heartbeat / 2)
    try:
        sent = time.monotonic()
        ttl = await asyncio.wait_for(store.keepalive(record.lease, timeout=timing.heartbeat),
                                     timing.heartbeat * 2)
        if ttl <= 0:
            return None
        deadline = renewed_deadline(read_deadline(state_dir / FENCE_FILE), sent, ttl,
                                    timing.fence_margin)
        write_deadline(state_dir, deadline)
        return deadline - time.monotonic()
    except Exception:  # best effort: the claim that follows reports etcd's errors properly
        return None
    finally:
        await store.close()

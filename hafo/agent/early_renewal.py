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
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from hafo.agent.fencefile import FENCE_FILE, read_deadline, write_deadline
from hafo.agent.lease_record import read_record
from hafo.agent.renewal_brief import RenewalBrief, read_brief, state_dir_of
from hafo.decisions.fencing import renewed_deadline
from hafo.store.client import EtcdStore
from hafo.store.tls import TlsFiles


async def renew_from_brief(config_path: str) -> float | None:
    """Before the config is loaded: renew the recorded lease with the brief of the agent
    before us; the seconds left before the new deadline, or None (no brief, no record, the
    lease is gone, etcd did not answer in time, or anything else unexpected)."""
    try:
        state_dir = state_dir_of(config_path)
        brief = read_brief(state_dir) if state_dir is not None else None
        if state_dir is None or brief is None:
            return None
        password = None
        if brief.password_file:
            password = Path(brief.password_file).read_text().strip()
        tls = TlsFiles(brief.ca, brief.cert, brief.key) if brief.ca else None
        store = EtcdStore(brief.endpoints, username=brief.username, password=password,
                          tls=tls, reconnect_backoff=brief.heartbeat / 2)
    except Exception:  # best effort: the full start-up reports every problem properly
        return None
    return await _renew(state_dir, store, brief)


async def renew_saved_lease(config: Any) -> float | None:
    """Keep the lease of our records alive and publish its deadline; the seconds left before
    that deadline, or None (no records, the lease is gone, or etcd did not answer in time)."""
    assert config.node is not None
    timing = config.timing
    brief = RenewalBrief(tuple(config.etcd.endpoints), timing.heartbeat, timing.fence_margin)
    store = EtcdStore.from_config(config.etcd, reconnect_backoff=timing.heartbeat / 2)
    return await _renew(Path(config.node.state_dir), store, brief)


async def _renew(state_dir: Path, store: EtcdStore, brief: RenewalBrief) -> float | None:
    """One keepalive for the recorded lease through ``store`` (closed after), and the new
    deadline published if it was acknowledged."""
    try:
        record = read_record(state_dir)
        if record is None:
            return None
        sent = time.monotonic()
        ttl = await asyncio.wait_for(store.keepalive(record.lease, timeout=brief.heartbeat),
                                     brief.heartbeat * 2)
        if ttl <= 0:
            return None
        deadline = renewed_deadline(read_deadline(state_dir / FENCE_FILE), sent, ttl,
                                    brief.fence_margin)
        write_deadline(state_dir, deadline)
        return deadline - time.monotonic()
    except Exception:  # best effort: the claim that follows reports etcd's errors properly
        return None
    finally:
        await store.close()

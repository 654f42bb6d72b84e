"""The only code that talks to etcd: key schema, leases, watches, fenced txns, retries.

The names below are imported from their modules when first used (PEP 562), so that the
client alone (``hafo.store.client``) loads without the codec and the cluster models: a
restarted agent renews its lease before anything heavy is imported
(``hafo.agent.early_renewal``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "KV": "records", "Compare": "records", "Delete": "records", "Get": "records",
    "Put": "records", "TxnResult": "records",
    "TRANSIENT": "client", "EtcdStore": "client", "Resync": "client", "LeaseNotFound": "client",
    "StoreAuthError": "client", "StoreError": "client", "WatchEvent": "client",
    "Election": "election", "NotLeader": "election",
    "EventLog": "events",
    "Keys": "keys",
    "LeaseKeeper": "lease", "LeaseLost": "lease",
    "Store": "protocol",
    "StoreUnavailable": "retry",
    "ClusterCache": "state", "read_events": "state", "read_snapshot": "state",
    "TlsFiles": "tls",
}

__all__ = [
    "KV",
    "TRANSIENT",
    "ClusterCache",
    "Compare",
    "Delete",
    "Election",
    "EtcdStore",
    "EventLog",
    "Get",
    "Keys",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseNotFound",
    "NotLeader",
    "Put",
    "Resync",
    "Store",
    "StoreAuthError",
    "StoreError",
    "StoreUnavailable",
    "TlsFiles",
    "TxnResult",
    "WatchEvent",
    "read_events",
    "read_snapshot",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from hafo.store.client import (
        TRANSIENT,
        EtcdStore,
        LeaseNotFound,
        Resync,
        StoreAuthError,
        StoreError,
        WatchEvent,
    )
    from hafo.store.election import Election, NotLeader
    from hafo.store.events import EventLog
    from hafo.store.keys import Keys
    from hafo.store.lease import LeaseKeeper, LeaseLost
    from hafo.store.protocol import Store
    from hafo.store.records import KV, Compare, Delete, Get, Put, TxnResult
    from hafo.store.retry import StoreUnavailable
    from hafo.store.state import ClusterCache, read_events, read_snapshot
    from hafo.store.tls import TlsFiles

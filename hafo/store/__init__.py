"""The only code that talks to etcd: key schema, leases, watches, fenced txns, retries."""

from hafo.store.client import (
    KV,
    TRANSIENT,
    Compare,
    Delete,
    EtcdStore,
    Get,
    Put,
    Resync,
    StoreAuthError,
    StoreError,
    TxnResult,
    WatchEvent,
)
from hafo.store.election import Election, NotLeader
from hafo.store.events import EventLog
from hafo.store.keys import Keys
from hafo.store.lease import LeaseKeeper, LeaseLost
from hafo.store.protocol import Store
from hafo.store.retry import StoreUnavailable
from hafo.store.state import ClusterCache, read_events, read_snapshot
from hafo.store.tls import TlsFiles

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

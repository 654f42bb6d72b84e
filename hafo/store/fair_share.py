"""The queues' decayed usage history in etcd (``Keys.fair_share``;
``fair_sharing.usage_half_life``): one JSON value, written by the leader, read by a new
one when it takes office."""

from __future__ import annotations

import json

from hafo.decisions.usage_history import UsageHistory
from hafo.store import codec
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.records import Put

__all__ = ["decode_usage_history", "read_usage_history", "usage_history_put"]


def decode_usage_history(value: bytes) -> UsageHistory:
    """A stored history; ValueError says what is wrong with it (not JSON, not the form)."""
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    return UsageHistory.from_dict(data)


async def read_usage_history(store: Store, keys: Keys) -> UsageHistory | None:
    """The stored history; None when none is stored. ValueError: a value that does not
    decode (``decode_usage_history``)."""
    kv = await store.get(keys.fair_share)
    return None if kv is None else decode_usage_history(kv.value)


def usage_history_put(keys: Keys, history: UsageHistory) -> Put:
    """The write that stores ``history``."""
    return Put(keys.fair_share, codec.encode(history.to_dict()))

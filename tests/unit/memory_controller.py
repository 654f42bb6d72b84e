"""A controller for API unit tests: an in-memory store, and a cache that is what ``refresh``
last read from it (what ``hafo.api.make_controller_app`` asks of a controller)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from hafo.model.cluster import ClusterSnapshot, Event
from hafo.store import Keys
from hafo.store.memory import MemoryStore
from hafo.store.state import read_snapshot


class MemoryController:
    """A leading, ready controller over a ``MemoryStore``; ``refresh`` reads its snapshot."""

    name = "ctl-1"
    keys = Keys("unit")
    failsafe_hold = 3.5

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.registry = CollectorRegistry()
        self.cached = ClusterSnapshot(0, {}, {}, frozenset(), {}, {}, {})

    async def refresh(self) -> None:
        """Read the store again (the watched cache following etcd)."""
        self.cached = await read_snapshot(self.store, self.keys)

    def snapshot(self) -> ClusterSnapshot:
        """The cache."""
        return self.cached

    def ready(self) -> bool:
        return True

    def etcd_contact_age(self) -> float:
        return 0.1

    def stale_seconds(self) -> float | None:
        return None

    def not_ready_reason(self) -> str:
        return ""

    def leading(self) -> bool:
        return True

    async def recent_events(self, limit: int = 100) -> list[Event]:
        return []

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        return "available"

"""The agent's view of the assignments that name its node, kept current by a watch on its
node's copies of them (``Keys.node_assignments``): etcd sends an agent only its own."""

from __future__ import annotations

import asyncio

import structlog

from hafo.model.cluster import Assignment, Submission
from hafo.store import EtcdStore, Keys, Resync, WatchEvent, codec

log = structlog.get_logger("hafo.agent")


def for_node(assignment: Assignment, node: str) -> tuple[bool, int | None]:
    """What an assignment means to ``node``: (run it here?, epoch to stop at once or None)."""
    here = assignment.node == node
    placed = here and assignment.phase == "placed"
    urgent = assignment.stopping if (here and assignment.phase == "moving"
                                     and assignment.urgent) else None
    return placed, urgent


class NodeAssignments:
    """Placed assignments for one node, plus the specs they refer to."""

    def __init__(self, store: EtcdStore, keys: Keys, node: str) -> None:
        self.store = store
        self.keys = keys
        self.node = node
        self.placed: dict[str, Assignment] = {}
        self.urgent: dict[str, int] = {}  # workload -> epoch to stop at once (no checkpoint)
        self.specs: dict[str, Submission] = {}
        self.changed = asyncio.Event()
        self.revision = 0

    def _apply(self, key: str, value: bytes, mod_revision: int, deleted: bool) -> None:
        workload = key[len(self.keys.node_assignments(self.node)):]
        if deleted:
            self.placed.pop(workload, None)
            self.urgent.pop(workload, None)
            return
        try:
            assignment = codec.decode_assignment(value, mod_revision)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("undecodable assignment", key=key, error=str(exc))
            return
        placed, urgent = for_node(assignment, self.node)
        if placed:
            self.placed[workload] = assignment
        else:
            self.placed.pop(workload, None)
        if urgent is not None:
            self.urgent[workload] = urgent
        else:
            self.urgent.pop(workload, None)

    async def load(self) -> int:
        """Read all assignments (a full re-read, e.g. after re-registering)."""
        revision, kvs = await self.store.get_prefix(self.keys.node_assignments(self.node))
        self.placed.clear()
        self.urgent.clear()
        for kv in kvs:
            self._apply(kv.key, kv.value, kv.mod_revision, deleted=False)
        self.revision = revision
        self.changed.set()
        return revision

    async def follow(self) -> None:
        """Apply assignment changes forever."""
        async for event in self.store.watch_prefix(self.keys.node_assignments(self.node),
                                                   self.revision + 1):
            if isinstance(event, Resync):
                self.placed.clear()
                self.urgent.clear()
                for kv in event.kvs:
                    self._apply(kv.key, kv.value, kv.mod_revision, deleted=False)
                self.revision = event.revision
            elif isinstance(event, WatchEvent):
                self._apply(event.kv.key, event.kv.value, event.kv.mod_revision,
                            deleted=event.kind == "delete")
                self.revision = event.kv.mod_revision
            self.changed.set()

    async def spec(self, workload: str) -> Submission | None:
        """The workload's submission (cached; None if it was deleted)."""
        if workload not in self.specs:
            kv = await self.store.get(self.keys.workload(workload))
            if kv is None:
                return None
            self.specs[workload] = codec.decode_submission(kv.value)
        return self.specs[workload]

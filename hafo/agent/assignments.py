"""The agent's view of the assignments that name its node, kept current by a watch on its
node's copies of them (``Keys.node_assignments``): etcd sends an agent only its own."""

from __future__ import annotations

from collections.abc import Callable

from hafo.model.cluster import Assignment, Submission
from hafo.store import Keys, Store, codec
from hafo.store.watched import WatchedPrefix


def for_node(assignment: Assignment, node: str) -> tuple[Assignment | None, int | None]:
    """What an assignment means to ``node``: (the instance to run here, as this node runs it
    (a gang's: with this node's member's GPUs), or None; epoch to stop at once or None)."""
    local = assignment.on_node(node)
    placed = local if local is not None and assignment.phase == "placed" else None
    urgent = assignment.stopping if (local is not None and assignment.phase == "moving"
                                     and assignment.urgent) else None
    return placed, urgent


class NodeAssignments:
    """Placed assignments for one node, plus the specs they refer to."""

    def __init__(self, store: Store, keys: Keys, node: str) -> None:
        self.store = store
        self.keys = keys
        self.node = node
        self.placed: dict[str, Assignment] = {}
        self.urgent: dict[str, int] = {}  # workload -> epoch to stop at once (no checkpoint)
        self.park: dict[str, int] = {}  # workload -> epoch whose member here parks (warm)
        # workload -> until when this node is a suspect of it (a hang or straggler blamed on
        # it: ``Assignment.suspects``); ``on_suspect`` runs when that is new
        self.suspect_until: dict[str, float] = {}
        self.on_suspect: Callable[[str], None] | None = None
        self.specs: dict[str, Submission] = {}
        self._spec_epochs: dict[str, int] = {}  # the epoch each spec was read for
        self.copies: WatchedPrefix[Assignment] = WatchedPrefix(
            store, keys.node_assignments(node),
            lambda kv: codec.decode_assignment(kv.value, kv.mod_revision), self._changed)
        self.changed = self.copies.changed

    @property
    def revision(self) -> int:
        """The store revision the assignments reflect."""
        return self.copies.revision

    def _changed(self, key: str, _old: Assignment | None, assignment: Assignment | None) -> None:
        workload = self.keys.parse(key).workload
        if workload is None:
            return
        placed, urgent = (None, None) if assignment is None else for_node(assignment, self.node)
        if placed is not None:
            self.placed[workload] = placed
        else:
            self.placed.pop(workload, None)
        if urgent is not None:
            self.urgent[workload] = urgent
        else:
            self.urgent.pop(workload, None)
        if assignment is not None and assignment.phase == "moving" \
                and self.node in assignment.park:
            self.park[workload] = assignment.stopping
        else:
            self.park.pop(workload, None)
        until = assignment.suspects.get(self.node) if assignment is not None else None
        if until is None:
            self.suspect_until.pop(workload, None)
        elif self.suspect_until.get(workload) != until:
            self.suspect_until[workload] = until
            if self.on_suspect is not None:
                self.on_suspect(workload)

    async def load(self) -> int:
        """Read all assignments (a full re-read, e.g. after re-registering)."""
        return await self.copies.load()

    async def follow(self) -> None:
        """Apply assignment changes forever."""
        await self.copies.follow()

    async def spec(self, workload: str, epoch: int = 0) -> Submission | None:
        """The workload's submission (None if it was deleted), read again for an epoch newer
        than the one it was read for: an updated spec (``hafo submit`` of a changed spec)
        reaches its next instance, never the running one's checks."""
        if workload not in self.specs or epoch > self._spec_epochs.get(workload, 0):
            kv = await self.store.get(self.keys.workload(workload))
            if kv is None:
                return self.specs.get(workload)
            self.specs[workload] = codec.decode_submission(kv.value)
            self._spec_epochs[workload] = epoch
        return self.specs[workload]

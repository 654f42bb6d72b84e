"""Is this store the cluster we knew? (docs/safety.md, "etcd losing its data").

An etcd that lost its data directory and was started again empty, one restored from an old
snapshot, or another cluster behind the same endpoints answers every request as if nothing
were wrong: the leases are gone, the specs are gone, and a controller that believed it would
lead on an empty view, an agent would fence its work within half a second. So every daemon
remembers the cluster's identity record (a random id and an operator *generation*, written
once by the first daemon to find none) and the highest revision it saw, and judges each
read of the record against them:

- the record missing, or naming another id, or an older generation: not the cluster;
- the revision below the highest one seen (etcd's revision never goes backwards): not the
  cluster (a snapshot older than what we saw);
- a newer generation, whatever its id: an operator accepted this store as the cluster
  (``hafo restore``); the highest revision seen starts again from the one the record
  names. An operator's generation is at least the Unix time of the decision
  (``accepted_generation``), so it is newer than every generation a daemon can know
  without reading the store it was written in, and a daemon that finds no record never
  writes generation 1 over a store someone knew.

Epochs across generations. An epoch is an assignment key's mod revision plus the record's
``epoch_base``; a new store's revisions start again near 1, so an operator's decision sets a
new ``epoch_base`` past every epoch the earlier history can have had (``next_epoch_base``):
the highest one known (the backup's, the agents' reports', the store's) plus ``EPOCH_BUMP``
for the writes after it that nobody reported, as etcd's own ``--bump-revision`` advice has
it. Epochs, and so checkpoints (which sort by epoch), never go backwards.

Pure: the caller reads the record and the revision, and keeps what ``judge`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IdentityRecord:
    """The cluster's identity record in etcd (``Keys.identity``)."""

    id: str
    generation: int = 1
    #: the store's revision when this generation was accepted (its new floor)
    accepted_revision: int = 0
    created: float = 0.0
    #: added to every assignment's mod revision to make its epoch (see the module)
    epoch_base: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form."""
        return {"id": self.id, "generation": self.generation,
                "accepted_revision": self.accepted_revision, "created": self.created,
                "epoch_base": self.epoch_base}

    @classmethod
    def from_dict(cls, data: Any) -> IdentityRecord | None:
        """The record, or None for anything not of its shape (counted as missing)."""
        if not isinstance(data, dict):
            return None
        ident, generation = data.get("id"), data.get("generation", 1)
        accepted, created = data.get("accepted_revision", 0), data.get("created", 0.0)
        base = data.get("epoch_base", 0)
        if not isinstance(ident, str) or not ident or not _count(generation) \
                or not _count(accepted) or not isinstance(created, int | float) \
                or not _count(base):
            return None
        return cls(ident, generation, accepted, float(created), base)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Known:
    """What a daemon knows of its cluster: the identity it trusted and the highest revision
    it saw in it."""

    id: str
    generation: int
    revision: int
    epoch_base: int = 0

    @property
    def highest_epoch(self) -> int:
        """No epoch this daemon saw in the cluster is higher (``epoch_base`` + revision)."""
        return self.epoch_base + self.revision

    def to_dict(self) -> dict[str, Any]:
        """For the agent's state directory (``instances/.cluster.json``)."""
        return {"id": self.id, "generation": self.generation, "revision": self.revision,
                "epoch_base": self.epoch_base}

    @classmethod
    def from_dict(cls, data: Any) -> Known | None:
        """The record, or None for anything not of its shape."""
        if not isinstance(data, dict):
            return None
        ident, generation, revision = data.get("id"), data.get("generation"), data.get(
            "revision")
        base = data.get("epoch_base", 0)
        if not isinstance(ident, str) or not ident or not isinstance(generation, int) \
                or not isinstance(revision, int) or not _count(generation) \
                or not _count(revision) or not _count(base):
            return None
        return cls(ident, generation, revision, base)


@dataclass(frozen=True)
class Verdict:
    """``judge``'s answer: whether to trust the store, what to know from now on, and why
    not (one line, for logs, ``/readyz`` and ``hafo status``). ``create``: nothing is known
    and the store has no record: write one (create-if-absent) and judge again."""

    trusted: bool
    known: Known | None
    reason: str = ""
    create: bool = False
    #: an operator accepted the store (a newer generation) just now
    accepted: bool = False


#: how far past the highest epoch known an operator's decision sets the next ``epoch_base``
EPOCH_BUMP = 1_000_000_000


def next_epoch_base(*highest_epochs: int) -> int:
    """The ``epoch_base`` of an operator's decision: past every epoch of the earlier history
    (``highest_epochs``: the highest each source knows) by ``EPOCH_BUMP``."""
    return max(highest_epochs, default=0) + EPOCH_BUMP


def accepted_generation(*before: int, now: float) -> int:
    """The generation of an operator's decision: past every generation ``before`` and at
    least the Unix time ``now`` (see the module)."""
    return max(max(before, default=0) + 1, int(now))


def judge(known: Known | None, record: IdentityRecord | None, revision: int) -> Verdict:
    """Judge one read of the identity record (``record``, None when missing or not of its
    shape) at store revision ``revision`` against what we know."""
    if known is None:
        if record is None:
            return Verdict(False, None, "the store has no cluster identity yet", create=True)
        return Verdict(True, Known(record.id, record.generation,
                                   max(revision, record.accepted_revision), record.epoch_base))
    if record is None:
        return Verdict(False, known, (
            f"the store has no cluster identity (this cluster's is {known.id}): etcd lost "
            "its data or is another etcd; restore a backup (hafo restore) or accept the "
            "store as the cluster (hafo restore --as-is)"))
    if record.generation > known.generation:
        return Verdict(True, Known(record.id, record.generation,
                                   max(revision, record.accepted_revision), record.epoch_base),
                       accepted=True)
    if record.id != known.id:
        return Verdict(False, known, (
            f"the store holds cluster {record.id}, not this cluster ({known.id}); restore "
            "a backup (hafo restore FILE) or accept the store (hafo restore --as-is)"))
    if record.generation < known.generation:
        return Verdict(False, known, (
            f"the store is generation {record.generation} of the cluster, older than "
            f"generation {known.generation} seen before: an old snapshot"))
    if revision < known.revision:
        return Verdict(False, known, (
            f"the store's revision went backwards from {known.revision} to {revision}: "
            "etcd was restored from an older snapshot or lost writes; accept it as the "
            "cluster (hafo restore --as-is) once you have checked it"))
    return Verdict(True, Known(known.id, known.generation, revision, record.epoch_base))

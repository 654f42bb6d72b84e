"""Queue declarations: how a team's share of the pool is written (``hafo queue set``,
``PUT /v1/queues/{name}``), validated into a frozen ``QueueSpec``.

A workload names its queue (``WorkloadSpec.queue``, default ``default``). A queue has a
nominal quota in GPUs (``gpus``; a MIG device counts by its fraction of a GPU, a gang all its
members, a service all its replicas; none: no quota, its work is admitted whenever there is
room, as in a pool without queues). Queues of one ``cohort`` lend each other the quota they
do not use: a queue may borrow at most ``borrowing_limit`` GPUs above its nominal quota (none
given: as much as the cohort lends), and lends at most ``lending_limit`` of its unused quota
(none given: all of it). Among queues that borrow, the one with the lowest weighted share of
what it borrows goes first (``weight``: a larger weight, a larger fair share; design in
docs/design.md, "Queues and fair share"; decisions in ``hafo.decisions.quota`` and
``hafo.decisions.fair_order``).

``QueueSpec`` is the one declaration of the format (docs/reference/queues.md, "Queues"):
``parse_queue`` validates with it, ``to_dict`` writes its JSON form (what etcd holds under
``Keys.queue``), and the OpenAPI document's ``QueueSpec`` schema is generated from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Annotated, Any

from pydantic import Field, Strict

from hafo.model.names import WORKLOAD_NAME
from hafo.model.schema import INTEGER, OMIT_DEFAULT, Matches, Positive, Schema, Section, invalid

__all__ = ["DEFAULT_QUEUE", "MAX_MODELS", "MAX_MODEL_GLOB", "MAX_QUEUE_GPUS", "QUEUE",
           "QUEUE_NAME", "REST", "QueueName", "QueueSpec", "flavor_label", "parse_queue"]

#: The queue of a workload whose spec names none.
DEFAULT_QUEUE = "default"
#: Queue and cohort names: as workload names (lowercase letters, digits and '-').
QUEUE_NAME = WORKLOAD_NAME
QueueName = Annotated[str, Strict(), Matches(QUEUE_NAME, "must be lowercase letters, digits "
                                             "and '-', 1-52 characters")]
#: The most GPUs one quota or limit may name (far above any pool, so a typo's extra zeros
#: are refused rather than taken).
MAX_QUEUE_GPUS = 1_000_000
QueueGpus = Annotated[int, Field(ge=0, le=MAX_QUEUE_GPUS), INTEGER]
#: The longest GPU model glob a queue's ``models`` may name, and the most globs.
MAX_MODEL_GLOB = 128
MAX_MODELS = 32
#: The flavor of the GPUs whose model matches none of a queue's ``models`` globs: the rest
#: of its quota (``gpus`` minus what ``models`` names), shown as "other".
REST = ""
ModelGlob = Annotated[str, Strict(), Matches(rf"[^\x00-\x1f]{{1,{MAX_MODEL_GLOB}}}",
                                             f"GPU model globs must be non-empty text of at "
                                             f"most {MAX_MODEL_GLOB} characters, without "
                                             "control characters")]


def flavor_label(flavor: str) -> str:
    """How a flavor is written in messages and views: its glob, or "other" for the rest."""
    return flavor if flavor != REST else "other"


@dataclass(frozen=True, slots=True)
class QueueSpec(Section):
    """One queue: its nominal quota (``gpus``; None: no quota, its work is admitted whenever
    there is room, as in a pool without queues), its ``cohort`` (None: it neither borrows nor
    lends), how much it may borrow above its quota (``borrowing_limit``; None: no limit but
    what the cohort lends), how much of its unused quota it lends (``lending_limit``; None:
    all of it) and its fair-share ``weight``."""

    name: QueueName
    """The queue's name, as a workload's name (required; the API takes it from the path)."""
    gpus: Annotated[QueueGpus | None, OMIT_DEFAULT] = None
    """The nominal quota in GPUs (a MIG device counts by its fraction of a GPU, a gang all its
    members, a service all its replicas); none: no quota, its work is admitted whenever there is
    room."""
    cohort: Annotated[QueueName | None, OMIT_DEFAULT] = None
    """A cohort's name: queues of one cohort lend each other the quota they do not use; none: it
    neither borrows nor lends."""
    borrowing_limit: Annotated[QueueGpus | None, OMIT_DEFAULT] = None
    """The most GPUs it borrows above its quota (none: as much as the cohort lends); needs a
    `cohort`."""
    lending_limit: Annotated[QueueGpus | None, OMIT_DEFAULT] = None
    """The most of its unused quota it lends, at most `gpus` (none: all of it); needs a `cohort`."""
    weight: Annotated[Positive, Field(le=1000), OMIT_DEFAULT] = 1.0
    """Among queues that borrow, a larger weight, a larger fair share."""
    models: Annotated[Mapping[ModelGlob, QueueGpus], OMIT_DEFAULT] = field(
        default_factory=dict)
    """Per-GPU-model quotas: GPU model glob -> GPUs of `gpus`; GPUs of models matching no glob
    share the rest. Needs `gpus`; the sum may not exceed it."""

    def _check(self) -> None:
        if self.models:
            self._check_models()
        if self.gpus is None and self.cohort is not None:
            invalid("cohort", "needs a quota (gpus): a queue without one neither borrows nor "
                    "lends")
        if self.lending_limit is not None and self.gpus is not None \
                and self.lending_limit > self.gpus:
            invalid("lending_limit", f"is {self.lending_limit}, above the queue's own quota "
                    f"(gpus: {self.gpus}); a queue lends at most what it has")
        if self.cohort is None and (self.borrowing_limit is not None
                                    or self.lending_limit is not None):
            which = "borrowing_limit" if self.borrowing_limit is not None else "lending_limit"
            invalid(which, "needs a cohort: a queue borrows from and lends to the queues of "
                    "its cohort")

    def _check_models(self) -> None:
        if len(self.models) > MAX_MODELS:
            invalid("models", f"names {len(self.models)} GPU model globs, more than "
                    f"{MAX_MODELS}")
        if self.gpus is None:
            invalid("models", "needs a quota (gpus): the models' quotas are parts of it, "
                    "the GPUs of no named model its rest")
        named = sum(self.models.values())
        if named > self.gpus:
            invalid("models", f"name {named} GPUs in all, above the queue's quota (gpus: "
                    f"{self.gpus}); GPUs of other models get what is left of it")

    @property
    def lendable(self) -> int:
        """The most of its quota this queue lends its cohort (when it uses none)."""
        if self.cohort is None or self.gpus is None:
            return 0
        return self.gpus if self.lending_limit is None else self.lending_limit

    @property
    def flavors(self) -> tuple[str, ...]:
        """Its flavors, in the order a GPU's model is matched: each ``models`` glob in
        declaration order, then ``REST`` (a queue without ``models``: ``REST`` only)."""
        return (*self.models, REST)

    def flavor_of(self, model: str) -> str:
        """The flavor a GPU of ``model`` counts in: the first ``models`` glob it matches,
        else ``REST``."""
        for glob in self.models:
            if fnmatchcase(model, glob):
                return glob
        return REST

    def nominal(self, flavor: str = REST) -> int:
        """Its nominal quota in ``flavor`` (0 without a quota, or for a flavor it does not
        name); ``REST``: ``gpus`` minus what ``models`` names."""
        if self.gpus is None:
            return 0
        if flavor == REST:
            return self.gpus - sum(self.models.values())
        return self.models.get(flavor, 0)

    def lendable_in(self, flavor: str = REST) -> int:
        """The most of its quota in ``flavor`` it lends its cohort: the lending limit
        applies per flavor (without ``models``: ``lendable``)."""
        if not self.models:
            return self.lendable if flavor == REST else 0
        if self.cohort is None or self.gpus is None:
            return 0
        nominal = self.nominal(flavor)
        return nominal if self.lending_limit is None else min(nominal, self.lending_limit)

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON form (round-trips through ``parse_queue``)."""
        data: dict[str, Any] = QUEUE.dump(self)
        return data


QUEUE: Schema[QueueSpec] = Schema(QueueSpec, "queue")


def parse_queue(raw: Any, field_prefix: str = "queue") -> QueueSpec:
    """Validate an untrusted mapping into a QueueSpec; ValidationError names the field."""
    return QUEUE.validate(raw, prefix=field_prefix)

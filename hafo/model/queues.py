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
docs/design.md, "Queues and fair share"; decisions in ``hafo.decisions.quota``).

``QueueSpec`` is the one declaration of the format (docs/contract.md, "Queues"):
``parse_queue`` validates with it, ``to_dict`` writes its JSON form (what etcd holds under
``Keys.queue``), and the OpenAPI document's ``QueueSpec`` schema is generated from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, Strict

from hafo.model.names import WORKLOAD_NAME
from hafo.model.schema import INTEGER, OMIT_DEFAULT, Matches, Positive, Schema, Section, invalid

__all__ = ["DEFAULT_QUEUE", "MAX_QUEUE_GPUS", "QUEUE", "QUEUE_NAME", "QueueName", "QueueSpec",
           "parse_queue"]

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


@dataclass(frozen=True, slots=True)
class QueueSpec(Section):
    """One queue: its nominal quota (``gpus``; None: no quota, its work is admitted whenever
    there is room, as in a pool without queues), its ``cohort`` (None: it neither borrows nor
    lends), how much it may borrow above its quota (``borrowing_limit``; None: no limit but
    what the cohort lends), how much of its unused quota it lends (``lending_limit``; None:
    all of it) and its fair-share ``weight``."""

    name: QueueName
    gpus: Annotated[QueueGpus | None, OMIT_DEFAULT] = None
    cohort: Annotated[QueueName | None, OMIT_DEFAULT] = None
    borrowing_limit: Annotated[QueueGpus | None, OMIT_DEFAULT] = None
    lending_limit: Annotated[QueueGpus | None, OMIT_DEFAULT] = None
    weight: Annotated[Positive, Field(le=1000), OMIT_DEFAULT] = 1.0

    def _check(self) -> None:
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

    @property
    def lendable(self) -> int:
        """The most of its quota this queue lends its cohort (when it uses none)."""
        if self.cohort is None or self.gpus is None:
            return 0
        return self.gpus if self.lending_limit is None else self.lending_limit

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON form (round-trips through ``parse_queue``)."""
        data: dict[str, Any] = QUEUE.dump(self)
        return data


QUEUE: Schema[QueueSpec] = Schema(QueueSpec, "queue")


def parse_queue(raw: Any, field_prefix: str = "queue") -> QueueSpec:
    """Validate an untrusted mapping into a QueueSpec; ValidationError names the field."""
    return QUEUE.validate(raw, prefix=field_prefix)

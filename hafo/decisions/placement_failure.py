"""Why a request could not be placed, as data until it is rendered (as Nomad's
``AllocMetric`` keeps its counts). Pure.

The placer (``hafo.decisions.placement_index``, ``hafo.decisions.gang_placement``) records
what it found: how many nodes each filter rule turned away (``NodesFiltered``), that there
was no ready node at all (``NoReadyNodes``), or how many members of a gang had room
(``GangShortage``). ``render`` makes the one sentence a pending workload shows, and only
``render``: so a later "why does my job wait" reads the counts, not the text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = ["Filtered", "GangShortage", "NoReadyNodes", "NodeReason", "NodesFiltered",
           "PlacementFailure", "Rule", "node_states", "with_node_states"]


class Rule(StrEnum):
    """The filter rule that turned a node away (``hafo.decisions.placement_rules``)."""

    NOT_REQUESTED = "not-requested"  # not the node the request may use (``only``)
    EXCLUDED = "excluded"            # the workload failed there too often
    COOLING = "cooling"              # cooling down after a failure
    HELD = "held"                    # held for a waiting gang
    APART = "apart"                  # runs another replica of the same service
    FLAVOR_FULL = "flavor-full"      # its queue's quota for the node's GPU model is used
    LABEL = "label"                  # a node-selector label not matched
    NO_KIND = "no-kind"              # no GPU of the requested kind at all
    NOT_ENOUGH = "not-enough"        # such GPUs, not enough of them free and healthy


#: A node's reason: the rule, and the reason as people read it.
NodeReason = tuple[Rule, str]


@dataclass(frozen=True)
class Filtered:
    """``nodes`` nodes turned away by ``rule``, for the reason ``why`` (as people read it)."""

    rule: Rule
    why: str
    nodes: int


@dataclass(frozen=True)
class NodesFiltered:
    """No node fits: per reason, how many nodes it filtered (sorted by the reason's text; none
    with zero nodes)."""

    filtered: tuple[Filtered, ...]

    @classmethod
    def tally(cls, counts: Mapping[NodeReason, int]) -> NodesFiltered:
        """From node counts per ``(rule, why)``; counts of zero or below are left out."""
        ordered = sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return cls(tuple(Filtered(rule, why, n) for (rule, why), n in ordered if n > 0))

    def render(self) -> str:
        """``no node fits (3 node(s): label ..., 1 node(s): not enough ...)``."""
        parts = ", ".join(f"{f.nodes} node(s): {f.why}" for f in self.filtered)
        return f"no node fits ({parts})"


#: The states of a node that takes no new work, in the order a reason names them, and what
#: brings one back where that is a command.
_UNREADY: tuple[tuple[str, str], ...] = (
    ("cordoned", " (hafo uncordon NODE)"), ("unhealthy", ""), ("down", ""))


def _unready(states: tuple[tuple[str, int], ...]) -> str:
    """``2 node(s) cordoned (hafo uncordon NODE), 1 node(s) down``."""
    counts = dict(states)
    return ", ".join(f"{counts[state]} node(s) {state}{how}" for state, how in _UNREADY
                     if counts.get(state))


@dataclass(frozen=True)
class NoReadyNodes:
    """There is no ready node to place on. ``states``: how many nodes are in each state that
    takes no new work (``cordoned``, ``unhealthy``, ``down``; none: not known, or no node
    at all), filled in by ``with_node_states``."""

    states: tuple[tuple[str, int], ...] = ()

    def render(self) -> str:
        """``no node takes new work: 2 node(s) cordoned (hafo uncordon NODE)``; ``no ready
        nodes`` when the states are not known or there is no node at all."""
        if not self.states:
            return "no ready nodes"
        return f"no node takes new work: {_unready(self.states)}"


@dataclass(frozen=True)
class GangShortage:
    """A gang of ``members`` found room for only ``found`` of them: nodes with ``gpus`` free
    healthy GPUs of its ``kind`` (``gpus`` 0: ready nodes), in one value of the ``topology``
    label where that is required; ``held`` nodes held for the waiting gang ``holder`` (0:
    none, or held for this gang). ``excluded``: ready nodes left out because the workload
    failed there too often (``PlacementRequest.exclude``); ``states``: as for
    ``NoReadyNodes``."""

    members: int
    found: int
    gpus: int
    kind: str
    topology: str | None = None
    held: int = 0
    holder: str | None = None
    excluded: int = 0
    states: tuple[tuple[str, int], ...] = ()

    def render(self) -> str:
        """``gang of 4: only 2 of 4 nodes with 8 free healthy GPUs in one rack; ...``."""
        what = f"with {self.gpus} free healthy {self.kind}" if self.gpus else "ready"
        where = f" in one {self.topology}" if self.topology is not None else ""
        held = f"; {self.held} node(s) held for {self.holder}" if self.held else ""
        excluded = (f"; {self.excluded} more node(s) excluded: the workload failed there "
                    "too often" if self.excluded else "")
        unready = f"; taking no new work: {_unready(self.states)}" if self.states else ""
        return (f"gang of {self.members}: only {self.found} of {self.members} nodes "
                f"{what}{where}{held}{excluded}{unready}")


#: Why a request could not be placed, as data.
PlacementFailure = NodesFiltered | NoReadyNodes | GangShortage


def node_states(states: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """How many nodes are in each state that takes no new work (``states``: every node's
    state, ``ClusterSnapshot.node_state``), for ``with_node_states``: counted once a cycle."""
    counts = Counter(states)
    return tuple((state, counts[state]) for state, _how in _UNREADY if counts[state])


def with_node_states(failure: PlacementFailure | str,
                     states: tuple[tuple[str, int], ...]) -> PlacementFailure | str:
    """``failure`` with ``states`` (``node_states``), where it says too few nodes were ready
    (``NoReadyNodes``, a ``GangShortage``): the placer sees only the ready nodes, so "no
    ready nodes" alone reads as if every node were gone when they are cordoned (``hafo
    drain``)."""
    if not isinstance(failure, NoReadyNodes | GangShortage) or not states:
        return failure
    return replace(failure, states=states)

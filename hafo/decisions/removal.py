"""Whether a node may be retired now (``hafo node remove``, ``DELETE /v1/nodes/{name}``), and
why not. Pure (issue 30, "Elastic capacity"; docs/reference/elastic.md, "Elastic capacity").

A node is removed only when nothing could still need its records:

- ``unknown``: no record and no liveness key names it (404 / exit 4);
- ``busy``: an assignment holds it (placed there, or moving off it while its instance still
  runs there), a gang member's included: drain it first (``--drain``: cordon, move the work
  checkpoint first, wait until it is empty), 409 / exit 5 naming the workloads;
- ``alive``: its agent's liveness key exists: an agent that still runs would register the
  node again at once (409 / exit 5; stop the agent first).

The order is that one: a busy node is reported busy even while its agent runs, so that
``--drain`` knows to drain it first. A down node with no work is removed at once: its record,
its cordon, its per-node assignment copies, its instance reports and its recovery report go
in one guarded transaction (``hafo.store.intents.remove_node``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hafo.model.cluster import ClusterSnapshot

__all__ = ["AGENT_HINT", "RefusalKind", "RemovalRefusal", "removal_refusal"]

RefusalKind = Literal["unknown", "busy", "alive"]

#: What an operator does about a live agent.
AGENT_HINT = "stop its agent first (systemctl stop hafo-agent), or it registers again"


@dataclass(frozen=True)
class RemovalRefusal:
    """Why ``node`` cannot be removed now: ``kind`` (see the module), a sentence for people,
    and for ``busy`` the workloads that hold it (sorted)."""

    node: str
    kind: RefusalKind
    message: str
    workloads: tuple[str, ...] = ()


def _listed(workloads: tuple[str, ...], most: int = 5) -> str:
    shown = ", ".join(workloads[:most])
    return shown + (f" and {len(workloads) - most} more" if len(workloads) > most else "")


def removal_refusal(snapshot: ClusterSnapshot, node: str) -> RemovalRefusal | None:
    """Why ``node`` cannot be removed in ``snapshot`` (None: it can, now)."""
    if node not in snapshot.nodes and node not in snapshot.alive:
        known = sorted(snapshot.nodes)
        some = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10
                                        else "")
        return RemovalRefusal(node, "unknown", f"no node {node!r}"
                              + (f" (nodes: {some})" if known else ""))
    holders = snapshot.holders.get(node, ())
    if holders:
        count = len(holders)
        return RemovalRefusal(
            node, "busy", f"node {node} holds {count} workload{'s' if count > 1 else ''} "
            f"({_listed(holders)}): drain it first (--drain moves them off, checkpoint "
            "first)", holders)
    if node in snapshot.alive or node in snapshot.expiring:
        return RemovalRefusal(node, "alive", f"node {node}'s agent is alive (its liveness "
                              f"key exists): {AGENT_HINT}")
    return None

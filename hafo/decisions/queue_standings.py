"""Every declared queue's standing at the start of a cycle (``QueueStanding``: its usage,
what it borrows and lends, its pending charge, its weighted dominant share), for
``hafo queues``, the metrics and the queues' JSON view (``hafo.model.queue_view``). Pure.
The figures come from ``hafo.decisions.quota.Quotas.standings``, called here for a snapshot.
"""

from __future__ import annotations

from hafo.decisions.quota import QueueStanding, Quotas
from hafo.model.cluster import ClusterSnapshot
from hafo.model.queue_view import FlavorUsage, QueueUsage
from hafo.model.queues import REST

__all__ = ["standings", "usage_views"]


def standings(snapshot: ClusterSnapshot) -> dict[str, QueueStanding]:
    """Every declared queue's standing in ``snapshot`` (``hafo queues``, the metrics)."""
    quotas = Quotas.of(snapshot)
    if quotas is None:
        return {}
    pending = [snapshot.workloads[wid].spec for wid, a in snapshot.assignments.items()
               if a.phase == "pending" and wid in snapshot.workloads]
    pending += [s.spec for wid, s in snapshot.workloads.items()  # not a service: its replicas
                if wid not in snapshot.assignments and not s.spec.is_service]
    return quotas.standings(pending)


def usage_views(snapshot: ClusterSnapshot) -> dict[str, QueueUsage]:
    """Every declared queue's usage, as the queues' JSON view shows it
    (``hafo.model.queue_view``), rounded to 1/1000 GPU; for a queue with ``models``, also
    per glob (``models``) and for the rest (``other``)."""
    out = {}
    for name, st in standings(snapshot).items():
        view = QueueUsage(used=round(st.used, 3), borrowed=round(st.borrowed, 3),
                          lent=round(st.lent, 3), pending=round(st.pending, 3),
                          share=round(st.share, 4) if st.share != float("inf") else 0.0)
        if st.flavors:
            each = {flavor: FlavorUsage(nominal=round(f.nominal, 3), used=round(f.used, 3),
                                        borrowed=round(f.borrowed, 3))
                    for flavor, f in st.flavors.items()}
            view["other"] = each.pop(REST)
            view["models"] = each
        out[name] = view
    return out

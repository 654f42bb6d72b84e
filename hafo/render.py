"""Tables for people, from the contract's JSON views."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned, space-separated table."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def ago(ts: float | None, now: float | None = None) -> str:
    """'3s ago' style age."""
    if ts is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - ts)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def render_status(view: dict[str, Any]) -> str:
    """``hafo status``."""
    nodes = ", ".join(f"{k} {v}" for k, v in view["nodes"].items() if v) or "none"
    wls = ", ".join(f"{k} {v}" for k, v in view["workloads"].items() if v) or "none"
    return (f"leader:      {view['leader'] or '(none)'}\n"
            f"controllers: {', '.join(view['controllers']) or '(none)'}\n"
            f"nodes:       {nodes}\n"
            f"workloads:   {wls}")


def render_nodes(nodes: list[dict[str, Any]]) -> str:
    """``hafo nodes``."""
    rows = []
    for n in nodes:
        gpus = n["gpus"]
        healthy = sum(1 for g in gpus if g["healthy"])
        used = sum(1 for g in gpus if g["allocated_to"])
        labels = ",".join(f"{k}={v}" for k, v in sorted(n["labels"].items()))
        reason = n.get("reason") or "; ".join(g["reason"] for g in gpus if g.get("reason"))
        if len(reason) > 70:
            reason = reason[:67] + "..."
        rows.append([n["name"], n["state"], n.get("address") or "-", f"{used}/{len(gpus)}",
                     f"{healthy}/{len(gpus)}", len(n["workloads"]), labels or "-",
                     reason or "-"])
    return table(["NAME", "STATE", "ADDRESS", "GPUS USED", "GPUS HEALTHY", "WORKLOADS",
                  "LABELS", "REASON"], rows)


def render_workloads(workloads: list[dict[str, Any]]) -> str:
    """``hafo workloads``."""
    rows = []
    for w in workloads:
        ck = w["checkpoint"]
        members = w.get("members") or []
        node = w["node"]
        gpus = len(w["gpus"])
        service = w.get("replicas")
        if service is not None:  # a service: n/N ready, then one row per replica
            rows.append([w["id"], w["state"], f"{service['ready']}/{service['desired']} ready",
                         "-", w["restarts"], "-", "-"])
            for r in service["items"]:
                flag = "ready" if r["ready"] else ("retiring" if r["retiring"] else "not ready")
                rows.append([f"  {r['id']}", r["state"], r["node"] or "-", "-", r["restarts"],
                             "-", flag + ("" if r["current"] else ", old spec")])
            continue
        if members:  # a gang: every member, rank:node(state)
            node = " ".join(f"{m['rank']}:{m['node']}({m['state']})" for m in members)
            gpus = sum(len(m["gpus"]) for m in members)
        elif w.get("nodes", 1) > 1:
            node = f"(gang of {w['nodes']})"
        rows.append([w["id"], w["state"], node, w["epoch"], w["restarts"], gpus,
                     f"step {ck['step']}" if ck else "-"])
    return table(["ID", "STATE", "NODE", "EPOCH", "RESTARTS", "GPUS", "CHECKPOINT"], rows)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def render_events(events: list[dict[str, Any]]) -> str:
    """``hafo events``."""
    rows = [[_clock(e["ts"]), e["kind"], e["workload"], e["node"], e["message"]]
            for e in events]
    return table(["TIME", "KIND", "WORKLOAD", "NODE", "MESSAGE"], rows)


def render_endpoints(data: dict[str, Any]) -> str:
    """``hafo endpoints``."""
    rows = [[e["replica"], e["node"] or "-", e["address"] or "-",
             " ".join(f"{k}={v}" for k, v in sorted(e["ports"].items())) or "-",
             "yes" if e["ready"] else "no", e["state"]] for e in data["endpoints"]]
    title = f"{data['name']} ({data['workload']}): {sum(e['ready'] for e in data['endpoints'])}" \
            f" of {len(data['endpoints'])} ready"
    return title + "\n" + table(["REPLICA", "NODE", "ADDRESS", "PORTS", "READY", "STATE"], rows)


def _spec_summary(spec: dict[str, Any]) -> str:
    parts = [f"{spec.get('gpus', 0)} GPU(s)"]
    if spec.get("nodes", 1) > 1:
        parts[0] += f" x {spec['nodes']} nodes"
    if spec.get("replicas") is not None:
        parts.append(f"{spec['replicas']} replicas")
    parts.append(f"priority {spec.get('priority', 0)}")
    restart = spec.get("restart") or {}
    if restart:
        parts.append(f"max {restart.get('max_restarts')} restarts in "
                     f"{restart.get('window'):g}s")
    return ", ".join(parts)


def _resumed(ck: dict[str, Any] | None) -> str:
    return f"step {ck['step']} (epoch {ck['epoch']})" if ck else "-"


def render_show(view: Mapping[str, Any]) -> str:
    """``hafo show WORKLOAD``: the spec, where it runs now, its epochs and recent events."""
    spec, now = view["spec"], view["now"]
    where = now["node"] or "no node"
    if len(now["nodes"]) > 1:
        where = " ".join(f"{rank}:{node}" for rank, node in enumerate(now["nodes"]))
    epoch = f" (epoch {now['epoch']})" if now["epoch"] is not None else ""
    checkpoint = now["checkpoint"]
    lines = [f"workload:   {view['name']} ({view['id']})"
             + (f", replica of {view['service']}" if view["service"] else ""),
             f"spec:       {_spec_summary(spec)}",
             f"command:    {' '.join(spec['command'])}",
             f"now:        {now['state']} on {where}{epoch}, {now['restarts']} restart(s)",
             f"reason:     {now['reason'] or '-'}",
             f"checkpoint: {_resumed(checkpoint) if checkpoint else 'none reported'}",
             "", f"history ({len(view['history'])} epoch(s), oldest first):"]
    rows = [[" ".join(e["nodes"]) or "-", e["epoch"], _clock(e["started_at"])
             if e["started_at"] is not None else "-",
             _clock(e["ended_at"]) if e["ended_at"] is not None else "-",
             e["how"] or ("running" if e["started_at"] is not None else "starting"),
             e["restarts"],
             _resumed(e["resumed_from"])] for e in view["history"]]
    lines.append(table(["NODE", "EPOCH", "STARTED", "ENDED", "HOW", "RESTARTS",
                        "RESUMED-FROM"], rows) if rows else "  none recorded yet")
    lines += ["", "recent events:"]
    events = [[_clock(e["ts"]), e["kind"], e["node"], e["epoch"], e["message"]]
              for e in view["events"]]
    lines.append(table(["TIME", "KIND", "NODE", "EPOCH", "MESSAGE"], events) if events
                 else "  none")
    return "\n".join(lines)

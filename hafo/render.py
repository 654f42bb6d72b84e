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


#: The fewest characters of REASON ``render_workloads`` shows, however narrow the terminal.
MIN_REASON = 40
#: The most characters of REASON ``render_workloads`` shows, however wide the terminal (and
#: when stdout is no terminal): the reason in full is in ``--json`` and the detail view. A
#: failure with its last line of stderr fits ("failed: exited with code 1 on node-1 (no
#: restarts): ModuleNotFoundError: No module named 'torch'", 97): the README promises it.
MAX_REASON = 120


def shorten(text: str, width: int | None) -> str:
    """``text`` cut to ``width`` characters with "..." (None: as it is)."""
    if width is None or len(text) <= width:
        return text
    return text[:max(0, width - 3)].rstrip() + "..."


def brief(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, for a table cell: whole if it fits, else its
    first clause (up to the first "; ") followed by "; ..." if that fits, else cut with
    "..."."""
    if len(text) <= width:
        return text
    clause, sep, _rest = text.partition("; ")
    if sep and len(clause) + 5 <= width:
        return f"{clause}; ..."
    return shorten(text, width)


def _gpus(allocated: int, requested: int | None) -> str:
    return f"{allocated}/{requested}" if requested is not None else str(allocated)


def render_workloads(workloads: Sequence[Mapping[str, Any]], width: int | None = None) -> str:
    """``hafo workloads``: one row per workload (a service's replicas below it); GPUS is
    allocated/requested; REASON is cut (``brief``) to at most ``MAX_REASON`` characters, and
    to fit ``width`` columns (a terminal's; None: no terminal) but never below
    ``MIN_REASON``: the reason in full is in ``--json`` and the detail view."""
    rows = []
    reasons = []
    for w in workloads:
        ck = w["checkpoint"]
        members = w.get("members") or []
        node = w["node"]
        gpus = len(w["gpus"])
        service = w.get("replicas")
        if service is not None:  # a service: n/N ready, then one row per replica
            rows.append([w["id"], w["state"], f"{service['ready']}/{service['desired']} ready",
                         "-", w["restarts"], "-", "-"])
            reasons.append(w.get("reason") or "-")
            for r in service["items"]:
                flag = "ready" if r["ready"] else ("retiring" if r["retiring"] else "not ready")
                rows.append([f"  {r['id']}", r["state"], r["node"] or "-", "-", r["restarts"],
                             "-", "-"])
                reasons.append(flag + ("" if r["current"] else ", old spec")
                               + (f": {r['reason']}" if r.get("reason") else ""))
            continue
        if members:  # a gang: every member, rank:node(state)
            node = " ".join(f"{m['rank']}:{m['node']}({m['state']})" for m in members)
            gpus = sum(len(m["gpus"]) for m in members)
        elif w.get("nodes", 1) > 1:
            node = f"(gang of {w['nodes']})"
        rows.append([w["id"], w["state"], node, w["epoch"], w["restarts"],
                     _gpus(gpus, w.get("gpus_requested")), f"step {ck['step']}" if ck else "-"])
        reasons.append(w.get("reason") or "-")
    headers = ["ID", "STATE", "NODE", "EPOCH", "RESTARTS", "GPUS", "CHECKPOINT"]
    room = MAX_REASON
    if width is not None:  # REASON starts after the widest line of the other columns
        start = max(len(line) for line in table(headers, rows).splitlines()) + 2
        room = max(MIN_REASON, min(MAX_REASON, width - start))
    return table([*headers, "REASON"],
                 [[*r, brief(why, room)] for r, why in zip(rows, reasons, strict=True)])


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def _fields(pairs: Sequence[tuple[str, Any]]) -> list[str]:
    """``key:  value`` lines, the values aligned (a key too long for the column keeps one
    space before its value)."""
    return [f"{key + ':':<11} {'-' if value is None or value == '' else value}"
            for key, value in pairs]


def _when(ts: float | None, now: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f" ({ago(ts, now)})"


#: What the views say of a workload no checkpoint of which is known (not reported by any
#: agent, nor remembered by its assignment).
NO_CHECKPOINT = "none yet"


def _checkpoint(ck: Mapping[str, Any] | None) -> str:
    if not ck:
        return NO_CHECKPOINT
    return f"step {ck['step']} (epoch {ck['epoch']})" + (f" at {ck['path']}" if ck.get("path")
                                                          else "")


def _preflight(report: Mapping[str, Any] | None) -> str:
    """``passed in 2.1s, probe 0.031s, 32 MiB all-reduce at 1.20 GB/s`` or ``failed: ...``
    (``-``: none ran, or not yet)."""
    if not report:
        return "-"
    if not report["passed"]:
        return f"failed: {report['why']}"
    text = f"passed in {float(report['seconds']):.1f}s"
    if report.get("compute") is not None:
        text += f", probe {float(report['compute']):.3f}s"
    if report.get("large_bandwidth") is not None:
        text += f", all-reduce {float(report['large_bandwidth']) / 1e9:.2f} GB/s"
    return text


def _restored(restore: Mapping[str, Any] | None) -> str:
    """``step 41 from peer RAM, 0.21s`` (``-``: not said)."""
    if not restore:
        return "-"
    tier, seconds = restore["tier"], float(restore["seconds"])
    if tier == "none":
        return f"nothing to restore, {seconds:.2f}s"
    where = {"own": "own RAM", "peer": "peer RAM", "disk": "disk"}.get(tier, tier)
    return f"step {restore['step']} from {where}, {seconds:.2f}s"


def _restarts(total: int, window: Mapping[str, Any] | None) -> str:
    """``8 in all; 1 of the 3 allowed in place within 600s, then it moves to another node``:
    the count ever beside the restart policy's count now (``restart_window``), so that the
    two never read as one number above its maximum."""
    if window is None:
        return str(total)
    most, within = window["max_restarts"], f"{window['window']:g}s"
    if most == 0:
        return f"{total} in all; none allowed in place: a failure moves it to another node"
    return (f"{total} in all; {window['restarts']} of the {most} allowed in place within "
            f"{within}, then it moves to another node")


def gpu_label(index: int | None, uuid: str, node: str | None = None) -> str:
    """``GPU 0 (GPU-4f3a...)``, ``GPU 0 of node-2 (...)``: a GPU as the README and ``hafo dev
    fault --gpu I`` name it (its index on its node), with its UUID."""
    if index is None:
        return uuid
    return f"GPU {index}" + (f" of {node}" if node else "") + f" ({uuid})"


def _gpu_labels(uuids: Sequence[str], indexes: Sequence[int] | None,
                node: str | None = None) -> list[str]:
    """Each GPU's ``gpu_label``; UUIDs alone from a view without indexes (an older API)."""
    if not indexes or len(indexes) != len(uuids):
        return list(uuids)
    return [gpu_label(i, u, node) for i, u in zip(indexes, uuids, strict=True)]


def render_workload(view: Mapping[str, Any], now: float | None = None) -> str:
    """``hafo workloads WORKLOAD``: one workload's view as ``key: value`` lines (the reason
    in full), a gang's members, a service's replicas, the last lines of stderr of its newest
    ended instance, and where to look next."""
    members = view.get("members") or []
    gpus = sum(len(m["gpus"]) for m in members) if members else len(view["gpus"])
    labels = ([label for m in members
               for label in _gpu_labels(m["gpus"], m.get("gpu_indexes"), m["node"])]
              if members else _gpu_labels(view["gpus"], view.get("gpu_indexes")))
    requested = view.get("gpus_requested")
    ports = " ".join(f"{k}={v}" for k, v in sorted((view.get("ports") or {}).items()))
    node = view["node"]
    if view.get("nodes", 1) > 1:
        node = f"gang of {view['nodes']}" + (f", rank 0 on {node}" if node else "")
    lines = _fields([
        ("workload", f"{view['name']} ({view['id']})"),
        ("state", view["state"]),
        ("node", node),
        ("epoch", view["epoch"]),
        ("gpus", (f"{gpus} of {requested} allocated" if requested is not None
                  else f"{gpus} allocated") + (f": {', '.join(labels)}" if labels else "")),
        ("restarts", _restarts(view["restarts"], view.get("restart_window"))),
        ("priority", view.get("priority")),
        ("submitted", _when(view.get("submitted_at"), now)),
        ("reason", view["reason"]),
        ("ports", ports),
        ("checkpoint", _checkpoint(view["checkpoint"])),
    ])
    if members:
        restored = any(m.get("restored") for m in members)
        preflight = any(m.get("preflight") for m in members)
        lines += ["", "members:", table(
            ["RANK", "NODE", "STATE", "GPUS", *(["PRE-FLIGHT"] if preflight else []),
             *(["RESTORED"] if restored else [])], [
                [m["rank"], m["node"], m["state"],
                 ", ".join(_gpu_labels(m["gpus"], m.get("gpu_indexes"))) or "-",
                 *([_preflight(m.get("preflight"))] if preflight else []),
                 *([_restored(m.get("restored"))] if restored else [])]
                for m in members])]
    service = view.get("replicas")
    if service is not None:
        lines += ["", f"replicas: {service['ready']} of {service['desired']} ready, "
                      f"{service['current']} on the current spec",
                  table(["ID", "STATE", "NODE", "READY", "RESTARTS", "REASON"], [
                      [r["id"], r["state"], r["node"], "yes" if r["ready"] else "no",
                       r["restarts"], r["reason"] or "-"] for r in service["items"]])
                  if service["items"] else "  none"]
    tail = (view.get("stderr_tail") or "").rstrip("\n")
    if tail:
        lines += ["", "stderr of its newest ended instance (last lines):"]
        lines += [f"  | {line}" for line in tail.splitlines()]
    wid = view["id"]
    lines += ["", f"more:       hafo show {wid}  (every epoch and its events)",
              f"            hafo logs {wid}  (its output)"]
    return "\n".join(lines)


def _health(gpu: Mapping[str, Any]) -> str:
    if not gpu["healthy"]:
        return "unhealthy"
    return "degraded" if gpu.get("degraded") else "healthy"


def _gpu_index(gpu: Mapping[str, Any]) -> str:
    if gpu.get("profile"):
        return f"{gpu['index']} ({gpu['profile']} of GPU {gpu.get('parent')})"
    return str(gpu["index"])


def render_node(node: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]] = ()) -> str:
    """``hafo nodes NODE``: one node's view as ``key: value`` lines, every GPU (health, why,
    utilization, which workload it is allocated to) and its workloads (``workloads``: their
    views, for their names and states)."""
    gpus = node["gpus"]
    labels = ", ".join(f"{k}={v}" for k, v in sorted(node["labels"].items()))
    used = sum(1 for g in gpus if g["allocated_to"])
    healthy = sum(1 for g in gpus if g["healthy"])
    lines = _fields([
        ("node", f"{node['name']} ({node['state']})"),
        ("address", node.get("address")),
        ("api", node.get("api")),
        ("labels", labels),
        ("reason", node.get("reason")),
        ("containment", node.get("containment")),
        ("gpus", f"{used} of {len(gpus)} allocated, {healthy} of {len(gpus)} healthy"),
    ])
    if gpus:
        lines.append(table(
            ["  INDEX", "UUID", "MODEL", "MEMORY", "HEALTH", "UTIL", "ALLOCATED-TO", "REASON"],
            [[f"  {_gpu_index(g)}", g["uuid"], g["model"], f"{g['memory_mib']} MiB",
              _health(g), f"{g['utilization']:.0f}%" if g.get("utilization") is not None
              else "-", g["allocated_to"], g.get("reason") or "-"] for g in gpus]))
    by_id = {w["id"]: w for w in workloads}
    lines += ["", f"workloads:  {len(node['workloads'])}"]
    if node["workloads"]:
        rows = []
        for wid in node["workloads"]:
            view = by_id.get(wid)
            here = sum(1 for g in gpus if g["allocated_to"] == wid)
            rows.append([f"  {wid}", view["name"] if view else "-",
                         view["state"] if view else "-", here])
        lines.append(table(["  ID", "NAME", "STATE", "GPUS HERE"], rows))
    lines += ["", "more:       hafo workloads WORKLOAD  (one of its workloads), hafo events  "
                  "(what happened)"]
    return "\n".join(lines)


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
        parts.append(f"up to {restart.get('max_restarts')} restarts in place within "
                     f"{restart.get('window'):g}s, then another node")
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
    window = now.get("restart_window")
    restarts = f"{now['restarts']} restart(s)" + (
        f" in all, {window['restarts']} of {window['max_restarts']} in place within "
        f"{window['window']:g}s" if window else "")
    lines = [f"workload:   {view['name']} ({view['id']})"
             + (f", replica of {view['service']}" if view["service"] else ""),
             f"spec:       {_spec_summary(spec)}",
             f"command:    {' '.join(spec['command'])}",
             f"now:        {now['state']} on {where}{epoch}, {restarts}",
             f"reason:     {now['reason'] or '-'}",
             f"checkpoint: {_resumed(checkpoint) if checkpoint else NO_CHECKPOINT}",
             *[f"restored:   rank {r['rank']} on {r['node']}: {_restored(r)}"
               for r in now.get("restored") or []],
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

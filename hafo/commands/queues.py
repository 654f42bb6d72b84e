"""``hafo queues [NAME]``: the declared queues (quota, cohort, limits, weight and how many
workloads name each), or one queue with the workloads in it; exit 4 for a queue that is not
declared.

``queue_rows`` builds the table's rows from a snapshot: the place for the usage columns
(used, borrowed, pending, fair share) once ``hafo.decisions.queue_standings`` computes
them.
"""

from __future__ import annotations

import argparse
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError
from hafo.commands.reading import add_view_args, run_view

#: The columns of ``hafo queues``.
HEADERS = ("NAME", "GPUS", "USED", "BORROWED", "LENT", "PENDING", "SHARE", "COHORT",
           "BORROWING LIMIT", "LENDING LIMIT", "WEIGHT", "WORKLOADS")


def _gpus(value: float) -> str:
    """A GPU count: "4", or "2.43" with MIG fractions."""
    return str(round(value)) if abs(value - round(value)) < 1e-6 else f"{value:.2f}"


def register(sub: Any) -> None:
    """Add the ``queues`` subparser."""
    p = sub.add_parser("queues", help="queues and their quotas")
    add_view_args(p)
    p.add_argument("queue", nargs="?", metavar="NAME",
                   help="show this queue and the workloads in it")


def queue_rows(snapshot: Any) -> list[list[Any]]:
    """One row per declared queue, by name, in ``HEADERS``' order (None: shown as '-')."""
    from hafo.decisions.queue_standings import usage_views
    from hafo.model.queue_view import all_queues

    rows = []
    for q in all_queues(snapshot, usage_views(snapshot)):
        use = q["usage"]
        rows.append([q["name"], "no quota" if q["gpus"] is None else q["gpus"],
                     _gpus(use["used"]), _gpus(use["borrowed"]), _gpus(use["lent"]),
                     _gpus(use["pending"]), f"{use['share']:.3f}", q["cohort"],
                     q["borrowing_limit"], q["lending_limit"], f"{q['weight']:g}",
                     len(q["workloads"])])
    return rows


def render_queue(snapshot: Any, name: str) -> str:
    """``hafo queues NAME``: the declaration, then the workloads naming the queue."""
    from hafo.decisions.pending_reasons import with_live_reasons
    from hafo.decisions.queue_standings import usage_views
    from hafo.model.queue_view import queue_view
    from hafo.model.views import workload_view
    from hafo.render import table

    q = queue_view(snapshot, name, usage_views(snapshot))
    use = q["usage"]
    lines = [f"queue:           {q['name']}",
             f"gpus:            {'no quota' if q['gpus'] is None else q['gpus']}",
             f"used:            {_gpus(use['used'])} (borrowed {_gpus(use['borrowed'])}, "
             f"lent {_gpus(use['lent'])}, pending {_gpus(use['pending'])}, share "
             f"{use['share']:.3f})",
             f"cohort:          {q['cohort'] or '-'}",
             f"borrowing limit: {'-' if q['borrowing_limit'] is None else q['borrowing_limit']}",
             f"lending limit:   {'-' if q['lending_limit'] is None else q['lending_limit']}",
             f"weight:          {q['weight']:g}"]
    if "models" in use and "other" in use:
        for glob, each in [*use["models"].items(), ("other", use["other"])]:
            lines.append(f"  {glob}: {_gpus(each['used'])} of {_gpus(each['nominal'])} used "
                         f"(borrowed {_gpus(each['borrowed'])})")
    if not q["workloads"]:
        return "\n".join([*lines, "workloads:       none"])
    views = with_live_reasons([workload_view(snapshot, wid) for wid in q["workloads"]],
                              snapshot)
    # Running first, then the waiting ones in their order in the queue (their reason says
    # their place), then the rest.
    rank = {"running": 0, "starting": 0, "updating": 0, "degraded": 0, "stopping": 1,
            "pending": 2}
    views.sort(key=lambda w: (rank.get(w["state"], 3), _place(w["reason"]), w["id"]))
    rows = [[w["id"], w["name"], w["state"], w["gpus_requested"],
             w["reason"] if w["state"] == "pending" else ""] for w in views]
    return "\n".join([*lines, f"workloads:       {len(rows)}", "",
                      table(["ID", "NAME", "STATE", "GPUS", "WHY"], rows)])


def _place(reason: str) -> int:
    """A pending workload's place in its queue, read from its reason ("2nd of 5 waiting in
    queue q"); a large number when it says none."""
    import re

    found = re.search(r"(\d+)(?:st|nd|rd|th) of \d+ waiting in queue", reason or "")
    return int(found.group(1)) if found else 1 << 30


def run(args: argparse.Namespace) -> int:
    """Run ``hafo queues``."""
    from hafo.model.queue_view import all_queues, queue_view
    from hafo.render import table

    async def view(store: Any, keys: Any, snapshot: Any, width: int | None) -> tuple[Any, str]:
        if args.queue is not None:
            if args.queue not in snapshot.queues:
                known = ", ".join(sorted(snapshot.queues)) or "none is declared"
                raise CliError(f"no queue {args.queue!r} (queues: {known})", EXIT_NOT_FOUND)
            return queue_view(snapshot, args.queue), render_queue(snapshot, args.queue)
        data = all_queues(snapshot)
        rows = queue_rows(snapshot)
        return data, table(HEADERS, rows) if rows else "no queues (every workload is admitted)"

    return run_view(args, view)

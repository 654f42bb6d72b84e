"""``hafo queues [NAME]``: the declared queues (quota, cohort, limits, weight and how many
workloads name each), or one queue with the workloads in it; exit 4 for a queue that is not
declared.

``queue_rows`` builds the table's rows from a snapshot: the place for the usage columns
(used, borrowed, pending, fair share) once ``hafo.decisions.quota`` computes them.
"""

from __future__ import annotations

import argparse
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError
from hafo.commands.reading import add_view_args, run_view

#: The columns of ``hafo queues``.
HEADERS = ("NAME", "GPUS", "COHORT", "BORROWING LIMIT", "LENDING LIMIT", "WEIGHT", "WORKLOADS")


def register(sub: Any) -> None:
    """Add the ``queues`` subparser."""
    p = sub.add_parser("queues", help="queues and their quotas")
    add_view_args(p)
    p.add_argument("queue", nargs="?", metavar="NAME",
                   help="show this queue and the workloads in it")


def queue_rows(snapshot: Any) -> list[list[Any]]:
    """One row per declared queue, by name, in ``HEADERS``' order (None: shown as '-')."""
    from hafo.model.queue_view import all_queues

    return [[q["name"], q["gpus"], q["cohort"], q["borrowing_limit"], q["lending_limit"],
             f"{q['weight']:g}", len(q["workloads"])] for q in all_queues(snapshot)]


def render_queue(snapshot: Any, name: str) -> str:
    """``hafo queues NAME``: the declaration, then the workloads naming the queue."""
    from hafo.model.queue_view import queue_view
    from hafo.model.views import workload_view
    from hafo.render import table

    q = queue_view(snapshot, name)
    lines = [f"queue:           {q['name']}",
             f"gpus:            {q['gpus']}",
             f"cohort:          {q['cohort'] or '-'}",
             f"borrowing limit: {'-' if q['borrowing_limit'] is None else q['borrowing_limit']}",
             f"lending limit:   {'-' if q['lending_limit'] is None else q['lending_limit']}",
             f"weight:          {q['weight']:g}"]
    if not q["workloads"]:
        return "\n".join([*lines, "workloads:       none"])
    views = [workload_view(snapshot, wid) for wid in q["workloads"]]
    rows = [[w["id"], w["name"], w["state"], w["gpus_requested"]] for w in views]
    return "\n".join([*lines, f"workloads:       {len(rows)}", "",
                      table(["ID", "NAME", "STATE", "GPUS"], rows)])


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

"""``hafo demand [--json]``: the pending work that more nodes would let run, as shapes
(``hafo.decisions.demand``), read from etcd. The removable nodes are the leader's
observation (idle since when it saw them): ``GET /v1/demand`` on the controller's API has
them; this command lists none."""

from __future__ import annotations

import argparse
import time
from typing import Any

from hafo.commands.reading import add_view_args, run_view


def register(sub: Any) -> None:
    """Add the ``demand`` subparser."""
    p = sub.add_parser("demand", help="pending work as shapes (what an autoscaler adds)")
    add_view_args(p)


def render_demand(data: dict[str, Any]) -> str:
    """The shapes as lines: ``2 x gang 4 nodes x 8 GPUs (H100*) in queue research``."""
    lines = []
    for shape in data["pending"]:
        kind = shape["gpu_model"] or "any model"
        if shape["gpu_profile"]:
            kind += f", MIG {shape['gpu_profile']}"
        what = (f"gang {shape['nodes']} nodes x {shape['gpus_per_node']} GPUs"
                if shape["nodes"] > 1 else f"{shape['gpus_per_node']} GPU(s)")
        lines.append(f"{shape['count']} x {what} ({kind}) in queue {shape['queue']}")
    return "\n".join(lines) or "no pending work that more nodes would run"


def run(args: argparse.Namespace) -> int:
    """Run ``hafo demand``."""
    from hafo.decisions.demand import demand

    async def view(store: Any, keys: Any, snapshot: Any, width: int | None) -> tuple[Any, str]:
        now = time.time()
        data = demand(snapshot, {}, now, 0.0).to_dict(now)
        return data, render_demand(data)

    return run_view(args, view)

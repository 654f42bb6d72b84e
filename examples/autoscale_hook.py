#!/usr/bin/env python3
"""An example autoscale hook for hafo (docs/autoscaling.md): it reads the demand's JSON on
stdin (``autoscale.command: [python3, examples/autoscale_hook.py]``) and prints what it
would do on a cloud, without doing it (no network, no cloud CLI is called).

- each pending shape -> grow the instance group of its GPU kind by enough nodes for it
  (``nodes`` x ``count`` for gangs and singles alike, one node per workload here: a real
  script would pack small shapes onto one machine of ``GPUS_PER_MACHINE``);
- each removable node -> drain it (``hafo drain --wait``), terminate the machine (its agent
  goes with it), then forget it in hafo (``hafo node remove``).

Exit 0 when the demand was read (hafo counts the call ``ok``), 2 on input it cannot read.
Pass ``--provider aws`` for the AWS commands (default: gcloud).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

#: GPU model glob of a shape -> (instance group, GPUs per machine). ``None``: any model.
GROUPS: dict[str | None, tuple[str, int]] = {
    None: ("gpu-h100-pool", 8),
    "*H100*": ("gpu-h100-pool", 8),
    "*A100*": ("gpu-a100-pool", 8),
}


def machines_for(shape: dict[str, Any]) -> int:
    """Machines a shape needs: a gang one per member, else enough for its GPUs."""
    _group, per_machine = GROUPS.get(shape["gpu_model"], GROUPS[None])
    if shape["nodes"] > 1:
        return int(shape["nodes"]) * int(shape["count"])
    return math.ceil(int(shape["gpus_per_node"]) * int(shape["count"]) / per_machine) or 1


def plan(demand: dict[str, Any], provider: str) -> list[str]:
    """The commands this hook would run, one per line."""
    grow: dict[str, int] = {}
    for shape in demand.get("pending", []):
        group, _ = GROUPS.get(shape["gpu_model"], GROUPS[None])
        grow[group] = grow.get(group, 0) + machines_for(shape)
    lines = []
    for group, extra in sorted(grow.items()):
        if provider == "aws":
            lines.append(f"aws autoscaling set-desired-capacity --auto-scaling-group-name "
                         f"{group} --desired-capacity $(( CURRENT + {extra} ))")
        else:
            lines.append(f"gcloud compute instance-groups managed resize {group} "
                         f"--size $(( CURRENT + {extra} ))")
    for entry in demand.get("removable", []):
        node = entry["node"]
        lines.append(f"hafo drain {node} --wait --timeout 600")
        if provider == "aws":
            lines.append(f"aws autoscaling terminate-instance-in-auto-scaling-group "
                         f"--instance-id $(instance-of {node}) "
                         "--should-decrement-desired-capacity")
        else:
            lines.append(f"gcloud compute instance-groups managed delete-instances GROUP "
                         f"--instances {node}")
        lines.append(f"hafo node remove {node}  # once its agent is gone with the machine")
    return lines


def main() -> int:
    """Read the demand on stdin, print the plan."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=("gcloud", "aws"), default="gcloud")
    args = parser.parse_args()
    try:
        demand = json.load(sys.stdin)
    except ValueError as exc:
        print(f"autoscale_hook: stdin is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(demand, dict):
        print("autoscale_hook: stdin is not a JSON object", file=sys.stderr)
        return 2
    for line in plan(demand, args.provider) or ["nothing to do"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whether a parked warm gang member's process may become an instance (``warm: true``;
docs/reference/gangs.md, "Warm survivors"). Pure: both sides read the launch files, these
decide.

The agent hands a parked process the next instance on its node only when that instance
launches alike (``relaunch_refusal``); the guard becomes the new instance's only when its
launch is this process's next one (``adoption_refusal``). A refusal is a reason in words;
"" means yes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the guard imports this module: not the spec's schema (0.25 s) at its start
    from hafo.model.spec import WorkloadSpec


def relaunch_refusal(parked_launch: Mapping[str, Any], spec: WorkloadSpec, cwd: str,
                     gpu_ids: Sequence[str]) -> str:
    """Why the process launched with ``parked_launch`` cannot be the next instance of
    ``spec`` (run in ``cwd`` on ``gpu_ids``): it must have been launched warm, with the same
    command, working directory and GPUs, and the spec's ``env`` unchanged."""
    raw_env = parked_launch.get("env")
    env: Mapping[str, Any] = raw_env if isinstance(raw_env, dict) else {}
    if not spec.warm or not parked_launch.get("warm_dir"):
        return "not a warm member"
    if parked_launch.get("argv") != list(spec.command) or parked_launch.get("cwd") != cwd:
        return "its command changed"
    if env.get("CUDA_VISIBLE_DEVICES") != ",".join(gpu_ids):
        return "its GPUs changed"
    if any(env.get(k) != v for k, v in spec.env.items()):
        return "its environment changed"
    return ""


def adoption_refusal(current: Mapping[str, Any], target: Mapping[str, Any] | None) -> str:
    """Why the guard of the instance launched with ``current`` must not become the one
    launched with ``target``: the same workload, node and warm directory, a later epoch."""
    if target is None:
        return "no launch file in the target"
    for name in ("workload", "node", "warm_dir"):
        if target.get(name) != current.get(name):
            return f"another {name}"
    epoch, mine = target.get("epoch"), current.get("epoch")
    if not isinstance(epoch, int) or not isinstance(mine, int) or epoch <= mine:
        return "not a later epoch"
    return ""

"""Transparent checkpoints (CRIU + NVIDIA cuda-checkpoint) for workloads that cannot use the
SDK: whether this node can take one, and if not, the one clear reason why.

This version refuses every transparent dump, with the reason: where both tools are missing or
CRIU's kernel check fails (as in VMs without the needed vDSO support) it says so; where both
work, the dump/restore driver is not built yet. A refused dump loses nothing that a normal
stop would not: the workload is stopped as usual and restarts from its own checkpoints (or
from the start).
"""

from __future__ import annotations

import shutil
import subprocess


def unavailable_reason(timeout: float = 10.0) -> str:
    """Why a transparent checkpoint cannot be taken on this node (never empty)."""
    missing = [tool for tool in ("criu", "cuda-checkpoint") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on this node"
    try:
        check = subprocess.run(["criu", "check"], capture_output=True, text=True,
                               timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"criu check could not run: {exc}"
    if check.returncode != 0:
        lines = (check.stderr or check.stdout).strip().splitlines()
        return f"criu check failed: {lines[-1] if lines else f'exit {check.returncode}'}"
    return "criu and cuda-checkpoint work here, but this hafo version has no dump driver yet"

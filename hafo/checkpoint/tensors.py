"""The optional array libraries as a checkpoint finds them (NumPy if installed, torch only if
the workload imported it), and the rule on a state dict's keys: what the codec
(``hafo.checkpoint.codec``), the staging copy (``hafo.checkpoint.staging``) and the restore
(``hafo.checkpoint.restore``) all need, so that none of them imports another for it.
"""

from __future__ import annotations

import sys
from typing import Any


def optional_numpy() -> Any:
    """The ``numpy`` module, or None where it is not installed."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy optional
        return None
    return numpy


def imported_torch() -> Any:
    """The ``torch`` module only if the workload already imported it (else None): a
    checkpoint never imports torch for a state that holds no tensor."""
    return sys.modules.get("torch")


def check_keys(state: dict[Any, Any]) -> None:
    """TypeError unless the dict's keys are all strings or all integers."""
    keys = list(state)
    if all(isinstance(k, str) for k in keys) or all(
            isinstance(k, int) and not isinstance(k, bool) for k in keys):
        return
    bad = next(k for k in keys if not isinstance(k, str))
    raise TypeError(f"checkpoint state keys must be all strings or all integers, got {bad!r}")

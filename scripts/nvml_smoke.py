#!/usr/bin/env python3
"""Smoke test of hafo's NVML backend on a machine WITH an NVIDIA GPU (not run in CI).

Prints JSON lines: the backend's description, the inventory, three ``findings()`` polls one
second apart with how long each took, and one raw NVML Xid event wait with a 2 s timeout (a
healthy GPU times out). Exits 0; exits 2 with a clear message when NVML is unavailable (no
nvidia-ml-py, no driver, no GPU). Usage: ``python scripts/nvml_smoke.py``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from hafo.gpu.nvml import NvmlGpus, NvmlUnavailable


def emit(what: str, **fields: Any) -> None:
    """One JSON line on stdout."""
    print(json.dumps({"what": what, **fields}, default=str), flush=True)


def raw_event_wait(timeout_ms: int = 2000) -> dict[str, Any]:
    """Register Xid events on GPU 0 in a fresh event set and wait once: what NVML said."""
    import pynvml

    started = time.monotonic()
    event_set = None
    try:
        event_set = pynvml.nvmlEventSetCreate()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        data = pynvml.nvmlEventSetWait(event_set, timeout_ms)
        result: dict[str, Any] = {"result": "event", "type": int(data.eventType),
                                  "data": int(data.eventData)}
    except pynvml.NVMLError_Timeout:
        result = {"result": "timeout"}
    except pynvml.NVMLError as exc:
        result = {"result": "error", "error": str(exc), "class": type(exc).__name__}
    finally:
        if event_set is not None:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError as exc:
                emit("event_set_free_failed", error=str(exc))
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result


def main() -> int:
    """Run the smoke test; the process exit status."""
    try:
        gpus = NvmlGpus()
    except NvmlUnavailable as exc:
        print(f"NVML is unavailable on this machine: {exc}", file=sys.stderr)
        return 2
    try:
        emit("description", description=gpus.description,
             kernel_log=gpus.kernel_log.available, kernel_log_reason=gpus.kernel_log.reason)
        started = time.monotonic()
        inventory = gpus.inventory()
        emit("inventory", seconds=round(time.monotonic() - started, 4),
             gpus=[{"index": g.index, "uuid": g.uuid, "model": g.model,
                    "memory_mib": g.memory_mib} for g in inventory])
        for poll in range(3):
            if poll:
                time.sleep(1)
            started = time.monotonic()
            found = gpus.findings()
            emit("findings", poll=poll + 1, seconds=round(time.monotonic() - started, 4),
                 findings=[f.to_dict() for f in found])
        emit("event_wait", **raw_event_wait(2000))
    finally:
        started = time.monotonic()
        gpus.close()
        emit("closed", seconds=round(time.monotonic() - started, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

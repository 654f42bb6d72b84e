"""Turn a state dict (nested dicts/lists of JSON values, bytes, NumPy arrays, torch tensors)
into a JSON tree plus raw blobs, and back. NumPy and torch are optional."""

from __future__ import annotations

import io
from typing import Any


def _np() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy optional
        return None
    return numpy


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")  # only if the workload already imported it


def flatten(state: Any, blobs: list[bytes]) -> Any:
    """Encode ``state`` as a JSON tree; non-JSON leaves go to ``blobs`` (host copies)."""
    if isinstance(state, dict):
        if all(isinstance(k, str) for k in state):
            return {"d": {k: flatten(v, blobs) for k, v in state.items()}}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in state):
            # e.g. torch optimizers' state_dict()["state"], keyed by parameter index
            return {"di": [[k, flatten(v, blobs)] for k, v in state.items()]}
        bad = next(k for k in state if not isinstance(k, str))
        raise TypeError(f"checkpoint state keys must be all strings or all integers, "
                        f"got {bad!r}")
    if isinstance(state, list | tuple):
        return {"l": [flatten(v, blobs) for v in state], "t": isinstance(state, tuple)}
    if state is None or isinstance(state, bool | int | float | str):
        return {"v": state}
    if isinstance(state, bytes | bytearray | memoryview):
        blobs.append(bytes(state))
        return {"b": len(blobs) - 1}
    torch = _torch()
    if torch is not None and isinstance(state, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(state.detach().to("cpu"), buffer)
        blobs.append(buffer.getvalue())
        return {"torch": len(blobs) - 1, "device": str(state.device)}
    numpy = _np()
    if numpy is not None and isinstance(state, numpy.ndarray):
        array = numpy.ascontiguousarray(state)
        blobs.append(array.tobytes())
        return {"np": len(blobs) - 1, "dtype": array.dtype.str, "shape": list(array.shape)}
    if numpy is not None and isinstance(state, numpy.generic):
        return {"v": state.item()}
    raise TypeError(f"cannot checkpoint a value of type {type(state).__name__}")


def unflatten(tree: Any, blobs: list[bytes]) -> Any:
    """Inverse of ``flatten`` (tensors come back on the CPU)."""
    if "d" in tree:
        return {k: unflatten(v, blobs) for k, v in tree["d"].items()}
    if "di" in tree:
        return {int(k): unflatten(v, blobs) for k, v in tree["di"]}
    if "l" in tree:
        items = [unflatten(v, blobs) for v in tree["l"]]
        return tuple(items) if tree.get("t") else items
    if "v" in tree:
        return tree["v"]
    if "b" in tree:
        return blobs[tree["b"]]
    if "np" in tree:
        numpy = _np()
        if numpy is None:  # pragma: no cover
            raise RuntimeError("numpy is needed to restore this checkpoint")
        data = blobs[tree["np"]]
        return numpy.frombuffer(data, dtype=numpy.dtype(tree["dtype"])).reshape(
            tree["shape"]).copy()
    if "torch" in tree:
        import torch

        return torch.load(io.BytesIO(blobs[tree["torch"]]), map_location="cpu",
                          weights_only=True)
    raise ValueError(f"unknown checkpoint tree node {sorted(tree)}")

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


def stage(state: Any) -> Any:
    """A private host copy of ``state``, taken now (the training loop may then go on changing
    its tensors): CUDA tensors are copied into pinned host memory, CPU tensors and arrays are
    cloned, the rest is shared or immutable. Refuses what cannot be checkpointed, at once."""
    if isinstance(state, dict):
        keys = list(state)
        if not (all(isinstance(k, str) for k in keys) or all(
                isinstance(k, int) and not isinstance(k, bool) for k in keys)):
            bad = next(k for k in keys if not isinstance(k, str))
            raise TypeError(f"checkpoint state keys must be all strings or all integers, "
                            f"got {bad!r}")
        return {k: stage(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        staged = [stage(v) for v in state]
        return tuple(staged) if isinstance(state, tuple) else staged
    if state is None or isinstance(state, bool | int | float | str | bytes):
        return state
    if isinstance(state, bytearray | memoryview):
        return bytes(state)
    torch = _torch()
    if torch is not None and isinstance(state, torch.Tensor):
        tensor = state.detach()
        if tensor.is_cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor)
            return host
        return tensor.clone()
    numpy = _np()
    if numpy is not None and isinstance(state, numpy.ndarray):
        return state.copy()
    if numpy is not None and isinstance(state, numpy.generic):
        return state.item()
    raise TypeError(f"cannot checkpoint a value of type {type(state).__name__}")


Blob = bytes | memoryview


def flatten(state: Any, blobs: list[Blob]) -> Any:
    """Encode ``state`` as a JSON tree; bytes, arrays and tensors go to ``blobs`` as raw
    buffers (zero-copy views of contiguous host memory where possible)."""
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
        tensor = state.detach().to("cpu").contiguous()
        try:  # raw bytes of the tensor (most dtypes): no serialization, no copy
            array = tensor.numpy()
        except (TypeError, RuntimeError):  # e.g. bfloat16, which NumPy lacks
            buffer = io.BytesIO()
            torch.save(tensor, buffer)
            blobs.append(buffer.getvalue())
            return {"torch": len(blobs) - 1, "device": str(state.device)}
        blobs.append(memoryview(array.reshape(-1)).cast("B"))
        return {"tensor": len(blobs) - 1, "dtype": array.dtype.str,
                "shape": list(array.shape), "device": str(state.device)}
    numpy = _np()
    if numpy is not None and isinstance(state, numpy.ndarray):
        array = numpy.ascontiguousarray(state)
        blobs.append(memoryview(array.reshape(-1)).cast("B") if array.size else b"")
        return {"np": len(blobs) - 1, "dtype": array.dtype.str, "shape": list(array.shape)}
    if numpy is not None and isinstance(state, numpy.generic):
        return {"v": state.item()}
    raise TypeError(f"cannot checkpoint a value of type {type(state).__name__}")


def _array(tree: Any, data: Blob) -> Any:
    numpy = _np()
    if numpy is None:  # pragma: no cover
        raise RuntimeError("numpy is needed to restore this checkpoint")
    array = numpy.frombuffer(data, dtype=numpy.dtype(tree["dtype"])).reshape(tree["shape"])
    return array if array.flags.writeable else array.copy()  # a view into the loaded data


def unflatten(tree: Any, blobs: list[Blob]) -> Any:
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
        return bytes(blobs[tree["b"]])
    if "np" in tree:
        return _array(tree, blobs[tree["np"]])
    if "tensor" in tree:
        import torch

        return torch.from_numpy(_array(tree, blobs[tree["tensor"]]))
    if "torch" in tree:
        import torch

        return torch.load(io.BytesIO(bytes(blobs[tree["torch"]])), map_location="cpu",
                          weights_only=True)
    raise ValueError(f"unknown checkpoint tree node {sorted(tree)}")

"""Turn a state dict (nested dicts/lists of JSON values, bytes, NumPy arrays, torch tensors)
into a JSON tree plus raw blobs, and back. NumPy and torch are optional.

Tree nodes: ``{"d": {key: node}}`` (string keys), ``{"di": [[int key, node], ...]}``,
``{"l": [node, ...], "t": is_tuple}``, ``{"v": JSON value}``, ``{"b": blob}`` (bytes),
``{"np": blob, "dtype": NumPy dtype.str, "shape": [...]}``, ``{"pt": blob, "dtype": torch dtype
name, "shape": [...], "device": "cuda:0"}``; checkpoints of format 3 also hold
``{"tensor": blob, "dtype": NumPy dtype.str, ...}`` and ``{"torch": blob}`` (torch.save bytes,
for dtypes NumPy lacks). Blobs are contiguous C-order bytes in native byte order.
"""

from __future__ import annotations

import ctypes
import io
from collections.abc import Callable
from typing import Any

from hafo.checkpoint.tensors import check_keys, imported_torch, optional_numpy

Blob = bytes | memoryview

BLOB_KINDS = ("b", "np", "pt", "tensor", "torch")


def tensor_bytes(tensor: Any) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory, any dtype (bfloat16 too); the
    view keeps the tensor alive."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("tensor_bytes needs a contiguous CPU tensor")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray(0))
    holder = (ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())
    holder._hafo_owner = tensor  # the memory's owner lives as long as the view
    return memoryview(holder).cast("B")


def array_bytes(array: Any) -> memoryview:
    """A byte view of a C-contiguous NumPy array's memory (writable if the array is)."""
    numpy = optional_numpy()
    if not array.flags.c_contiguous:
        raise ValueError("array_bytes needs a C-contiguous array")
    return memoryview(array.reshape(-1).view(numpy.uint8))


def torch_dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> Any:
    """The torch dtype named ``name`` (ValueError if there is none)."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def host_tensor(tensor: Any) -> Any:
    """The tensor's values as a contiguous CPU tensor with plain bits (conjugate and negative
    views resolved); the tensor itself when it already is one."""
    torch = imported_torch()
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise TypeError(f"cannot checkpoint a {tensor.layout} tensor"
                        f"{' (quantized)' if tensor.is_quantized else ''}")
    tensor = tensor.detach().resolve_conj().resolve_neg()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    return tensor.contiguous()


def flatten(state: Any, blobs: list[Any], sources: list[Any] | None = None) -> Any:
    """Encode ``state`` as a JSON tree; bytes, arrays and tensors go to ``blobs`` as raw
    buffers (zero-copy views of contiguous host memory where possible). ``sources``, if given,
    gets the leaf each blob came from."""
    def add(blob: Any, leaf: Any) -> int:
        blobs.append(blob)
        if sources is not None:
            sources.append(leaf)
        return len(blobs) - 1

    if isinstance(state, dict):
        check_keys(state)
        if all(isinstance(k, str) for k in state):
            return {"d": {k: flatten(v, blobs, sources) for k, v in state.items()}}
        # e.g. torch optimizers' state_dict()["state"], keyed by parameter index
        return {"di": [[k, flatten(v, blobs, sources)] for k, v in state.items()]}
    if isinstance(state, list | tuple):
        return {"l": [flatten(v, blobs, sources) for v in state],
                "t": isinstance(state, tuple)}
    if state is None or isinstance(state, bool | int | float | str):
        return {"v": state}
    if isinstance(state, bytes | bytearray | memoryview):
        return {"b": add(bytes(state) if not isinstance(state, bytes) else state, state)}
    torch = imported_torch()
    if torch is not None and isinstance(state, torch.Tensor):
        tensor = host_tensor(state)
        return {"pt": add(tensor_bytes(tensor), state), "dtype": torch_dtype_name(tensor.dtype),
                "shape": list(tensor.shape), "device": str(state.device)}
    numpy = optional_numpy()
    if numpy is not None and isinstance(state, numpy.ndarray):
        if state.dtype.hasobject:
            raise TypeError("cannot checkpoint a NumPy array of Python objects")
        array = state if state.flags.c_contiguous else numpy.ascontiguousarray(state)
        return {"np": add(array_bytes(array), state), "dtype": array.dtype.str,
                "shape": list(state.shape)}
    if numpy is not None and isinstance(state, numpy.generic):
        return {"v": state.item()}
    raise TypeError(f"cannot checkpoint a value of type {type(state).__name__}")


def rebuild(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """The state a tree describes; ``leaf(node)`` makes the value of each blob node."""
    if "d" in tree:
        return {k: rebuild(v, leaf) for k, v in tree["d"].items()}
    if "di" in tree:
        return {int(k): rebuild(v, leaf) for k, v in tree["di"]}
    if "l" in tree:
        items = [rebuild(v, leaf) for v in tree["l"]]
        return tuple(items) if tree.get("t") else items
    if "v" in tree:
        return tree["v"]
    if any(kind in tree for kind in BLOB_KINDS):
        return leaf(tree)
    raise ValueError(f"unknown checkpoint tree node {sorted(tree)}")


def blob_index(node: Any) -> int:
    """The blob a blob node refers to."""
    return int(next(node[kind] for kind in BLOB_KINDS if kind in node))


def node_nbytes(node: Any) -> int | None:
    """The byte size a tensor or array node's dtype and shape imply (None: not such a node)."""
    if "np" in node or "tensor" in node:
        numpy = optional_numpy()
        if numpy is None:  # pragma: no cover
            raise RuntimeError("numpy is needed to restore this checkpoint")
        count = 1
        for dim in node["shape"]:
            count *= int(dim)
        return count * int(numpy.dtype(node["dtype"]).itemsize)
    if "pt" in node:
        count = 1
        for dim in node["shape"]:
            count *= int(dim)
        return count * int(torch_dtype(node["dtype"]).itemsize)
    return None


def _array(node: Any, data: Any) -> Any:
    numpy = optional_numpy()
    if numpy is None:  # pragma: no cover
        raise RuntimeError("numpy is needed to restore this checkpoint")
    array = numpy.frombuffer(data, dtype=numpy.dtype(node["dtype"])).reshape(node["shape"])
    return array if array.flags.writeable else array.copy()  # a view into the loaded data


def _tensor(node: Any, data: Any) -> Any:
    import torch

    dtype = torch_dtype(node["dtype"])
    shape = [int(dim) for dim in node["shape"]]
    if memoryview(data).nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(shape)


def decode(node: Any, data: Any) -> Any:
    """The value of one blob node, from its blob's bytes (arrays and tensors are views of
    ``data`` where it is writable)."""
    if "b" in node:
        return bytes(data)
    if "np" in node:
        return _array(node, data)
    if "pt" in node:
        return _tensor(node, data)
    if "tensor" in node:
        import torch

        return torch.from_numpy(_array(node, data))
    import torch

    return torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)


def unflatten(tree: Any, blobs: list[Any]) -> Any:
    """Inverse of ``flatten`` (tensors come back on the CPU)."""
    return rebuild(tree, lambda node: decode(node, blobs[blob_index(node)]))


def stage(state: Any) -> Any:
    """A private host copy of ``state``, taken now (the training loop may then go on changing
    its tensors): CUDA tensors are copied into pinned host memory, CPU tensors and arrays
    into new memory, the rest is shared or immutable. Refuses what cannot be checkpointed, at
    once. (``Checkpointer.save_async`` reuses its copies' memory from one save to the next.)"""
    from hafo.checkpoint.staging import Stager

    staged = Stager().stage(state, copy_host=True)
    staged.wait()
    return staged.state

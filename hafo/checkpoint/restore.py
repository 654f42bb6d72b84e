"""Where the blobs of a checkpoint are read to: new memory for ``load_latest`` (each tensor
and array allocated at its size and read into directly), or the memory of the state's own
tensors and arrays for ``Checkpointer.load_into`` (checked against the checkpoint's layout
first, so a mismatch changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hafo.checkpoint.codec import (
    array_bytes,
    blob_index,
    decode,
    node_nbytes,
    rebuild,
    tensor_bytes,
    torch_dtype,
    torch_dtype_name,
)
from hafo.checkpoint.errors import CheckpointMismatch, CorruptCheckpoint
from hafo.checkpoint.tensors import imported_torch, optional_numpy

Plan = tuple[list[memoryview], Callable[[], Any]]
"""Where to read each blob, and what to call once they all verified (it returns the state)."""


def _check_size(node: Any, size: int) -> None:
    expected = node_nbytes(node)
    if expected is not None and expected != size:
        raise CorruptCheckpoint(f"blob {blob_index(node)} has {size} bytes, its dtype and "
                                f"shape need {expected}")


def _allocate(node: Any, size: int) -> tuple[memoryview, Callable[[], Any]]:
    """New memory for one blob node, and how to make its value once read."""
    _check_size(node, size)
    if "pt" in node:
        import torch

        tensor = torch.empty([int(d) for d in node["shape"]], dtype=torch_dtype(node["dtype"]))
        return tensor_bytes(tensor), lambda: tensor
    numpy = optional_numpy()
    if ("np" in node or "tensor" in node) and numpy is not None:
        array = numpy.empty([int(d) for d in node["shape"]], dtype=numpy.dtype(node["dtype"]))
        if "np" in node:
            return array_bytes(array), lambda: array
        import torch

        return array_bytes(array), lambda: torch.from_numpy(array)
    data = memoryview(bytearray(size))  # bytes, and format 3's torch.save blobs
    return data, lambda: decode(node, data)


def fresh(tree: Any, sizes: list[int]) -> Plan:
    """Read every blob into new memory of its own; the plan's function builds the state."""
    dests: list[memoryview | None] = [None] * len(sizes)
    makers: dict[int, Callable[[], Any]] = {}

    def visit(node: Any) -> None:
        index = blob_index(node)
        if not 0 <= index < len(sizes) or index in makers:
            raise CorruptCheckpoint(f"tree refers to blob {index} badly")
        dests[index], makers[index] = _allocate(node, sizes[index])

    rebuild(tree, visit)
    if any(dest is None for dest in dests):
        raise CorruptCheckpoint("a blob no tree node refers to")
    return [d for d in dests if d is not None], lambda: rebuild(
        tree, lambda node: makers[blob_index(node)]())


def _where(path: tuple[Any, ...]) -> str:
    return "state" + "".join(f"[{key!r}]" for key in path)


def _kind(value: Any) -> str:
    torch, numpy = imported_torch(), optional_numpy()
    if torch is not None and isinstance(value, torch.Tensor):
        return "a tensor"
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "a NumPy array"
    if isinstance(value, dict):
        return "a dict"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _structured(value: Any) -> bool:
    """A container or tensor: not a leaf that a checkpoint's plain value may replace."""
    return isinstance(value, dict | list | tuple) or _kind(value) in ("a tensor",
                                                                      "a NumPy array")


def _node_kind(node: Any) -> str:
    if "d" in node or "di" in node:
        return "a dict"
    if "l" in node:
        return f"a {'tuple' if node.get('t') else 'list'} of {len(node['l'])}"
    if "np" in node:
        return "a NumPy array"
    if any(kind in node for kind in ("pt", "tensor", "torch")):
        return "a tensor"
    if "b" in node:
        return "bytes"
    return f"a {type(node.get('v')).__name__}"


class _Into:
    """The plan of restoring one checkpoint into an existing state."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.dests: list[memoryview | None] = [None] * len(sizes)
        self.after: list[Callable[[], None]] = []  # copies and replacements, once verified

    def mismatch(self, path: tuple[Any, ...], what: str) -> CheckpointMismatch:
        return CheckpointMismatch(f"{_where(path)}: {what}")

    def dest(self, node: Any, path: tuple[Any, ...], view: memoryview) -> None:
        index = blob_index(node)
        if not 0 <= index < len(self.sizes) or self.dests[index] is not None:
            raise CorruptCheckpoint(f"tree refers to blob {index} badly")
        if view.nbytes != self.sizes[index]:
            raise CorruptCheckpoint(f"{_where(path)}: blob {index} has {self.sizes[index]} "
                                    f"bytes, {view.nbytes} expected")
        self.dests[index] = view

    def visit(self, node: Any, value: Any, path: tuple[Any, ...]) -> Any:
        """Plan ``value`` (at ``path``) from ``node``; returns the value to put there."""
        if "d" in node or "di" in node:
            if not isinstance(value, dict):
                raise self.mismatch(path, f"a dict in the checkpoint, {_kind(value)} here")
            items = dict(node["d"]) if "d" in node else {int(k): v for k, v in node["di"]}
            for key in items:
                if key not in value:
                    raise self.mismatch((*path, key), "in the checkpoint, not in the state")
            for key in value:
                if key not in items:
                    raise self.mismatch((*path, key), "in the state, not in the checkpoint")
            for key, child in items.items():
                new = self.visit(child, value[key], (*path, key))
                if isinstance(new, _Later):
                    self.after.append(_setter(value, key, new))
            return value
        if "l" in node:
            if not isinstance(value, list | tuple) or len(value) != len(node["l"]):
                raise self.mismatch(path, f"{_node_kind(node)} in the checkpoint, "
                                          f"{_kind(value)} here")
            news = [self.visit(child, item, (*path, i))
                    for i, (child, item) in enumerate(zip(node["l"], value, strict=True))]
            if isinstance(value, tuple):  # immutable: a new tuple if an item is replaced
                if not any(isinstance(new, _Later) for new in news):
                    return value
                return _Later(lambda: tuple(_made(new) for new in news))
            for i, new in enumerate(news):
                if isinstance(new, _Later):
                    self.after.append(_setter(value, i, new))
            return value
        if "v" in node:
            if _structured(value):
                raise self.mismatch(path, f"{_node_kind(node)} in the checkpoint, "
                                          f"{_kind(value)} here")
            return _Later(lambda: node["v"])
        if "b" in node:
            if _structured(value):
                raise self.mismatch(path, f"bytes in the checkpoint, {_kind(value)} here")
            data = memoryview(bytearray(self.sizes[blob_index(node)]))
            self.dest(node, path, data)
            return _Later(lambda: bytes(data))
        if "np" in node:
            return self.array(node, value, path)
        if any(kind in node for kind in ("pt", "tensor", "torch")):
            return self.tensor(node, value, path)
        raise CorruptCheckpoint(f"unknown checkpoint tree node {sorted(node)}")

    def array(self, node: Any, value: Any, path: tuple[Any, ...]) -> Any:
        numpy = optional_numpy()
        if numpy is None or not isinstance(value, numpy.ndarray):
            raise self.mismatch(path, f"a NumPy array in the checkpoint, {_kind(value)} here")
        dtype, shape = numpy.dtype(node["dtype"]), tuple(int(d) for d in node["shape"])
        if value.dtype != dtype or value.shape != shape:
            raise self.mismatch(path, f"{dtype} {list(shape)} in the checkpoint, "
                                      f"{value.dtype} {list(value.shape)} here")
        if not value.flags.writeable:
            raise self.mismatch(path, "the array here is read-only")
        _check_size(node, self.sizes[blob_index(node)])
        if value.flags.c_contiguous:
            self.dest(node, path, array_bytes(value))
        else:  # read into new memory, then copy into the strided array
            temp = numpy.empty(shape, dtype=dtype)
            self.dest(node, path, array_bytes(temp))
            self.after.append(lambda: numpy.copyto(value, temp))
        return value

    def tensor(self, node: Any, value: Any, path: tuple[Any, ...]) -> Any:
        torch = imported_torch()
        if torch is None or not isinstance(value, torch.Tensor):
            raise self.mismatch(path, f"a tensor in the checkpoint, {_kind(value)} here")
        size = self.sizes[blob_index(node)]
        if "torch" in node:  # format 3: torch.save bytes, checked once loaded
            data = memoryview(bytearray(size))
            self.dest(node, path, data)

            def load() -> None:
                loaded = decode(node, data)
                self.check_tensor(path, loaded.dtype, tuple(loaded.shape), value)
                with torch.no_grad():
                    value.copy_(loaded)

            self.after.append(load)
            return value
        if "pt" in node:
            dtype = torch_dtype(node["dtype"])
        else:  # format 3: a NumPy dtype
            numpy = optional_numpy()
            dtype = torch.from_numpy(numpy.empty(0, dtype=numpy.dtype(node["dtype"]))).dtype
        self.check_tensor(path, dtype, tuple(int(d) for d in node["shape"]), value)
        _check_size(node, size)
        target = value.detach()
        if target.device.type == "cpu" and target.is_contiguous() and not (
                target.is_conj() or target.is_neg()):
            self.dest(node, path, tensor_bytes(target))
        else:  # CUDA or strided: read into host memory, then copy
            temp = torch.empty(target.shape, dtype=dtype)
            self.dest(node, path, tensor_bytes(temp))

            def copy() -> None:
                with torch.no_grad():
                    target.copy_(temp)

            self.after.append(copy)
        return value

    def check_tensor(self, path: tuple[Any, ...], dtype: Any, shape: tuple[int, ...],
                     value: Any) -> None:
        if value.dtype != dtype or tuple(value.shape) != shape:
            raise self.mismatch(path, f"{torch_dtype_name(dtype)} {list(shape)} in the "
                                      f"checkpoint, {torch_dtype_name(value.dtype)} "
                                      f"{list(value.shape)} here")


class _Later:
    """A value to put in place once the blobs are read and verified."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _setter(container: Any, key: Any, later: _Later) -> Callable[[], None]:
    def put() -> None:
        container[key] = later.make()

    return put


def _made(value: Any) -> Any:
    return value.make() if isinstance(value, _Later) else value


def into(tree: Any, sizes: list[int], state: dict[str, Any]) -> Plan:
    """Plan restoring a checkpoint into ``state``'s own tensors and arrays: CheckpointMismatch
    (naming the key) if its keys, leaf types, dtypes or shapes differ, before anything is
    read. The plan's function copies what could not be read in place (CUDA or strided
    tensors), replaces the other leaves in their dicts and lists, and returns ``state``."""
    plan = _Into(sizes)
    if not isinstance(state, dict):
        raise CheckpointMismatch(f"load_into needs the state dict, got {_kind(state)}")
    plan.visit(tree, state, ())
    if any(dest is None for dest in plan.dests):
        raise CorruptCheckpoint("a blob no tree node refers to")

    def finish() -> Any:
        for step in plan.after:
            step()
        return state

    return [d for d in plan.dests if d is not None], finish

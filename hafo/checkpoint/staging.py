"""The private host copy of a state that ``save_async`` takes before it returns, into
staging buffers reused from one save to the next: a leaf at the same place with the same
type, dtype and shape as last time is copied into the same buffer (no allocation, no page
faults), so the training loop waits for one memcpy per tensor, no more.

CPU tensors and arrays are copied with one ``copy_``/``copyto`` each; CUDA tensors go into
pinned host buffers by ``CHUNK``-sized asynchronous device-to-host copies on the tensor's
current stream, each followed by a CUDA event, so the writer can start on a chunk as soon as
it has arrived (``Staged.ready``) while later chunks are still on their way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hafo.checkpoint.blobio import CHUNK, Ready
from hafo.checkpoint.codec import _np, _torch, check_keys

Path = tuple[Any, ...]


@dataclass
class Staged:
    """A staged state: ``state`` with staging buffers in place of its tensors and arrays."""

    state: Any = None
    events: dict[int, list[Any]] = field(default_factory=dict)  # id(buffer) -> CUDA events
    buffers: list[Any] = field(default_factory=list)  # keeps the ids above valid

    def ready(self, sources: list[Any]) -> Ready | None:
        """The writer's ``ready(blob, chunk)`` for blobs flattened from ``state`` (``sources``
        from ``codec.flatten``): waits for that chunk's device-to-host copy. None when there
        is nothing to wait for."""
        if not self.events:
            return None
        events = self.events

        def ready(blob: int, chunk: int) -> None:
            waits = events.get(id(sources[blob]))
            if waits:
                waits[min(chunk, len(waits) - 1)].synchronize()

        return ready

    def wait(self) -> None:
        """Block until every device-to-host copy has landed."""
        for waits in self.events.values():
            waits[-1].synchronize()


class Stager:
    """Stages states into buffers kept for the next state of the same layout."""

    def __init__(self) -> None:
        self._pool: dict[Path, Any] = {}

    @property
    def buffers(self) -> dict[Path, Any]:
        """The staging buffers kept for the next save, by their place in the state."""
        return dict(self._pool)

    def clear(self) -> None:
        """Drop the staging buffers (their memory is freed when nothing else uses it)."""
        self._pool = {}

    def stage(self, state: Any, copy_host: bool = True) -> Staged:
        """Copy ``state``'s tensors and arrays into staging buffers; with ``copy_host=False``
        only CUDA tensors are copied (to pinned host memory) and host ones are shared. CUDA
        copies may still be in flight on return: see ``Staged.wait`` and ``Staged.ready``.
        TypeError, at once, for what cannot be checkpointed."""
        previous = self._pool
        # a full staging keeps only the buffers it used (a changed layout frees the rest); a
        # device-only one keeps the host buffers of save_async for its next save
        self._pool = {} if copy_host else dict(previous)
        staged = Staged()
        staged.state = self._stage(state, (), previous, staged, copy_host)
        return staged

    def _buffer(self, path: Path, previous: dict[Path, Any], fits: Callable[[Any], bool],
                make: Callable[[], Any]) -> Any:
        buffer = previous.get(path)
        if buffer is None or not fits(buffer):
            buffer = make()
        self._pool[path] = buffer
        return buffer

    def _stage(self, value: Any, path: Path, previous: dict[Path, Any], staged: Staged,
               copy_host: bool) -> Any:
        if isinstance(value, dict):
            check_keys(value)
            return {k: self._stage(v, (*path, k), previous, staged, copy_host)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            items = [self._stage(v, (*path, i), previous, staged, copy_host)
                     for i, v in enumerate(value)]
            return tuple(items) if isinstance(value, tuple) else items
        if value is None or isinstance(value, bool | int | float | str | bytes):
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        torch = _torch()
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(value, path, previous, staged, copy_host)
        numpy = _np()
        if numpy is not None and isinstance(value, numpy.ndarray):
            if value.dtype.hasobject:
                raise TypeError("cannot checkpoint a NumPy array of Python objects")
            if not copy_host:
                return value
            array = self._buffer(
                path, previous,
                lambda b: isinstance(b, numpy.ndarray) and b.shape == value.shape
                and b.dtype == value.dtype,
                lambda: numpy.empty(value.shape, dtype=value.dtype))
            numpy.copyto(array, value)
            return array
        if numpy is not None and isinstance(value, numpy.generic):
            return value.item()
        raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")

    def _tensor(self, value: Any, path: Path, previous: dict[Path, Any], staged: Staged,
                copy_host: bool) -> Any:
        torch = _torch()
        if value.layout != torch.strided or value.is_quantized:
            raise TypeError(f"cannot checkpoint a {value.layout} tensor"
                            f"{' (quantized)' if value.is_quantized else ''}")
        tensor = value.detach()
        cuda = tensor.is_cuda
        if not cuda and not copy_host:
            return value
        buffer = self._buffer(
            path, previous,
            lambda b: isinstance(b, torch.Tensor) and b.shape == tensor.shape
            and b.dtype == tensor.dtype and b.is_pinned() == cuda,
            lambda: torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=cuda))
        if not cuda:
            buffer.copy_(tensor)
            return buffer
        source = tensor.contiguous().reshape(-1)
        target = buffer.reshape(-1)  # a view: the buffer is contiguous
        step = max(1, CHUNK // tensor.element_size())
        events = []
        with torch.cuda.device(tensor.device):
            stream = torch.cuda.current_stream(tensor.device)
            for start in range(0, source.numel(), step):
                target[start:start + step].copy_(source[start:start + step], non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
                events.append(event)
        if events:
            staged.events[id(buffer)] = events
            staged.buffers.append(buffer)
        return buffer

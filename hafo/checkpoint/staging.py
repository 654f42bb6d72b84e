"""The private host copy of a state that ``save_async`` takes before it returns, into
staging buffers reused from one save to the next: a leaf at the same place with the same
type, dtype and shape as last time is copied into the same buffer (no allocation, no page
faults), so the training loop waits for one memcpy per tensor, no more.

CPU tensors and arrays are copied with one ``copy_``/``copyto`` each; CUDA tensors go into
pinned host buffers by ``CHUNK``-sized asynchronous device-to-host copies on the tensor's
current stream, each followed by a CUDA event, so the writer can start on a chunk as soon as
it has arrived (``Staged.ready``) while later chunks are still on their way.

A deferred staging (``defer=True``, ``save_async(snapshot="background")``) only decides the
buffers; ``Staged.start`` then copies host tensors and arrays chunk by chunk on a thread of
its own, each chunk followed by a ``HostEvent``, so the training loop goes on at once. The
state must not change until ``Staged.wait`` returns. The SDK's writers start only once the
host copies are done (``Staged.wait_host``): the copy then has the memory bandwidth to itself
and ends sooner, which is what the training loop waits for; ``Staged.ready`` would let them
write each chunk as soon as it is copied.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hafo.checkpoint.blobio import CHUNK, Ready
from hafo.checkpoint.tensors import check_keys, imported_torch, optional_numpy

Path = tuple[Any, ...]


class SnapshotFailed(RuntimeError):
    """A deferred host copy failed (e.g. a tensor changed shape before it was copied)."""


class HostEvent:
    """Set once a chunk of a host staging buffer holds the state's bytes; waited on like a
    CUDA event (``synchronize``)."""

    def __init__(self, staged: Staged) -> None:
        self._event = threading.Event()
        self._staged = staged

    def set(self) -> None:
        """The chunk is copied (or the copy failed: ``synchronize`` then raises)."""
        self._event.set()

    def query(self) -> bool:
        """True once the chunk is copied (or the copy failed)."""
        return self._event.is_set()

    def synchronize(self) -> None:
        """Block until the chunk is copied; SnapshotFailed if the copy failed."""
        self._event.wait()
        if self._staged.error is not None:
            raise SnapshotFailed(f"the state could not be copied: {self._staged.error}")


def guard_step(optimizer: Any, wait: Callable[[], None]) -> Any:
    """Register ``wait`` as a step pre-hook of ``optimizer`` (torch >= 2.0): every
    ``optimizer.step()`` first waits; returns the hook's handle. TypeError for an optimizer
    without step hooks."""
    register = getattr(optimizer, "register_step_pre_hook", None)
    if register is None:
        raise TypeError(f"{type(optimizer).__name__} has no register_step_pre_hook "
                        f"(torch >= 2.0 optimizers do): call wait_snapshot() yourself")
    return register(lambda *_args: wait())


_Copy = tuple[Callable[[int, int], None], int, int, list[HostEvent]]  # copy(a, b), n, step


@dataclass
class Staged:
    """A staged state: ``state`` with staging buffers in place of its tensors and arrays."""

    state: Any = None
    events: dict[int, list[Any]] = field(default_factory=dict)  # id(buffer) -> CUDA/host events
    buffers: list[Any] = field(default_factory=list)  # keeps the ids above valid
    defer: bool = False  # host copies are planned into ``copies``, run by ``start``
    copies: list[_Copy] = field(default_factory=list)  # deferred host copies, in state order
    error: BaseException | None = None

    def start(self) -> None:
        """Run the deferred host copies on a thread of their own (no-op when there are
        none); returns at once."""
        if not self.copies:
            return
        threading.Thread(target=self._copy_all, name="hafo-ckpt-snapshot", daemon=True).start()

    def _copy_all(self) -> None:
        pending = [event for *_rest, events in self.copies for event in events]
        try:
            for copy, count, step, events in self.copies:
                for index, start in enumerate(range(0, max(count, 1), step)):
                    copy(start, min(count, start + step))
                    events[index].set()
        except BaseException as exc:  # surfaced by synchronize() in the writer and wait()
            self.error = exc
        finally:
            for event in pending:
                event.set()

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
        """Block until every device-to-host and deferred host copy has landed;
        SnapshotFailed if a deferred one failed."""
        for waits in self.events.values():
            waits[-1].synchronize()

    def wait_copied(self) -> None:
        """``wait`` for the training loop (``wait_snapshot``): never raises, since a failed
        copy is the write's error, raised by the checkpointer's next call."""
        with contextlib.suppress(SnapshotFailed):
            self.wait()

    def wait_host(self) -> None:
        """Block until the deferred host copies are done (the copier runs them in order, so
        the last one's last chunk is the end); SnapshotFailed if one failed."""
        if self.copies:
            self.copies[-1][3][-1].synchronize()

    @property
    def done(self) -> bool:
        """True once nothing is left to copy (a failed copy counts as done)."""
        return all(bool(waits[-1].query()) for waits in self.events.values())


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

    def stage(self, state: Any, copy_host: bool = True, defer: bool = False) -> Staged:
        """Copy ``state``'s tensors and arrays into staging buffers; with ``copy_host=False``
        only CUDA tensors are copied (to pinned host memory) and host ones are shared. CUDA
        copies may still be in flight on return: see ``Staged.wait`` and ``Staged.ready``.
        With ``defer=True`` host copies are only planned: ``Staged.start`` runs them.
        TypeError, at once, for what cannot be checkpointed."""
        previous = self._pool
        # a full staging keeps only the buffers it used (a changed layout frees the rest); a
        # device-only one keeps the host buffers of save_async for its next save
        self._pool = {} if copy_host else dict(previous)
        staged = Staged(defer=defer)
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
        torch = imported_torch()
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(value, path, previous, staged, copy_host)
        numpy = optional_numpy()
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
            if not staged.defer:
                numpy.copyto(array, value)
                return array
            if value.flags.c_contiguous:
                flat_in, flat_out = value.reshape(-1), array.reshape(-1)

                def copy(a: int, b: int) -> None:
                    numpy.copyto(flat_out[a:b], flat_in[a:b])

                self._plan(staged, array, copy, value.size, max(1, CHUNK // value.itemsize))
            else:
                self._plan(staged, array, lambda _a, _b: numpy.copyto(array, value), 1, 1)
            return array
        if numpy is not None and isinstance(value, numpy.generic):
            return value.item()
        raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")

    @staticmethod
    def _plan(staged: Staged, buffer: Any, copy: Callable[[int, int], None], count: int,
              step: int) -> None:
        """A deferred copy of ``count`` items, ``step`` at a time, one event per chunk (the
        writer's chunks: ``step`` items are ``CHUNK`` bytes)."""
        events = [HostEvent(staged) for _ in range(max(1, -(-count // step)))]
        staged.copies.append((copy, count, step, events))
        staged.events[id(buffer)] = events
        staged.buffers.append(buffer)

    def _tensor(self, value: Any, path: Path, previous: dict[Path, Any], staged: Staged,
                copy_host: bool) -> Any:
        torch = imported_torch()
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
            if not staged.defer:
                buffer.copy_(tensor)
            elif tensor.is_contiguous():
                flat_in, flat_out = tensor.reshape(-1), buffer.reshape(-1)

                def copy(a: int, b: int) -> None:
                    flat_out[a:b].copy_(flat_in[a:b])

                self._plan(staged, buffer, copy, tensor.numel(),
                           max(1, CHUNK // tensor.element_size()))
            else:
                self._plan(staged, buffer, lambda _a, _b: buffer.copy_(tensor), 1, 1)
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
